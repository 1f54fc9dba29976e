package agenttool

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/ids"
	"github.com/agentry/agentry/store"
)

// Hooks of a child, all optional.

// ChildRequest describes the run a child is asked to execute.
type ChildRequest struct {
	RunID      string
	AgentType  string
	ParentPath agent.Path
}

// InputFormatter turns a run's input into the user message the child's
// turn answers (the seed's formatAgentToolInput). The default is a user
// message whose text is the input string, or the input as indented JSON.
type InputFormatter interface {
	FormatAgentToolInput(input json.RawMessage, req ChildRequest) message.Message
}

// OutputProvider gives a run's structured output (the seed's
// getAgentToolOutput). It is read as soon as the child's turn ends, so a
// workflow child stores its result before the turn finishes.
type OutputProvider interface {
	AgentToolOutput(ctx context.Context, runID string) (any, error)
}

// SummaryProvider gives a run's display summary (the seed's
// getAgentToolSummary). The default is the assistant text of the turn, else
// the output as text.
type SummaryProvider interface {
	AgentToolSummary(ctx context.Context, runID string, output json.RawMessage) string
}

// Child statuses: a child never reports starting or interrupted.
const (
	childRunning = "running"
)

// Inspection is a child's view of a run.
type Inspection struct {
	RunID       string          `json:"runId"`
	Status      Status          `json:"status"`
	Summary     string          `json:"summary,omitempty"`
	Output      json.RawMessage `json:"output,omitempty"`
	Error       string          `json:"error,omitempty"`
	RequestID   string          `json:"requestId,omitempty"`
	StartedAt   time.Time       `json:"startedAt"`
	CompletedAt *time.Time      `json:"completedAt,omitempty"`
	// Progress is the latest progress snapshot (its data only when it was
	// reported with persist).
	Progress json.RawMessage `json:"progress,omitempty"`
	// LastSignalAt is when the child last reported progress or a milestone.
	LastSignalAt *time.Time `json:"lastSignalAt,omitempty"`
	// Milestones are the run's durable milestones, in order.
	Milestones []Milestone `json:"milestones,omitempty"`
	// Waiting lists the calls the run waits for input on (approvals,
	// client tools' outputs), when it waits.
	Waiting []chat.WaitingCall `json:"waiting,omitempty"`
}

// childRun is a run executing in this (child) instance.
type childRun struct {
	runID    string
	streamID string
	done     chan struct{}
	reason   string   // cancel reason, guarded by host.mu
	emitter  *emitter // progress coalescing, guarded by host.mu

	// Guarded by host.mu. pending is the end the turn's end transaction
	// wrote (see endHook), ended the same end once committed: the
	// watcher then writes nothing, and the awaiting parent reads nothing.
	pending, ended *childEnd
	// fuse, when set, lets the turn's end transaction also write the
	// awaiting parent's terminal row.
	fuse *parentFuse
	// The run's wait for input (waiting.go), guarded by host.mu: the calls
	// its turn ended waiting for, closed and replaced on every change of
	// waiting or streamID, and closed when the run is canceled while it
	// waits.
	waiting []chat.WaitingCall
	changed chan struct{}
	abort   chan struct{}
	// submitted, when set, is closed once the submission that starts the
	// run (startChildRun) has committed or failed; failed (guarded by
	// host.mu) tells which. The run is known before then, so that its
	// turn's first progress finds it, but no start answers with it until
	// it committed. Nil for a run known from its stored record.
	submitted chan struct{}
	failed    bool
}

// childEnd is a run's end as recorded in the child's row.
type childEnd struct {
	status  Status
	summary string
	output  json.RawMessage
	errText string
}

func (e *childEnd) inspection(runID string) Inspection {
	return Inspection{RunID: runID, Status: e.status, Summary: e.summary, Output: e.output, Error: e.errText}
}

// Fuse states.
const (
	fuseArmed    = iota // the child's end may write the parent's row
	fuseClaimed         // the child's end transaction writes it
	fuseDone            // that transaction ended (committed tells how)
	fuseDisarmed        // the parent stopped waiting before the end claimed it
)

