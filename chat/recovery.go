package chat

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// Chat recovery budgets (the reference's chatRecovery). A turn the process
// died in is recovered when its instance starts again; every such recovery
// is an attempt of the turn's recovery incident, which is stored with the
// turn. The budgets bound an incident; when one is spent the turn is
// sealed: its partial message is kept, the terminal message is appended to
// it, OnRecoveryExhausted is told and the turn ends with outcome error.

// Defaults of RecoveryBudgets, the reference's.
const (
	// DefaultRecoveryMaxAttempts is the attempt budget of an incident. An
	// attempt that finds progress since the previous one starts the count
	// again.
	DefaultRecoveryMaxAttempts = 10
	// DefaultRecoveryNoProgressTimeout is how long an incident may go
	// without progress. Every attempt that finds progress starts it again.
	DefaultRecoveryNoProgressTimeout = 5 * time.Minute
	// DefaultMaxRecoveryWork is the work budget of an incident: content and
	// tool units produced since its first interruption.
	DefaultMaxRecoveryWork = 1000
	// DefaultRecoveryTerminalMessage is appended to a sealed turn's
	// message.
	DefaultRecoveryTerminalMessage = "The assistant was interrupted and could not recover. Please try again."
)

// Work units (the reference's shouldCreditStreamProgress): a milestone
// chunk (a text or reasoning part starts, a tool call's input or result is
// settled) is one unit; streaming deltas are one unit at most once per
// deltaCreditInterval of a turn's run (the first delta after a restart
// always counts); a forwarded agent-tool child chunk credits its parent's
// turn at most once per forwardCreditInterval (CreditProgress). Chunks that
// recovery itself writes (closing what a crash cut, the terminal message)
// are not work.
const (
	deltaCreditInterval   = 5 * time.Second
	forwardCreditInterval = 5 * time.Second
)

// RecoveryBudgets bound the recovery of a turn (the reference's
// chatRecovery options). A zero field means the default, a negative one no
// limit.
type RecoveryBudgets struct {
	// MaxAttempts is the most recovery attempts without progress
	// (maxAttempts); zero means DefaultRecoveryMaxAttempts.
	MaxAttempts int
	// NoProgressTimeout is the longest an incident may go without progress
	// (noProgressTimeoutMs), measured on the runtime's clock between
	// attempts; zero means DefaultRecoveryNoProgressTimeout.
	NoProgressTimeout time.Duration
	// MaxRecoveryWork is the most work units produced since the incident
	// began (maxRecoveryWork); zero means DefaultMaxRecoveryWork.
	MaxRecoveryWork int
	// TerminalMessage is appended to a sealed turn's message and is its
	// error text (terminalMessage); empty means
	// DefaultRecoveryTerminalMessage.
	TerminalMessage string
}

// merge returns b with the non-zero fields of o.
func (b RecoveryBudgets) merge(o RecoveryBudgets) RecoveryBudgets {
	if o.MaxAttempts != 0 {
		b.MaxAttempts = o.MaxAttempts
	}
	if o.NoProgressTimeout != 0 {
		b.NoProgressTimeout = o.NoProgressTimeout
	}
	if o.MaxRecoveryWork != 0 {
		b.MaxRecoveryWork = o.MaxRecoveryWork
	}
	if o.TerminalMessage != "" {
		b.TerminalMessage = o.TerminalMessage
	}
	return b
}

// RecoveryBudgeter gives a class its recovery budgets; its non-zero fields
// override Config.Recovery.
type RecoveryBudgeter interface {
	RecoveryBudgets() RecoveryBudgets
}

// RecoveryKind says whether a recovery runs an unanswered turn again
// (nothing of its answer was stored) or continues a partial answer.
type RecoveryKind string

// Recovery kinds.
const (
	RecoveryKindRetry    RecoveryKind = "retry"
	RecoveryKindContinue RecoveryKind = "continue"
)

// RecoveryProgress is what ShouldKeepRecovering is asked with (the
// reference's ChatRecoveryProgressContext).
type RecoveryProgress struct {
	// IncidentID names the incident: the turn id and its last user message.
	IncidentID string
	// RequestID is the turn's request (stream) id.
	RequestID string
	// Attempt is the attempt number, from 1; an attempt that found progress
	// is 1 again.
	Attempt int
	// MaxAttempts is the attempt budget (negative: none).
	MaxAttempts int
	// Kind is retry or continue.
	Kind RecoveryKind
	// Work is the work units produced since the incident began.
	Work int
	// Age is the time since the incident's first interruption.
	Age time.Duration
}

