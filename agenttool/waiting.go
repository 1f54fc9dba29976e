package agenttool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// Runs that wait for input.
//
// A child's turn that calls a tool needing approval, or a client-side
// tool, ends waiting for the answer (see chat.TurnResult.Waiting). The run
// does not end with it: it is waiting for input. The answer — given from
// the child's own chat (the drill-in) or from the parent's connection (the
// agent_tool_approval and agent_tool_result frames, or
// AnswerAgentToolApproval and AnswerAgentToolOutput) — starts a
// continuation turn of the child's message, and the run goes on with it:
// its stream continues the run's sequence, so the parent's clients see one
// timeline, and the run ends when a turn ends without waiting. While it
// waits, the parent's no-progress timer is stopped: waiting for a person is
// not silence.

// errWaitCanceled ends the wait of a run canceled while it waited.
var errWaitCanceled = errors.New("agenttool: run canceled while it waited for input")

// waitRunTurns waits for the run's turn, then for each continuation a wait
// for input leads to, and returns the result of the turn that ended the
// run.
func (h *host) waitRunTurns(ctx context.Context, cb *chat.Base, cr *childRun) (chat.TurnResult, error) {
	h.mu.Lock()
	streamID := cr.streamID
	h.mu.Unlock()
	for {
		res, err := cb.WaitTurn(ctx, streamID)
		if err != nil || ctx.Err() != nil || res.Outcome != chat.OutcomeCompleted || len(res.Waiting) == 0 {
			return res, err
		}
		h.setRunState(cr, streamID, res.Waiting)
		// Recorded for a parent on another node, which reads it to tell
		// waiting from silence: advisory, so a failure only logs.
		if err := h.recordWait(ctx, cr.runID, streamID, res.Waiting); err != nil && ctx.Err() == nil {
			h.b.Logger().Warn("agenttool: record wait for input", "run", cr.runID, "err", err)
		}
		h.hintParent()
		h.publish(ctx, "waiting", map[string]any{"runId": cr.runID, "calls": len(res.Waiting)})
		wctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-cr.abort:
				cancel()
			case <-wctx.Done():
			}
		}()
		next, err := cb.NextTurn(wctx, streamID)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				return res, errWaitCanceled
			}
			return res, err
		}
		if err := h.recordWait(ctx, cr.runID, next, nil); err != nil {
			return res, err
		}
		// The answer is a signal: a no-progress budget counts from it.
		if err := h.touchSignal(ctx, cr.runID); err != nil {
			return res, err
		}
		h.setRunState(cr, next, nil)
		h.hintParent()
		h.publish(ctx, "resumed", map[string]any{"runId": cr.runID, "stream": next})
		streamID = next
	}
}

