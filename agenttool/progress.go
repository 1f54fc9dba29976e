package agenttool

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/ids"
	"github.com/agentry/agentry/store"
)

// Progress is a signal a child reports while it works.
type Progress struct {
	// Fraction of the work done, 0 to 1; nil when unknown.
	Fraction *float64 `json:"fraction,omitempty"`
	Message  string   `json:"message,omitempty"`
	Phase    string   `json:"phase,omitempty"`
	// Milestone, when set, makes the signal a durable milestone with this
	// name.
	Milestone string `json:"-"`
	// Data travels live; it is stored only with persist (milestone data is
	// always stored).
	Data any `json:"data,omitempty"`
}

// Fraction returns a pointer to f, for Progress.Fraction.
func Fraction(f float64) *float64 { return &f }

// Milestone is a durable step a child reached.
type Milestone struct {
	Name     string          `json:"name"`
	Sequence int             `json:"sequence"`
	At       int64           `json:"at"` // Unix milliseconds
	Fraction *float64        `json:"fraction,omitempty"`
	Message  string          `json:"message,omitempty"`
	Phase    string          `json:"phase,omitempty"`
	Data     json.RawMessage `json:"data,omitempty"`
}

// ProgressObserver is the parent's hook for the progress and milestones of
// its runs as they arrive (the seed's onProgress). It is not durable: a
// signal sent while the parent was not following is not replayed to it.
type ProgressObserver interface {
	OnProgress(ctx context.Context, run Run, p ProgressEvent)
}

