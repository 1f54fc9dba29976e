package agenttool

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/store"
)

// track registers a run and, unless it is already finished, a watcher that
// finalizes it when its turn ends.
func (h *host) track(runID, streamID string, finished bool) *childRun {
	h.mu.Lock()
	if cr, ok := h.child[runID]; ok {
		h.mu.Unlock()
		return cr
	}
	cr := &childRun{runID: runID, streamID: streamID, done: make(chan struct{}), changed: make(chan struct{}), abort: make(chan struct{})}
	if finished {
		h.mu.Unlock()
		close(cr.done)
		return cr
	}
	h.child[runID] = cr
	h.mu.Unlock()
	h.watchRun(cr)
	return cr
}

// watchRun starts the watcher of a registered run.
func (h *host) watchRun(cr *childRun) {
	release := h.b.KeepAlive()
	h.rt.Go(func(ctx context.Context) {
		defer release()
		stop := h.hintChunks(ctx, cr)
		h.watch(ctx, cr)
		stop()
		if ctx.Err() == nil {
			h.hintParent() // the run's end is committed
		}
	})
}

// hintChunks hints a parent on another node after each committed chunk of
// the run's turn (see Hints), until stop is called.
func (h *host) hintChunks(ctx context.Context, cr *childRun) (stop func()) {
	hs := h.hints()
	p := h.b.Path().Parent()
	if hs == nil || h.rt.Placement() == nil || p == nil || h.rt.Owns(p) {
		return func() {}
	}
	cb, ok := chatOf(h.a)
	if !ok {
		return func() {}
	}
	self := h.b.Path()
	// Each turn of the run in turn: a wait for input goes on with a
	// continuation turn (waiting.go), whose chunks are hinted too.
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		followed, stop := "", func() {}
		defer func() { stop() }()
		for {
			streamID, _, changed := h.runState(cr)
			if streamID != followed {
				stop()
				followed = streamID
				// Hint never blocks, as FollowStream's callback must not.
				var err error
				if stop, err = cb.FollowStream(ctx, streamID, -1, func(int, string) { hs.Hint(self) }); err != nil {
					stop = func() {}
				}
			}
			select {
			case <-changed:
			case <-quit:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// watch waits for the run's turn and records its end.
func (h *host) watch(ctx context.Context, cr *childRun) {
	if h.endOf(cr) != nil {
		// The turn's end transaction recorded the run's end already.
		h.closeRun(cr)
		return
	}
	cb, _ := chatOf(h.a)
	res, err := h.waitRunTurns(ctx, cb, cr)
	if ctx.Err() != nil {
		return // shutting down: the run resumes with the process
	}
	if h.endOf(cr) != nil {
		// The turn's end transaction recorded the run's end.
		h.closeRun(cr)
		return
	}
	status, errText := StatusCompleted, ""
	h.mu.Lock()
	canceled := cr.reason
	h.mu.Unlock()
	switch {
	case err != nil && canceled != "":
		// The turn was canceled here while still queued; the chat may not
		// have recorded its end yet (WaitTurn answers "not finished").
		status, errText = StatusAborted, canceled
	case err != nil:
		status, errText = StatusError, msgStaleChild
	case res.Outcome == chat.OutcomeAborted:
		status = StatusAborted
		h.mu.Lock()
		errText = cr.reason
		h.mu.Unlock()
		if errText == "" {
			errText = msgCancelled
		}
	case res.Outcome == chat.OutcomeSkipped:
		status, errText = StatusError, msgSkipped
	case res.Exhausted != "":
		// The child's own recovery gave up on its turn (a budget spent): a
		// hard failure, not an interruption a retry could repair.
		status, errText = StatusError, fmt.Sprintf("%s (%s: %s)", msgRecoveryExhausted, res.Exhausted, res.Error)
	case res.Outcome == chat.OutcomeError:
		status, errText = StatusError, res.Error
		if errText == "" {
			errText = "Agent tool run failed during streaming."
		}
	}
	var output json.RawMessage
	summary := ""
	if status == StatusCompleted {
		if p, ok := h.a.(OutputProvider); ok {
			var out any
			oerr := agent.Enter(ctx, h.a, func(ctx context.Context) error {
				var err error
				out, err = p.AgentToolOutput(ctx, cr.runID)
				return err
			})
			if oerr != nil {
				status, errText = StatusError, h.runError(cr.runID, fmt.Errorf("agent tool output: %w", oerr))
			} else if out != nil {
				output, _ = json.Marshal(out)
			}
		}
		if p, ok := h.a.(SummaryProvider); ok {
			_ = agent.Enter(ctx, h.a, func(ctx context.Context) error {
				summary = p.AgentToolSummary(ctx, cr.runID, output)
				return nil
			})
		} else {
			summary = res.Text()
			if summary == "" && output != nil {
				var s string
				if json.Unmarshal(output, &s) == nil {
					summary = s
				} else {
					summary = string(output)
				}
			}
		}
	}
	now := h.rt.Clock().Now().UnixMilli()
	var wrote bool
	err = h.b.DB().Update(ctx, func(tx store.Tx) error {
		r, err := tx.Exec(ctx, `UPDATE agent_tool_child_runs SET status = ?, summary = ?, output_json = ?, error_message = ?, completed_at = ?
			WHERE instance_id = ? AND run_id = ? AND completed_at IS NULL`,
			status, nullStr(summary), nullStr(string(output)), nullStr(errText), now, h.iid, cr.runID)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		wrote = n == 1
		return err
	})
	if err != nil && ctx.Err() == nil {
		h.b.Logger().Error("agenttool: finalize child run", "run", cr.runID, "err", err)
	}
	if err == nil && wrote {
		h.mu.Lock()
		cr.ended = &childEnd{status: status, summary: summary, output: output, errText: errText}
		h.mu.Unlock()
	}
	h.closeRun(cr)
}

// closeRun ends a run's watch: the run stays known, its done closed.
func (h *host) closeRun(cr *childRun) {
	h.mu.Lock()
	// The ended run stays known (its done closed): a follower that read
	// the run as running just before this end was recorded must find this
	// watcher's end, not start a second watcher that would run the output
	// hooks again. A child is named by its run id, so this is one entry.
	if cr.emitter != nil && cr.emitter.timer != nil {
		cr.emitter.timer.Stop()
	}
	h.mu.Unlock()
	close(cr.done)
}
