package agenttool

import (
	"context"
	"errors"
	"fmt"
)

func resultFromInspection(in Inspection) Result {
	switch in.Status {
	case StatusCompleted:
		return Result{Status: StatusCompleted, Output: in.Output, Summary: in.Summary}
	case StatusAborted:
		return Result{Status: StatusAborted, Error: in.Error}
	default:
		e := in.Error
		if e == "" {
			e = msgRunFailed
		}
		return Result{Status: StatusError, Error: e}
	}
}

// causeText is the reason text of a canceled context.
func causeText(ctx context.Context) string {
	cause := context.Cause(ctx)
	if cause == nil || errors.Is(cause, context.Canceled) {
		return msgCancelled
	}
	return cause.Error()
}

func ptr[T any](v T) *T { return &v }

// finish records a terminal result, tells the clients and the hooks, and
// returns the run's result as stored (a hard terminal written earlier wins).
func (h *host) finish(ctx context.Context, row runRow, res Result, mark int) (Result, error) {
	res.RunID, res.AgentType = row.RunID, row.AgentType
	if row.det.Detached && res.Status == StatusAborted && h.gaveUp(ctx, row.RunID) {
		// The child was torn down by a give-up, which was the delivery; its
		// aborted end is not delivered again and the run stays interrupted.
		if err := h.markFinishDelivered(ctx, row.RunID); err != nil {
			h.b.Logger().Warn("agenttool: mark delivered", "run", row.RunID, "err", err)
		}
		stored, _, err := h.readRun(ctx, row.RunID)
		return stored.Result(), err
	}
	// Between the terminal row's commit and its broadcast, a connect
	// replay can read the row and send the terminal event: finishing tells
	// it to drop the broadcast for that connection.
	h.mu.Lock()
	h.finishing[row.RunID]++
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		if h.finishing[row.RunID]--; h.finishing[row.RunID] <= 0 {
			delete(h.finishing, row.RunID)
		}
		h.mu.Unlock()
	}()
	won, marks, late, err := h.writeTerminal(ctx, row, res, mark)
	if err != nil {
		return res, fmt.Errorf("agenttool: record result: %w", err)
	}
	if won {
		// Stored before the terminal but not forwarded: sent before it.
		for _, c := range late {
			h.current().broadcast(row.ParentToolCallID, eventSeq(c.seq, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: c.body})
		}
	}
	return h.finished(ctx, row, res, won, marks)
}

// finished is finish after the terminal write (won: it was this one, with
// the run's marks now).
func (h *host) finished(ctx context.Context, row runRow, res Result, won bool, marks []int) (Result, error) {
	if !won {
		stored, ok, err := h.readRun(ctx, row.RunID)
		if err != nil || !ok {
			return res, err
		}
		return stored.Result(), nil
	}
	h.current().broadcast(row.ParentToolCallID, terminalSeq(marks), terminalEvent(res))
	run := row.Run
	run.Status, run.Summary, run.Output, run.Error = res.Status, res.Summary, res.Output, res.Error
	run.Reason, run.ChildStillRunning = res.Reason, res.ChildStillRunning
	if res.Usage != nil {
		run.Usage = res.Usage
	}
	h.countFinished(ctx, row, res)
	h.publish(ctx, "finish", map[string]any{"runId": row.RunID, "agentType": row.AgentType, "status": string(res.Status)})
	switch {
	case !row.det.Detached:
		h.deliverFinish(ctx, run, res, marks)
	case res.Status == StatusInterrupted:
		if err := h.deliver(ctx, slotGiveUp, row, run, res); err != nil {
			h.b.Logger().Warn("agenttool: delivery", "run", row.RunID, "err", err)
		}
	default:
		if err := h.deliver(ctx, slotFinish, row, run, res); err != nil {
			h.b.Logger().Warn("agenttool: delivery", "run", row.RunID, "err", err)
		}
	}
	return res, nil
}

// terminalEvent is the wire event of a terminal result.
func terminalEvent(r Result) Event {
	switch r.Status {
	case StatusCompleted:
		s := r.Summary
		return Event{Kind: "finished", RunID: r.RunID, Summary: &s}
	case StatusAborted:
		return Event{Kind: "aborted", RunID: r.RunID, Reason: r.Error}
	case StatusInterrupted:
		e := r.Error
		if e == "" {
			e = "Agent tool run was interrupted"
		}
		return Event{Kind: "interrupted", RunID: r.RunID, Error: e, Reason: string(r.Reason), ChildStillRunning: r.ChildStillRunning}
	default:
		e := r.Error
		if e == "" {
			e = msgRunFailed
		}
		return Event{Kind: "error", RunID: r.RunID, Error: e}
	}
}

func interruptedMessage(r Reason) string {
	switch r {
	case ReasonNoProgress:
		return "Agent tool run was still running but made no forward progress within the re-attach no-progress budget; the parent gave up."
	case ReasonWindowExceeded:
		return "Agent tool run did not reach a terminal result within the maximum re-attach window; the parent gave up."
	case ReasonNotTailable:
		return "Agent tool run was still running, but live-tail reattachment is not supported in this runtime."
	case ReasonInspectTimeout:
		return "Agent tool run inspection timed out during parent recovery."
	case ReasonInspectFailed:
		return "Agent tool run could not be inspected during parent recovery."
	case ReasonRecoveryDeadline:
		return "Agent tool run recovery deadline exceeded."
	case ReasonBudgetExceeded:
		return "Agent tool run used more tokens than its budget allows; the parent stopped it."
	}
	return "Agent tool run was still running and did not reach a terminal result."
}