// ProgressEvent is a progress signal or a milestone seen by the parent.
type ProgressEvent struct {
	Fraction  *float64        `json:"fraction,omitempty"`
	Message   string          `json:"message,omitempty"`
	Phase     string          `json:"phase,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
	Milestone *Milestone      `json:"milestone,omitempty"`
}

// progressWindow is the coalescing window of progress signals.
const progressWindow = 200 * time.Millisecond

// emitter coalesces one run's progress: latest wins within the window and
// a trailing send closes it, so the last state of a burst always goes out.
type emitter struct {
	last    time.Time
	pending *Progress
	persist bool
	ctx     context.Context // the turn's context, for the trailing send
	timer   clockwork.Timer
	seq     uint64 // sends decided so far (guarded by host.mu)

	// sendMu orders the sends: a send decided before another one that
	// already went out is stale and dropped, so neither the clients nor
	// the stored snapshot ever go back to an older signal.
	sendMu sync.Mutex
	sent   uint64 // seq of the last send that went out (guarded by sendMu)
}

// ReportProgress reports progress of the agent-tool run whose child turn
// runs in ctx (from a tool or a handler of the child): no run id is needed.
// Outside a run it does nothing and logs a warning. Progress is coalesced
// (latest wins within 200 ms, with a trailing send); a fraction of 1 or more
// and milestones go out at once. A milestone (p.Milestone set) is stored
// durably with the next per-run sequence. With persist, Data is also kept in
// the run's progress snapshot.
func ReportProgress(ctx context.Context, p Progress, persist ...bool) error {
	streamID, a, ok := chat.CurrentTurn(ctx)
	if !ok {
		warnOutsideRun(ctx)
		return nil
	}
	h, err := hostOf(a)
	if err != nil {
		return err
	}
	cr := h.runOfStream(streamID)
	if cr == nil {
		h.b.Logger().Warn("agenttool: ReportProgress outside an agent-tool run; ignored")
		return nil
	}
	keep := len(persist) > 0 && persist[0]
	if p.Milestone != "" {
		return h.emitMilestone(ctx, cr, p)
	}
	now := h.rt.Clock().Now()
	h.mu.Lock()
	em := cr.emitter
	if em == nil {
		em = &emitter{}
		cr.emitter = em
	}
	em.ctx = ctx
	final := p.Fraction != nil && *p.Fraction >= 1
	if !final && !em.last.IsZero() && now.Sub(em.last) < progressWindow {
		em.pending, em.persist = &p, keep
		if em.timer == nil {
			em.timer = h.rt.Clock().AfterFunc(progressWindow-now.Sub(em.last), func() { h.flushProgress(cr) })
		}
		h.mu.Unlock()
		return nil
	}
	em.last, em.pending = now, nil
	if em.timer != nil {
		em.timer.Stop()
		em.timer = nil
	}
	em.seq++
	seq := em.seq
	h.mu.Unlock()
	return h.emitProgress(ctx, cr, em, seq, p, keep)
}

// warnOutsideRun logs a ReportProgress outside any chat turn through the
// logger of the agent whose code runs in ctx. Outside any agent there is
// no runtime to log through, and the call is ignored silently.
func warnOutsideRun(ctx context.Context) {
	if a, ok := agent.FromContext(ctx); ok {
		agent.BaseOf(a).Logger().WarnContext(ctx, "agenttool: ReportProgress called outside an agent-tool run; ignored")
	}
}

// runOfStream finds the run executing as stream streamID.
func (h *host) runOfStream(streamID string) *childRun {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, cr := range h.child {
		if cr.streamID == streamID {
			return cr
		}
	}
	return nil
}

// flushProgress sends the signal a window held back.
func (h *host) flushProgress(cr *childRun) {
	h.mu.Lock()
	em := cr.emitter
	if em == nil || em.pending == nil {
		if em != nil {
			em.timer = nil
		}
		h.mu.Unlock()
		return
	}
	p, keep, ctx := *em.pending, em.persist, em.ctx
	em.pending, em.timer, em.last = nil, nil, h.rt.Clock().Now()
	em.seq++
	seq := em.seq
	h.mu.Unlock()
	if err := h.emitProgress(ctx, cr, em, seq, p, keep); err != nil {
		h.b.Logger().Debug("agenttool: trailing progress", "run", cr.runID, "err", err)
	}
}

type progressData struct {
	Fraction *float64 `json:"fraction,omitempty"`
	Message  string   `json:"message,omitempty"`
	Phase    string   `json:"phase,omitempty"`
	Data     any      `json:"data,omitempty"`
}

// emitProgress writes a transient progress chunk into the child's turn and
// stores the snapshot, unless a later send went out first. Each chunk has
// its own id: clients deduplicate progress frames by id.
func (h *host) emitProgress(ctx context.Context, cr *childRun, em *emitter, seq uint64, p Progress, persist bool) error {
	em.sendMu.Lock()
	defer em.sendMu.Unlock()
	if seq < em.sent {
		return nil
	}
	em.sent = seq
	live, err := json.Marshal(progressData{p.Fraction, p.Message, p.Phase, p.Data})
	if err != nil {
		return fmt.Errorf("agenttool: marshal progress: %w", err)
	}
	snap := progressData{Fraction: p.Fraction, Message: p.Message, Phase: p.Phase}
	if persist {
		snap.Data = p.Data
	}
	stored, _ := json.Marshal(snap)
	if err := chat.WriteChunk(ctx, message.Data("agent-progress", "progress-"+ids.Random(), live, true)); err != nil {
		return err
	}
	now := h.rt.Clock().Now().UnixMilli()
	return h.b.DB().Update(context.WithoutCancel(ctx), func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_child_runs SET progress_json = ?, last_signal_at = ? WHERE instance_id = ? AND run_id = ?`,
			string(stored), now, h.iid, cr.runID)
		return err
	})
}