// RecoveryGuard is asked, on every recovery attempt of an incident from the
// second on and only while no budget is spent, whether to keep recovering
// (the reference's shouldKeepRecovering). Returning false seals the turn
// with ExhaustRecoveryAborted; a hook that panics counts as true.
type RecoveryGuard interface {
	ShouldKeepRecovering(ctx context.Context, p RecoveryProgress) bool
}

// ExhaustReason says why recovery gave up on a turn.
type ExhaustReason string

// Exhaust reasons, the reference's.
const (
	ExhaustMaxAttempts     ExhaustReason = "max_attempts_exceeded"
	ExhaustNoProgress      ExhaustReason = "no_progress_timeout"
	ExhaustWorkBudget      ExhaustReason = "work_budget_exceeded"
	ExhaustRecoveryAborted ExhaustReason = "recovery_aborted"
)

// RecoveryExhausted describes a sealed turn (the reference's
// ChatRecoveryExhaustedContext).
type RecoveryExhausted struct {
	RecoveryProgress
	// Reason is why recovery gave up.
	Reason ExhaustReason
	// TerminalMessage is the text appended to the turn's message.
	TerminalMessage string
	// Partial is the message the turn had produced (without the terminal
	// message).
	Partial message.Message
}

// RecoveryExhaustedObserver is told when recovery gives up on a turn (the
// reference's onExhausted), before the turn's sealed end is stored: after a
// crash in between, it is told again.
type RecoveryExhaustedObserver interface {
	OnRecoveryExhausted(ctx context.Context, e RecoveryExhausted)
}

// exhaustedMetadata is the provider metadata of a sealed turn's terminal
// text part.
type exhaustedMetadata struct {
	Agentry struct {
		RecoveryExhausted ExhaustReason `json:"recoveryExhausted"`
	} `json:"agentry"`
}

// ExhaustedReasonOf returns the reason of a sealed turn's terminal text
// part, or "" when p is not one.
func ExhaustedReasonOf(p message.Part) ExhaustReason {
	if p.Type != message.PartText || len(p.ProviderMetadata) == 0 {
		return ""
	}
	var m exhaustedMetadata
	if json.Unmarshal(p.ProviderMetadata, &m) != nil {
		return ""
	}
	return m.Agentry.RecoveryExhausted
}

var recoveryMigration = []string{
	`ALTER TABLE chat_streams ADD COLUMN work BIGINT NOT NULL DEFAULT 0`,
	`CREATE TABLE IF NOT EXISTS chat_recovery_incidents (
		instance_id BIGINT NOT NULL,
		stream_id TEXT NOT NULL,
		incident_id TEXT NOT NULL,
		kind TEXT NOT NULL,
		status TEXT NOT NULL,
		reason TEXT,
		attempt BIGINT NOT NULL,
		first_seen_at BIGINT NOT NULL,
		last_attempt_at BIGINT NOT NULL,
		last_progress_at BIGINT NOT NULL,
		progress BIGINT NOT NULL,
		work_baseline BIGINT NOT NULL,
		PRIMARY KEY (instance_id, stream_id),
		FOREIGN KEY (instance_id, stream_id) REFERENCES chat_streams(instance_id, id) ON DELETE CASCADE)`,
}

// Incident statuses.
const (
	incidentAttempting = "attempting"
	incidentExhausted  = "exhausted"
)

// incident is one row of chat_recovery_incidents.
type incident struct {
	ID             string
	Kind           RecoveryKind
	Status         string
	Reason         ExhaustReason
	Attempt        int
	FirstSeenAt    int64 // unix ms, runtime clock
	LastAttemptAt  int64
	LastProgressAt int64
	Progress       int64 // high-water mark of the stream's work meter
	WorkBaseline   int64 // the meter when the incident began
}

func loadIncident(ctx context.Context, tx store.Tx, iid int64, streamID string) (incident, bool, error) {
	var in incident
	var reason sql.NullString
	err := tx.QueryRow(ctx, `SELECT incident_id, kind, status, reason, attempt, first_seen_at, last_attempt_at, last_progress_at,
			progress, work_baseline FROM chat_recovery_incidents WHERE instance_id = ? AND stream_id = ?`, iid, streamID).
		Scan(&in.ID, &in.Kind, &in.Status, &reason, &in.Attempt, &in.FirstSeenAt, &in.LastAttemptAt, &in.LastProgressAt,
			&in.Progress, &in.WorkBaseline)
	if errors.Is(err, sql.ErrNoRows) {
		return in, false, nil
	}
	in.Reason = ExhaustReason(reason.String)
	return in, err == nil, err
}