// parentFuse joins the end of a child's turn and the awaiting parent's
// terminal row in one transaction. Both instances live in one runtime and
// share its database. The child's end claims the fuse only for a completed
// run, whose terminal row no later decision of the parent (a cancel, a
// give-up) would change. The parent disarms the fuse once it stops waiting;
// when the claim came first, it waits for the end instead. Its fields are
// guarded by the child host's mu.
//
// A fuse belongs to one copy of the parent (parent): the hydration whose
// fence its write passes and whose await takes its end (fused) and
// delivers it. Another copy of the parent that follows the same child run
// (one dropped with a lost shard lease, whose dispatch came late) neither
// disarms nor takes it: taken there, the end was delivered by a copy whose
// writes the fence refuses, and the copy that recorded it delivered
// nothing. A fuse of a copy that the runtime no longer serves (dropped) is
// not claimed: its fence would refuse the child's end with it, leaving the
// child's turn unfinished in its storage. The await of the current copy
// arms its own in its place.
type parentFuse struct {
	parent    *host
	runID     string
	state     int
	committed bool
	won       bool
	marks     []int
}

func chatOf(a agent.Agent) (*chat.Base, bool) { return agent.LayerOf[*chat.Base](a) }

// childStart are the optional parts of startChildRun.
type childStart struct {
	// parentTx adds the writes of parent (the hydrated parent instance)
	// to the transaction that starts the run (see startChildRun); an error
	// aborts the start.
	parentTx func(ctx context.Context, tx store.Tx) error
	parent   agent.Agent
	// fuse is armed on the run (see parentFuse).
	fuse *parentFuse
}

// startChildRun starts the run in this child, idempotently: a run id that
// already has a row is not started again. The child's record of the run
// (with its turn's id) and the turn are written in one transaction, with
// opt.parentTx's writes. started reports whether that transaction ran (and
// so parentTx); it does not for a run this child knew already.
func (h *host) startChildRun(ctx context.Context, runID string, input json.RawMessage, req ChildRequest, opt childStart) (cr *childRun, started bool, err error) {
	cb, ok := chatOf(h.a)
	if !ok {
		return nil, false, errNoChat
	}
	for {
		// A run known here is answered once its start committed: an
		// answer (a stream id) must name a stored run and turn. A start
		// that failed left the run unknown: try again.
		h.mu.Lock()
		cr, ok := h.child[runID]
		h.mu.Unlock()
		if !ok {
			break
		}
		if ok, err := h.awaitSubmitted(ctx, cr); ok || err != nil {
			return cr, false, err
		}
	}
	insp, err := h.inspectChild(ctx, runID)
	if err != nil {
		return nil, false, err
	}
	if insp != nil && insp.RequestID != "" {
		cr := h.track(runID, insp.RequestID, insp.Status != childRunning)
		if ok, err := h.awaitSubmitted(ctx, cr); !ok && err == nil {
			// A concurrent start of the run failed: it is recorded all
			// the same, so it is tracked from its record.
			cr = h.track(runID, insp.RequestID, insp.Status != childRunning)
		}
		return cr, false, nil
	}
	if insp != nil && (len(input) == 0 || string(input) == "null") {
		// Recorded but never started (a crash in between): start it with
		// the input it was recorded with.
		if stored, err := h.childInput(ctx, runID); err == nil && len(stored) > 0 {
			input = stored
		}
	}
	now := h.rt.Clock().Now().UnixMilli()
	msg := defaultInputMessage(input, runID)
	if f, ok := h.a.(InputFormatter); ok {
		_ = agent.Enter(agent.Unheld(ctx), h.a, func(context.Context) error {
			msg = f.FormatAgentToolInput(input, req)
			return nil
		})
	}
	body, _ := json.Marshal(map[string]json.RawMessage{"agentToolInput": orNull(input)})
	// The run is known under its turn's id before the turn starts, so the
	// child's first ReportProgress already finds it.
	cr = &childRun{runID: runID, streamID: newID(), done: make(chan struct{}), fuse: opt.fuse,
		changed: make(chan struct{}), abort: make(chan struct{}), submitted: make(chan struct{})}
	h.mu.Lock()
	if _, ok := h.child[runID]; ok {
		h.mu.Unlock()
		// Another start of the run came first: answer with it once it
		// committed.
		return h.startChildRun(ctx, runID, input, req, opt)
	}
	h.child[runID] = cr
	h.mu.Unlock()
	streamID, err := cb.SubmitMessages(ctx, []message.Message{msg}, chat.SubmitOptions{
		ID: cr.streamID, IdempotencyKey: submissionKey(runID), Body: body, Retain: true,
		Tx: func(ctx context.Context, tx store.Tx, streamID string) error {
			if _, err := tx.Exec(ctx, `INSERT INTO agent_tool_child_runs (instance_id, run_id, request_id, status, input_json, started_at)
				VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (instance_id, run_id) DO UPDATE SET request_id = excluded.request_id`,
				h.iid, runID, streamID, childRunning, nullStr(string(input)), now); err != nil {
				return fmt.Errorf("agenttool: record child run: %w", err)
			}
			if opt.parentTx != nil {
				// The parent's rows in the child's transaction: fenced
				// for the parent's hydration too (in a cluster, both must
				// be ours).
				if err := h.rt.FenceAgent(ctx, tx, opt.parent); err != nil {
					return err
				}
				return opt.parentTx(ctx, tx)
			}
			return nil
		},
		End: h.endHook(cr)})
	if err != nil {
		h.mu.Lock()
		if h.child[runID] == cr {
			delete(h.child, runID)
		}
		cr.failed = true
		h.mu.Unlock()
		close(cr.submitted)
		return nil, false, fmt.Errorf("agenttool: start child turn: %w", err)
	}
	h.mu.Lock()
	cr.streamID = streamID // an earlier submission of this run keeps its id
	h.mu.Unlock()
	close(cr.submitted)
	h.watchRun(cr)
	return cr, true, nil
}