// emitMilestone stores a milestone with the next sequence and streams it.
func (h *host) emitMilestone(ctx context.Context, cr *childRun, p Progress) error {
	now := h.rt.Clock().Now()
	m := Milestone{Name: p.Milestone, At: now.UnixMilli(), Fraction: p.Fraction, Message: p.Message, Phase: p.Phase}
	if p.Data != nil {
		d, err := json.Marshal(p.Data)
		if err != nil {
			return fmt.Errorf("agenttool: marshal milestone data: %w", err)
		}
		m.Data = d
	}
	err := h.b.DB().Update(context.WithoutCancel(ctx), func(tx store.Tx) error {
		// The run row's UPDATE comes first: its row lock orders concurrent
		// milestones of the run (on an engine with concurrent writers), so
		// the next sequence is read after the one before committed.
		if _, err := tx.Exec(ctx, `UPDATE agent_tool_child_runs SET last_signal_at = ? WHERE instance_id = ? AND run_id = ?`, m.At, h.iid, cr.runID); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(sequence), -1) + 1 FROM agent_tool_milestones WHERE instance_id = ? AND run_id = ?`,
			h.iid, cr.runID).Scan(&m.Sequence); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO agent_tool_milestones (instance_id, run_id, sequence, name, data_json, at) VALUES (?, ?, ?, ?, ?, ?)`,
			h.iid, cr.runID, m.Sequence, m.Name, nullStr(string(m.Data)), m.At)
		return err
	})
	if err != nil {
		return fmt.Errorf("agenttool: record milestone: %w", err)
	}
	h.mu.Lock()
	if cr.emitter == nil {
		cr.emitter = &emitter{}
	}
	cr.emitter.last = now
	h.mu.Unlock()
	body, _ := json.Marshal(m)
	return chat.WriteChunk(ctx, message.Data("agent-milestone", "milestone-"+strconv.Itoa(m.Sequence), body, false))
}

// milestones returns a child run's milestones in order.
func (h *host) milestones(ctx context.Context, runID string) ([]Milestone, error) {
	var out []Milestone
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		out, err = h.queryMilestones(ctx, tx, runID)
		return err
	})
	return out, err
}

// queryMilestones reads the milestones of a child run in order.
func (h *host) queryMilestones(ctx context.Context, tx store.Tx, runID string) ([]Milestone, error) {
	return queryMilestonesOf(ctx, tx, "?", h.iid, runID)
}

// queryMilestonesOf reads the milestones of a child run in order; the
// child's instance id is the SQL expression idExpr with its argument idArg.
func queryMilestonesOf(ctx context.Context, tx store.Tx, idExpr string, idArg any, runID string) ([]Milestone, error) {
	rows, err := tx.Query(ctx, `SELECT sequence, name, data_json, at FROM agent_tool_milestones WHERE instance_id = `+idExpr+` AND run_id = ? ORDER BY sequence`,
		idArg, runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Milestone
	for rows.Next() {
		var m Milestone
		var data sql.NullString
		if err := rows.Scan(&m.Sequence, &m.Name, &data, &m.At); err != nil {
			return nil, err
		}
		if data.Valid {
			m.Data = json.RawMessage(data.String)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// lastSignal returns when a child run last reported progress or a
// milestone, or nil if it never did.
func (h *host) lastSignal(ctx context.Context, runID string) *time.Time {
	var at sql.NullInt64
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT last_signal_at FROM agent_tool_child_runs WHERE instance_id = ? AND run_id = ?`, h.iid, runID).Scan(&at)
	})
	if err != nil || !at.Valid {
		return nil
	}
	t := time.UnixMilli(at.Int64)
	return &t
}

// progressOf parses a forwarded chunk body that carries progress or a
// milestone.
func progressOf(body string) (ProgressEvent, bool) {
	if !isProgress(body) && !isMilestone(body) {
		return ProgressEvent{}, false
	}
	var c struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	if json.Unmarshal([]byte(body), &c) != nil {
		return ProgressEvent{}, false
	}
	var ev ProgressEvent
	if c.Type == "data-agent-milestone" {
		var m Milestone
		if json.Unmarshal(c.Data, &m) != nil || m.Name == "" {
			return ProgressEvent{}, false
		}
		ev = ProgressEvent{Fraction: m.Fraction, Message: m.Message, Phase: m.Phase, Data: m.Data, Milestone: &m}
		return ev, true
	}
	if json.Unmarshal(c.Data, &ev) != nil {
		return ProgressEvent{}, false
	}
	return ev, true
}

func isMilestone(body string) bool {
	return len(body) > 30 && body[:30] == `{"type":"data-agent-milestone"`
}