func saveIncident(ctx context.Context, tx store.Tx, iid int64, streamID string, in incident) error {
	_, err := tx.Exec(ctx, `INSERT INTO chat_recovery_incidents (instance_id, stream_id, incident_id, kind, status, reason, attempt,
			first_seen_at, last_attempt_at, last_progress_at, progress, work_baseline)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (instance_id, stream_id) DO UPDATE SET incident_id = excluded.incident_id, kind = excluded.kind,
			status = excluded.status, reason = excluded.reason, attempt = excluded.attempt,
			last_attempt_at = excluded.last_attempt_at, last_progress_at = excluded.last_progress_at,
			progress = excluded.progress, work_baseline = excluded.work_baseline`,
		iid, streamID, in.ID, string(in.Kind), in.Status, nullStr(string(in.Reason)), in.Attempt,
		in.FirstSeenAt, in.LastAttemptAt, in.LastProgressAt, in.Progress, in.WorkBaseline)
	return err
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// endIncident drops the incident of a turn that ended other than sealed
// (a recovery that completed is never retried); a sealed turn's incident
// stays with its stream, for WaitTurn and inspection. It runs in the
// transaction of the turn's end.
func endIncident(ctx context.Context, tx store.Tx, iid int64, streamID string) error {
	_, err := tx.Exec(ctx, `DELETE FROM chat_recovery_incidents WHERE instance_id = ? AND stream_id = ? AND status <> ?`,
		iid, streamID, incidentExhausted)
	return err
}

// exhaustedReason returns the reason a finished turn was sealed with, or
// "".
func exhaustedReason(ctx context.Context, tx store.Tx, iid int64, streamID string) (ExhaustReason, error) {
	var reason sql.NullString
	err := tx.QueryRow(ctx, `SELECT reason FROM chat_recovery_incidents WHERE instance_id = ? AND stream_id = ? AND status = ?`,
		iid, streamID, incidentExhausted).Scan(&reason)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return ExhaustReason(reason.String), err
}

// budgets returns the instance's resolved recovery budgets.
func (c *core) budgets(ctx context.Context) RecoveryBudgets {
	b := RecoveryBudgets{
		MaxAttempts:       DefaultRecoveryMaxAttempts,
		NoProgressTimeout: DefaultRecoveryNoProgressTimeout,
		MaxRecoveryWork:   DefaultMaxRecoveryWork,
		TerminalMessage:   DefaultRecoveryTerminalMessage,
	}.merge(c.cfg.Recovery)
	if rb, ok := c.self.(RecoveryBudgeter); ok {
		_ = agent.Enter(ctx, c.self, func(context.Context) error {
			b = b.merge(rb.RecoveryBudgets())
			return nil
		})
	}
	return b
}

// credit returns the work units of a chunk the turn streams. c.mu held.
func (t *turn) credit(typ string) int {
	if t.quiet {
		return 0
	}
	switch typ {
	case message.ChunkTextStart, message.ChunkReasoningStart, message.ChunkToolInputAvailable,
		message.ChunkToolOutputAvailable, message.ChunkToolOutputError, message.ChunkToolOutputDenied:
		return 1
	case message.ChunkTextDelta, message.ChunkReasoningDelta, message.ChunkToolInputDelta:
		now := t.c.rt.Clock().Now()
		if !t.deltaCredited.IsZero() && now.Sub(t.deltaCredited) < deltaCreditInterval {
			return 0
		}
		t.deltaCredited = now
		return 1
	}
	return 0
}

// CreditProgress credits one work unit, at most once per five seconds, to
// the chat turn whose code runs in ctx, or else to the turn a is running:
// an agent-tool parent calls it for the chunks it forwards from its child,
// so a parent turn that waits for a progressing child is progressing too
// (the reference's agent-tool stream progress). It writes to storage: do
// not call it while holding a lock a chat callback takes.
func CreditProgress(ctx context.Context, a agent.Agent) error {
	t, ok := ctx.Value(turnKey{}).(*turn)
	if !ok {
		cb, has := agent.LayerOf[*Base](a)
		if !has || cb.c == nil {
			return nil
		}
		cb.c.mu.Lock()
		t = cb.c.active
		cb.c.mu.Unlock()
		if t == nil {
			return nil
		}
	}
	c := t.c
	now := c.rt.Clock().Now()
	c.mu.Lock()
	if t.quiet || (!t.forwardCredited.IsZero() && now.Sub(t.forwardCredited) < forwardCreditInterval) {
		c.mu.Unlock()
		return nil
	}
	t.forwardCredited = now
	c.mu.Unlock()
	err := c.b.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE chat_streams SET work = work + 1 WHERE instance_id = ? AND id = ?`, c.iid, t.row.ID)
		return err
	})
	if err != nil {
		return fmt.Errorf("chat: credit progress: %w", err)
	}
	return nil
}

// incidentState is what beginIncident decides from: the turn's work meter
// and its open incident, if any (read with the turn's stored stream).
type incidentState struct {
	current  int64
	existing incident
	found    bool
}

// loadIncidentState reads the work meter and the open incident of turn id.
func (c *core) loadIncidentState(ctx context.Context, tx store.Tx, id string) (incidentState, error) {
	var st incidentState
	if err := tx.QueryRow(ctx, `SELECT work FROM chat_streams WHERE instance_id = ? AND id = ?`, c.iid, id).Scan(&st.current); err != nil {
		return st, fmt.Errorf("load recovery incident: %w", err)
	}
	var err error
	if st.existing, st.found, err = loadIncident(ctx, tx, c.iid, id); err != nil {
		return st, fmt.Errorf("load recovery incident: %w", err)
	}
	return st, nil
}

// beginIncident opens or continues the recovery incident of an
// interrupted turn and decides, as the reference does, whether a budget is
// spent. It returns the exhaustion that seals the turn, or nil to go on.
func (c *core) beginIncident(ctx context.Context, t *turn, kind RecoveryKind, st incidentState) (*RecoveryExhausted, error) {
	b := c.budgets(ctx)
	now := c.rt.Clock().Now()
	nowMs := now.UnixMilli()
	existing, found, current := st.existing, st.found, st.current
	id := t.row.ID + ":"
	if n := len(t.row.MessageIDs); n > 0 {
		id += t.row.MessageIDs[n-1]
	}
	progress := func(in incident) RecoveryProgress {
		return RecoveryProgress{IncidentID: in.ID, RequestID: t.row.ID, Attempt: in.Attempt, MaxAttempts: b.MaxAttempts,
			Kind: in.Kind, Work: int(in.Progress - in.WorkBaseline), Age: time.Duration(nowMs-in.FirstSeenAt) * time.Millisecond}
	}
	if found && existing.Status == incidentExhausted {
		// Sealed before a crash cut the seal short: seal it again, without
		// asking the budgets again.
		return &RecoveryExhausted{RecoveryProgress: progress(existing), Reason: existing.Reason, TerminalMessage: b.TerminalMessage}, nil
	}

	madeProgress := found && current > existing.Progress
	lastProgressAt := nowMs
	if found && !madeProgress {
		lastProgressAt = existing.LastProgressAt
	}
	noProgress := found && b.NoProgressTimeout >= 0 && nowMs-lastProgressAt > b.NoProgressTimeout.Milliseconds()
	baseline := current
	if found {
		baseline = existing.WorkBaseline
	}
	high := max(existing.Progress, current)
	work := high - baseline
	overWork := found && b.MaxRecoveryWork >= 0 && work > int64(b.MaxRecoveryWork)
	attempt := existing.Attempt + 1
	if madeProgress {
		attempt = 1
	}
	overAttempts := b.MaxAttempts >= 0 && attempt > b.MaxAttempts
	in := incident{ID: id, Kind: kind, Status: incidentAttempting, Attempt: attempt, FirstSeenAt: nowMs, LastAttemptAt: nowMs,
		LastProgressAt: lastProgressAt, Progress: high, WorkBaseline: baseline}
	if found {
		in.FirstSeenAt = existing.FirstSeenAt
	}

	aborted := false
	if g, ok := c.self.(RecoveryGuard); ok && found && !noProgress && !overWork && !overAttempts {
		p := progress(in)
		_ = agent.Enter(ctx, c.self, func(ctx context.Context) error {
			aborted = !c.keepRecovering(ctx, g, p)
			return nil
		})
	}
	switch {
	case overWork:
		in.Reason = ExhaustWorkBudget
	case noProgress:
		in.Reason = ExhaustNoProgress
	case aborted:
		in.Reason = ExhaustRecoveryAborted
	case overAttempts:
		in.Reason = ExhaustMaxAttempts
	}
	if in.Reason != "" {
		in.Status = incidentExhausted
	}
	if err := c.b.DB().Update(ctx, func(tx store.Tx) error { return saveIncident(ctx, tx, c.iid, t.row.ID, in) }); err != nil {
		return nil, fmt.Errorf("save recovery incident: %w", err)
	}
	p := progress(in)
	if !found {
		c.rt.Diag().Publish(t.ctx, diag.ChannelChat, "recovery-detected", c.b.Path().String(), map[string]any{
			"stream": t.row.ID, "incident": in.ID, "kind": string(kind)})
	}
	c.rt.Diag().Publish(t.ctx, diag.ChannelChat, "recovery-attempt", c.b.Path().String(), map[string]any{
		"stream": t.row.ID, "incident": in.ID, "kind": string(kind), "attempt": p.Attempt, "maxAttempts": p.MaxAttempts,
		"work": p.Work, "progressed": madeProgress, "ageMs": p.Age.Milliseconds(), "reason": string(in.Reason)})
	if in.Reason == "" {
		return nil, nil
	}
	return &RecoveryExhausted{RecoveryProgress: p, Reason: in.Reason, TerminalMessage: b.TerminalMessage}, nil
}

// keepRecovering asks the guard; a guard that panics keeps recovering.
func (c *core) keepRecovering(ctx context.Context, g RecoveryGuard, p RecoveryProgress) (keep bool) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Warn("chat: ShouldKeepRecovering panicked; recovery goes on", "stream", p.RequestID, "panic", fmt.Sprint(r))
			keep = true
		}
	}()
	return g.ShouldKeepRecovering(ctx, p)
}

// sealTurn ends a turn whose recovery is exhausted: the partial message
// stays (recovery closed what the crash cut), the terminal message is
// appended to it as a text part marked with the reason, the agent is told,
// and the turn ends with outcome error and the terminal message as its
// error text.
func (c *core) sealTurn(ctx context.Context, t *turn, transcript []message.Message) TurnResult {
	ex := *t.sealed
	if t.builder == nil {
		if _, err := c.startMessage(t, transcript); err != nil {
			return c.finishTurn(ctx, t, OutcomeError, c.turnError(t, err))
		}
	}
	partial := t.builder.Message()
	sealedBefore := false
	for _, p := range partial.Parts {
		if ExhaustedReasonOf(p) != "" {
			sealedBefore = true
		}
	}
	ex.Partial = partial.Clone()
	c.rt.Diag().Publish(t.ctx, diag.ChannelChat, "recovery-exhausted", c.b.Path().String(), map[string]any{
		"stream": t.row.ID, "incident": ex.IncidentID, "reason": string(ex.Reason), "attempt": ex.Attempt,
		"maxAttempts": ex.MaxAttempts, "kind": string(ex.Kind), "work": ex.Work, "ageMs": ex.Age.Milliseconds()})
	if o, ok := c.self.(RecoveryExhaustedObserver); ok {
		_ = agent.Enter(ctx, c.self, func(ctx context.Context) error {
			defer func() {
				if r := recover(); r != nil {
					c.log.Error("chat: OnRecoveryExhausted panicked", "stream", t.row.ID, "panic", fmt.Sprint(r))
				}
			}()
			o.OnRecoveryExhausted(ctx, ex)
			return nil
		})
	}
	if !sealedBefore {
		var meta exhaustedMetadata
		meta.Agentry.RecoveryExhausted = ex.Reason
		raw, _ := json.Marshal(meta)
		id := newID()
		start, end := message.TextStart(id), message.TextEnd(id)
		start.ProviderMetadata, end.ProviderMetadata = raw, raw
		for _, ch := range []message.Chunk{start, message.TextDelta(id, ex.TerminalMessage), end} {
			if err := t.write(ch); err != nil {
				if t.ctx.Err() != nil {
					return c.finishTurn(ctx, t, OutcomeAborted, "")
				}
				return c.finishTurn(ctx, t, OutcomeError, c.turnError(t, err))
			}
		}
	}
	res := c.finishTurn(ctx, t, OutcomeError, ex.TerminalMessage)
	res.Exhausted = ex.Reason
	return res
}