// awaitSubmitted waits until the submission that starts cr committed (ok)
// or failed (neither ok nor an error). A run known from its record is
// committed. The wait is one transaction of another caller, which takes no
// input gate, so the caller's gates stay held.
func (h *host) awaitSubmitted(ctx context.Context, cr *childRun) (ok bool, err error) {
	if cr.submitted == nil {
		return true, nil
	}
	select {
	case <-cr.submitted:
	default:
		h.publish(ctx, "child:start-wait", map[string]any{"runId": cr.runID})
		select {
		case <-cr.submitted:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !cr.failed, nil
}

// endHook records the run's end in the transaction of its turn's end, and
// with a fuse armed also the parent's terminal row of a completed run. A
// child with output or summary hooks has none: those are agent code, which
// runs after the turn's end, so its watcher records the end.
func (h *host) endHook(cr *childRun) *chat.EndHook {
	if _, ok := h.a.(OutputProvider); ok {
		return nil
	}
	if _, ok := h.a.(SummaryProvider); ok {
		return nil
	}
	return &chat.EndHook{
		Write: func(ctx context.Context, tx store.Tx, res chat.TurnResult, next int) error {
			if len(res.Waiting) > 0 {
				return nil // the run waits for input; a continuation goes on with it
			}
			h.mu.Lock()
			reason := cr.reason
			h.mu.Unlock()
			end := turnEnd(res, reason)
			now := h.rt.Clock().Now()
			r, err := tx.Exec(ctx, `UPDATE agent_tool_child_runs SET status = ?, summary = ?, output_json = ?, error_message = ?, completed_at = ?
				WHERE instance_id = ? AND run_id = ? AND completed_at IS NULL`,
				end.status, nullStr(end.summary), nil, nullStr(end.errText), now.UnixMilli(), h.iid, cr.runID)
			if err != nil {
				return err
			}
			if n, err := r.RowsAffected(); err != nil || n != 1 {
				return err // recorded before: the watcher reads what it is
			}
			h.mu.Lock()
			cr.pending = &end // no fuse is armed from here on
			f := cr.fuse
			h.mu.Unlock()
			// Read outside the lock: it takes the runtime's.
			current := f != nil && f.parent.served()
			// The store runs a transaction again after an attempt that
			// rolled back (a connection lost before its COMMIT, an
			// undecided fence, a serialization failure), and Write with
			// it: a fuse that an earlier attempt claimed is claimed
			// again (that attempt's writes of the parent's row were
			// rolled back with it), or given back.
			h.mu.Lock()
			claimed := current && cr.fuse == f && (f.state == fuseArmed || f.state == fuseClaimed) && end.status == StatusCompleted
			switch {
			case claimed:
				f.state, f.won, f.marks = fuseClaimed, false, nil
			case f != nil && cr.fuse == f && f.state == fuseClaimed:
				f.state = fuseArmed
			}
			h.mu.Unlock()
			if !claimed {
				return nil
			}
			if err := h.rt.FenceAgent(ctx, tx, f.parent.a); err != nil {
				return err
			}
			_, observed := f.parent.a.(FinishObserver)
			won, marks, err := writeTerminalTx(ctx, tx, f.parent, cr.runID,
				Result{Status: StatusCompleted, Summary: end.summary, Usage: treeUsage(res)}, next, now.UnixMilli(), observed, false)
			h.mu.Lock()
			f.won, f.marks = won, marks
			h.mu.Unlock()
			return err
		},
		Committed: func(ok bool) {
			h.mu.Lock()
			if ok {
				cr.ended = cr.pending
			}
			cr.pending = nil
			if f := cr.fuse; f != nil && f.state == fuseClaimed {
				f.state, f.committed = fuseDone, ok
			}
			h.mu.Unlock()
		},
	}
}

// arm gives a run that has not ended a fuse for parent, which re-attaches
// to it: a run started before a restart has none, and its end can still
// write the parent's terminal row in its own commit. A fuse armed by a
// copy of the parent that the runtime no longer serves is replaced by
// parent's (unless the child's end claimed it already).
func (h *host) arm(cr *childRun, parent *host) {
	h.mu.Lock()
	f := cr.fuse
	h.mu.Unlock()
	// Read outside the lock: it takes the runtime's.
	stale := f != nil && f.parent != parent && !f.parent.served()
	h.mu.Lock()
	defer h.mu.Unlock()
	if cr.ended != nil || cr.pending != nil || cr.fuse != f {
		return
	}
	if f != nil && (!stale || f.state != fuseArmed) {
		return
	}
	cr.fuse = &parentFuse{parent: parent, runID: cr.runID}
}

// disarm tells a run's fuse that its parent (the copy that armed it) stops
// waiting. It reports whether the child's end claimed the fuse first: the
// parent then waits for the run's end and takes the fused result. A fuse
// of another copy of the parent is left alone (false).
func (h *host) disarm(cr *childRun, parent *host) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := cr.fuse
	if f == nil || f.parent != parent {
		return false
	}
	if f.state == fuseArmed {
		f.state = fuseDisarmed
		return false
	}
	return f.state != fuseDisarmed
}

// fused returns, once, the parent's terminal write that the child's end
// committed through parent's fuse (ok false: there was none). The fuse is
// spent: a later re-attach to the same run writes its own terminal. The
// fuse of another copy of the parent is left for that copy to take.
func (h *host) fused(cr *childRun, parent *host) (won bool, marks []int, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := cr.fuse
	if f == nil || f.parent != parent {
		return false, nil, false
	}
	cr.fuse = nil
	if f.state != fuseDone || !f.committed {
		return false, nil, false
	}
	return f.won, f.marks, true
}

// endOf returns the end the run recorded in this process, if any.
func (h *host) endOf(cr *childRun) *childEnd {
	h.mu.Lock()
	defer h.mu.Unlock()
	return cr.ended
}

// turnEnd is a run's end from its turn's result (reason: the cancel reason
// given to the run, if any), without the output hooks.
func turnEnd(res chat.TurnResult, reason string) childEnd {
	switch {
	case res.Outcome == chat.OutcomeAborted:
		if reason == "" {
			reason = msgCancelled
		}
		return childEnd{status: StatusAborted, errText: reason}
	case res.Outcome == chat.OutcomeSkipped:
		return childEnd{status: StatusError, errText: msgSkipped}
	case res.Exhausted != "":
		// The child's own recovery gave up on its turn (a budget spent): a
		// hard failure, not an interruption a retry could repair.
		return childEnd{status: StatusError, errText: fmt.Sprintf("%s (%s: %s)", msgRecoveryExhausted, res.Exhausted, res.Error)}
	case res.Outcome == chat.OutcomeError:
		e := res.Error
		if e == "" {
			e = "Agent tool run failed during streaming."
		}
		return childEnd{status: StatusError, errText: e}
	}
	return childEnd{status: StatusCompleted, summary: res.Text()}
}

// newID names a child's turn (in creation order, like the chat's own ids).
func newID() string { return ids.Sorted() }

func orNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

// defaultInputMessage is the user message of a run: the input string, or
// the input as indented JSON.
func defaultInputMessage(input json.RawMessage, runID string) message.Message {
	var text string
	if err := json.Unmarshal(input, &text); err != nil {
		var v any
		if json.Unmarshal(input, &v) == nil {
			b, _ := json.MarshalIndent(v, "", "  ")
			text = string(b)
		} else {
			text = string(input)
		}
	}
	return message.Message{ID: "agent-tool-" + runID + "-input", Role: message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: text}}}
}