// recordWait records the run's current turn and what it waits for (nil:
// nothing), in the child's record of the run.
func (h *host) recordWait(ctx context.Context, runID, streamID string, waiting []chat.WaitingCall) error {
	var col any
	if len(waiting) > 0 {
		raw, err := json.Marshal(waiting)
		if err != nil {
			return fmt.Errorf("agenttool: encode wait: %w", err)
		}
		col = string(raw)
	}
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_child_runs SET request_id = ?, waiting_json = ? WHERE instance_id = ? AND run_id = ?`,
			streamID, col, h.iid, runID)
		return err
	})
	if err != nil {
		return fmt.Errorf("agenttool: record child turn: %w", err)
	}
	return nil
}

// setRunState records the run's current turn and what it waits for, and
// tells whoever follows the run.
func (h *host) setRunState(cr *childRun, streamID string, waiting []chat.WaitingCall) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cr.streamID, cr.waiting = streamID, waiting
	close(cr.changed)
	cr.changed = make(chan struct{})
}

// runState returns the run's current turn, what it waits for, and a
// channel closed at its next change.
func (h *host) runState(cr *childRun) (streamID string, waiting []chat.WaitingCall, changed <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return cr.streamID, cr.waiting, cr.changed
}

// stopWaitLocked ends the run's wait for input (a cancel). h.mu held.
func (cr *childRun) stopWaitLocked() {
	select {
	case <-cr.abort:
	default:
		close(cr.abort)
	}
}

// waitingProgress is the transient progress chunk a parent's clients get
// when a run starts or stops waiting for input (the reducer shows it as
// the run's progress).
func waitingProgress(at int, waiting []chat.WaitingCall) string {
	data := map[string]any{"phase": "running", "message": "Input received"}
	if len(waiting) > 0 {
		var what []string
		for _, w := range waiting {
			if w.Approval {
				what = append(what, "approval of "+w.ToolName)
			} else {
				what = append(what, w.ToolName)
			}
		}
		data = map[string]any{"phase": "waiting-for-input", "message": "Waiting for " + strings.Join(what, ", "),
			"data": map[string]any{"waiting": waiting}}
	}
	// Each its own id: clients dedupe progress frames by it.
	id := fmt.Sprintf("agentry-input-%d-%s", at, data["phase"])
	b, _ := json.Marshal(map[string]any{"type": "data-agent-progress", "id": id, "transient": true, "data": data})
	return string(b)
}

// AnswerAgentToolApproval answers, from the parent, the approval request
// of the tool call toolCallID that the run runID's child waits for; the
// child goes on with its run. Only a run of parent's registry that is in
// flight can be answered. In a cluster, a child on another node gets the
// answer through its owner (Remote.AnswerChild).
func AnswerAgentToolApproval(ctx context.Context, parent agent.Agent, runID, toolCallID string, approved bool, reason string) error {
	return answerRun(ctx, parent, RemoteAnswer{RunID: runID, ToolCallID: toolCallID, Kind: AnswerApproval, Approved: approved, Reason: reason})
}

// AnswerAgentToolOutput answers, from the parent, a client-side tool's
// call toolCallID that the run runID's child waits for, with output (or
// errText when it is not empty).
func AnswerAgentToolOutput(ctx context.Context, parent agent.Agent, runID, toolCallID string, output json.RawMessage, errText string) error {
	return answerRun(ctx, parent, RemoteAnswer{RunID: runID, ToolCallID: toolCallID, Kind: AnswerOutput, Output: output, ErrorText: errText})
}

// ErrRunNotWaiting refuses an answer for a run that is not in flight in
// the parent's registry.
var ErrRunNotWaiting = errors.New("agenttool: no such run in flight")

func answerRun(ctx context.Context, parent agent.Agent, a RemoteAnswer) error {
	h, err := hostOf(parent)
	if err != nil {
		return err
	}
	row, ok, err := h.readRun(ctx, a.RunID)
	if err != nil {
		return fmt.Errorf("agenttool: read run: %w", err)
	}
	if !ok || !row.Status.Active() {
		return ErrRunNotWaiting
	}
	a.Child = h.b.Path().Child(row.AgentType, a.RunID)
	if r := h.remote(a.Child); r != nil {
		// A call to another node: an await point, as a call into another
		// instance is.
		return agent.Await(ctx, func() error { return r.AnswerChild(ctx, a) })
	}
	child, release, err := h.rt.Acquire(ctx, a.Child)
	if err != nil {
		return fmt.Errorf("agenttool: child of %s: %w", a.RunID, err)
	}
	defer release()
	cb, ok := chatOf(child)
	if !ok {
		return errNoChat
	}
	return a.apply(ctx, cb)
}

// apply gives the answer to the child's chat; it starts the continuation
// turn once no call of the step waits any more.
func (a RemoteAnswer) apply(ctx context.Context, cb *chat.Base) error {
	var err error
	if a.Kind == AnswerApproval {
		_, err = cb.AddToolApprovalResponse(ctx, a.ToolCallID, a.Approved, a.Reason, chat.AnswerOptions{AutoContinue: true})
	} else {
		_, err = cb.AddToolOutput(ctx, a.ToolCallID, a.Output, a.ErrorText, chat.AnswerOptions{AutoContinue: true})
	}
	return err
}

// LayerFrame handles the answers a parent's clients give to the runs of
// its registry that wait for input:
//
//	{"type":"agent_tool_approval","runId":…,"toolCallId":…,"approved":true|false,"reason"?:…}
//	{"type":"agent_tool_result","runId":…,"toolCallId":…,"output":…,"state"?:"output-error","errorText"?:…}
//
// A refused answer gets an error frame (unknown_run, tool_call_not_waiting,
// bad_agent_tool_frame).
func (h *host) LayerFrame(ctx context.Context, conn *agent.Conn, typ string, data []byte) bool {
	if typ != wire.AgentToolApproval && typ != wire.AgentToolResult {
		return false
	}
	var f struct {
		RunID      string          `json:"runId"`
		ToolCallID string          `json:"toolCallId"`
		Approved   bool            `json:"approved"`
		Reason     string          `json:"reason"`
		Output     json.RawMessage `json:"output"`
		State      string          `json:"state"`
		ErrorText  string          `json:"errorText"`
	}
	if err := json.Unmarshal(data, &f); err != nil || f.RunID == "" || f.ToolCallID == "" {
		conn.SendError("bad_agent_tool_frame", typ+" needs a runId and a toolCallId")
		return true
	}
	var err error
	if typ == wire.AgentToolApproval {
		err = AnswerAgentToolApproval(ctx, h.a, f.RunID, f.ToolCallID, f.Approved, f.Reason)
	} else {
		errText := ""
		if f.State == "output-error" {
			errText = f.ErrorText
			if errText == "" {
				errText = "tool failed"
			}
		}
		err = AnswerAgentToolOutput(ctx, h.a, f.RunID, f.ToolCallID, f.Output, errText)
	}
	switch {
	case err == nil:
	case errors.Is(err, ErrRunNotWaiting):
		conn.SendError("unknown_run", "no run "+f.RunID+" in flight")
	case errors.Is(err, chat.ErrUnknownToolCall), errors.Is(err, chat.ErrNotWaiting), errors.Is(err, chat.ErrTurnRunning):
		conn.SendError("tool_call_not_waiting", err.Error())
	default:
		conn.SendError("agent_tool_failed", h.rt.ClientMessage(err, "agent", h.b.Path().String(), "run", f.RunID))
	}
	return true
}

// touchSignal records that the run's child just showed a sign of life.
func (h *host) touchSignal(ctx context.Context, runID string) error {
	now := h.rt.Clock().Now().UnixMilli()
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_child_runs SET last_signal_at = ? WHERE instance_id = ? AND run_id = ?`, now, h.iid, runID)
		return err
	})
	if err != nil {
		return fmt.Errorf("agenttool: record signal: %w", err)
	}
	return nil
}

// isWaiting reports whether the run executing in this child waits for
// input: a no-progress budget does not count that time as silence.
func (h *host) isWaiting(runID string) bool {
	h.mu.Lock()
	cr := h.child[runID]
	waiting := cr != nil && len(cr.waiting) > 0
	h.mu.Unlock()
	if waiting {
		return true
	}
	// Not known yet (the watcher of a restarted child has not read its
	// turn): the child's transcript tells.
	cb, ok := chatOf(h.a)
	return ok && len(cb.WaitingCalls()) > 0
}

// waitingOf returns what the run executing in this child waits for.
func (h *host) waitingOf(runID string) []chat.WaitingCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cr := h.child[runID]; cr != nil {
		return cr.waiting
	}
	return nil
}
