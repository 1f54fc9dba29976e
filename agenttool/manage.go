package agenttool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/store"
)

// CancelAgentTool aborts a run in flight and records it as aborted with
// reason, firing OnAgentToolFinish once. Canceling a finished run, or one
// already canceled, does nothing.
func CancelAgentTool(ctx context.Context, parent agent.Agent, runID, reason string) error {
	h, err := hostOf(parent)
	if err != nil {
		return err
	}
	if reason == "" {
		reason = msgCancelled
	}
	h.mu.Lock()
	lr, live := h.live[runID]
	h.mu.Unlock()
	if live {
		lr.cancel(errors.New(reason))
		// An await point: the run's end is delivered to this instance.
		return agent.Await(ctx, func() error {
			select {
			case <-lr.done:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}
	// A detached run waiting for its slot here leaves the queue; its child
	// never starts (its start checks that the run is still starting).
	unqueued := h.cancelQueued(ctx, runID)
	row, ok, err := h.readRun(ctx, runID)
	if err != nil {
		return fmt.Errorf("agenttool: cancel %s: %w", runID, err)
	}
	if !ok || row.Status.Hard() {
		return nil
	}
	if unqueued {
		// It was waiting for a slot: it has no child, and the end recorded
		// now keeps one from starting.
		_, err = h.finish(ctx, row, Result{Status: StatusAborted, Error: reason}, 0)
		return err
	}
	mark := 0
	if r := h.remote(h.b.Path().Child(row.AgentType, runID)); r != nil {
		// On another node: its owner aborts the run, and the child's end
		// is read from the database before the run's is recorded.
		rc := remoteChild{h: h, path: h.b.Path().Child(row.AgentType, runID), r: r}
		if err := rc.cancelChildRun(ctx, runID, reason); err != nil {
			h.b.Logger().Error("agenttool: cancel remote child", "run", runID, "err", err)
		} else if err := rc.awaitEnd(ctx, runID, cancelWait); err != nil {
			return fmt.Errorf("agenttool: cancel %s: %w", runID, err)
		}
		mark = rc.streamNext(ctx, runID)
	} else if child, err := h.rt.Get(ctx, h.b.Path().Child(row.AgentType, runID)); err == nil {
		if ch, err := hostOf(child); err == nil {
			if err := ch.cancelChildRun(ctx, runID, reason); err != nil {
				h.b.Logger().Error("agenttool: cancel child", "run", runID, "err", err)
			}
			// The child's end is recorded before the run's: whoever reads
			// the run aborted (OnFinish, the terminal frame, a client)
			// finds its child ended too, with its last chunks.
			if err := ch.awaitChildEnd(ctx, runID, cancelWait); err != nil {
				return fmt.Errorf("agenttool: cancel %s: %w", runID, err)
			}
			mark = ch.streamNext(ctx, runID)
		}
	}
	_, err = h.finish(ctx, row, Result{Status: StatusAborted, Error: reason}, mark)
	return err
}

// cancelWait bounds how long CancelAgentTool waits for a canceled child to
// record its end (a tool that ignores its context can hold the turn).
const cancelWait = 10 * time.Second

// awaitChildEnd waits, an await point of the caller's instance, until this
// child has recorded the end of run runID if it is executing it here, or
// until limit has passed.
func (h *host) awaitChildEnd(ctx context.Context, runID string, limit time.Duration) error {
	h.mu.Lock()
	cr, ok := h.child[runID]
	h.mu.Unlock()
	if !ok {
		return nil
	}
	t := h.rt.Clock().NewTimer(limit)
	defer t.Stop()
	return agent.Await(ctx, func() error {
		select {
		case <-cr.done:
		case <-t.Chan():
			h.b.Logger().Warn("agenttool: a canceled child run has not ended", "run", runID, "waited", limit)
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	})
}

// streamNext returns the next sequence of a child run's stream (0 when it
// has none).
func (h *host) streamNext(ctx context.Context, runID string) int {
	chunks := h.runChunks(ctx, runID)
	if len(chunks) == 0 {
		return 0
	}
	return chunks[len(chunks)-1].Seq + 1
}

// runChunks returns the stored chunks of a child run's stream (none when
// it has no stream or it cannot be read).
func (h *host) runChunks(ctx context.Context, runID string) []chat.StreamChunk {
	insp, err := h.inspectChild(ctx, runID)
	if err != nil || insp == nil {
		return nil
	}
	return h.streamChunks(ctx, insp.RequestID)
}

// streamChunks returns the stored chunks of this child's turn requestID
// (none for an empty id).
func (h *host) streamChunks(ctx context.Context, requestID string) []chat.StreamChunk {
	if requestID == "" {
		return nil
	}
	cb, ok := chatOf(h.a)
	if !ok {
		return nil
	}
	chunks, err := cb.StreamChunks(ctx, requestID, -1)
	if err != nil {
		return nil
	}
	return chunks
}

// ClearOptions filter ClearAgentToolRuns; the zero value clears every run.
type ClearOptions struct {
	// Status keeps only runs in one of these statuses.
	Status []Status
	// OlderThan keeps only runs started before it.
	OlderThan time.Time
}

// ClearAgentToolRuns deletes runs from the registry together with their
// children and the children's storage. Runs still in flight are canceled
// first (recorded as aborted, OnAgentToolFinish fires). It returns how many
// runs were deleted.
func ClearAgentToolRuns(ctx context.Context, parent agent.Agent, opts ClearOptions) (int, error) {
	h, err := hostOf(parent)
	if err != nil {
		return 0, err
	}
	runs, err := h.listRuns(ctx, "")
	if err != nil {
		return 0, fmt.Errorf("agenttool: clear: %w", err)
	}
	n := 0
	for _, r := range runs {
		if len(opts.Status) > 0 && !slices.Contains(opts.Status, r.Status) {
			continue
		}
		if !opts.OlderThan.IsZero() && !r.StartedAt.Before(opts.OlderThan) {
			continue
		}
		if r.Status.Active() {
			if err := CancelAgentTool(ctx, parent, r.RunID, "clearing agent tool run"); err != nil {
				h.b.Logger().Error("agenttool: clear: cancel", "run", r.RunID, "err", err)
			}
		}
		if err := h.destroyChild(ctx, r.AgentType, r.RunID); err != nil {
			h.b.Logger().Error("agenttool: clear: delete child", "run", r.RunID, "err", err)
		}
		err := h.b.DB().Update(ctx, func(tx store.Tx) error {
			if _, err := tx.Exec(ctx, `DELETE FROM agent_tool_runs WHERE instance_id = ? AND run_id = ?`, h.iid, r.RunID); err != nil {
				return err
			}
			return h.clearFinishWakeTx(ctx, tx, r.RunID)
		})
		if err != nil {
			return n, fmt.Errorf("agenttool: clear %s: %w", r.RunID, err)
		}
		n++
	}
	h.mu.Lock()
	h.hasRuns = -1
	h.mu.Unlock()
	return n, nil
}

// destroyChild destroys a run's child: here, or through its owner when it
// is on another node, which also drops it from that node's memory.
func (h *host) destroyChild(ctx context.Context, class, runID string) error {
	if r := h.remote(h.b.Path().Child(class, runID)); r != nil {
		return r.DestroyChild(ctx, h.b.Path().Child(class, runID))
	}
	return h.b.DeleteSubAgent(ctx, class, runID)
}

// ListAgentToolRuns returns the parent's registry in start order.
func ListAgentToolRuns(ctx context.Context, parent agent.Agent) ([]Run, error) {
	h, err := hostOf(parent)
	if err != nil {
		return nil, err
	}
	rows, err := h.listRuns(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("agenttool: list runs: %w", err)
	}
	out := make([]Run, len(rows))
	for i, r := range rows {
		out[i] = r.Run
	}
	return out, nil
}

// GetAgentToolRun returns one row of the parent's registry.
func GetAgentToolRun(ctx context.Context, parent agent.Agent, runID string) (Run, bool, error) {
	h, err := hostOf(parent)
	if err != nil {
		return Run{}, false, err
	}
	row, ok, err := h.readRun(ctx, runID)
	if err != nil {
		return Run{}, false, fmt.Errorf("agenttool: get run: %w", err)
	}
	return row.Run, ok, nil
}

// InspectAgentToolRun asks the child of a run for its own record. A nil
// inspection means the child does not know the run yet (never a failure).
func InspectAgentToolRun(ctx context.Context, parent agent.Agent, runID string) (*Inspection, error) {
	h, err := hostOf(parent)
	if err != nil {
		return nil, err
	}
	row, ok, err := h.readRun(ctx, runID)
	if err != nil || !ok {
		return nil, err
	}
	if r := h.remote(h.b.Path().Child(row.AgentType, runID)); r != nil {
		rc := remoteChild{h: h, path: h.b.Path().Child(row.AgentType, runID), r: r}
		in, err := h.remoteInspection(ctx, rc.path, runID)
		if err != nil || in == nil {
			return nil, err
		}
		if in.Milestones, err = rc.milestones(ctx, runID); err != nil {
			return nil, fmt.Errorf("agenttool: inspect remote child run: %w", err)
		}
		return in, nil
	}
	exists, err := h.rt.Exists(ctx, h.b.Path().Child(row.AgentType, runID))
	if err != nil || !exists {
		return nil, err
	}
	child, err := h.rt.Get(ctx, h.b.Path().Child(row.AgentType, runID))
	if err != nil {
		return nil, err
	}
	ch, err := hostOf(child)
	if err != nil {
		return nil, err
	}
	return ch.inspectChild(ctx, runID)
}
