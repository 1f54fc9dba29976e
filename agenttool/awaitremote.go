package agenttool

import (
	"context"
	"encoding/json"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
)

// missingPolls is how many polls in a row a follower finds no record of
// its run in the child before it acts: a start is answered only once the
// child's record is committed, so a record that is missing was never
// written or was deleted since.
const missingPolls = 5

// awaitRemote follows a run whose child is on another node: it forwards
// the child's committed chunks to the parent's clients and records the
// run's end once the child's record of it has one. A cancel of the run
// (its context) asks the child's owner to abort it.
//
// It never waits forever on a child with no record of the run: after
// missingPolls polls without one, a canceled run ends aborted; a run with
// its input (a dispatch) is started again through the child's current
// owner (starting is idempotent) and followed under the turn id it
// answers; one without its input (a recovery) ends interrupted once the
// record has been missing for the no-progress budget.
func (h *host) awaitRemote(ctx context.Context, row runRow, child agent.Path, streamID string, input json.RawMessage, r Remote) (Result, error) {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lr := &liveRun{cancel: cancel, done: make(chan struct{})}
	if other, taken := h.claimLive(ctx, row.RunID, lr); taken {
		return h.waitLive(ctx, other, row.RunID)
	}
	defer func() {
		h.mu.Lock()
		delete(h.live, row.RunID)
		h.mu.Unlock()
		close(lr.done)
	}()
	bg := context.WithoutCancel(ctx)
	f := &remoteFollow{h: h, bg: bg, row: row, child: child, streamID: streamID, after: -1}
	if n := len(row.marks); n > 0 {
		f.after = row.marks[n-1] - 1
	}
	// The child's progress and milestones are chunks of its stream: the
	// parent's OnProgress and milestone notices see them as they are
	// forwarded, in stream order, each once per follower.
	f.signals = h.newSignalDispatcher(row)
	defer f.signals.close()
	f.credit = h.progressCrediter(ctx, row)
	defer f.credit.stop()
	// The child's usage reports (chunks of its stream) go up to the
	// parent's turn, and are held against the run's token budget, as on
	// one node.
	usage := newUsageWatch(row.TokenBudget)
	f.usage = usage
	stopUsage := usage.relay(ctx, row.RunID)
	defer stopUsage()
	forward, follow := f.forward, f.follow
	wake := h.remoteWake(child)
	defer wake.close()
	clock := h.rt.Clock()
	var insp *Inspection
	var ended *Result // the run's end when the child has no record of it
	canceled := false
	var gaveUp Reason // the parent stopped the run: its token budget
	over := usage.over
	missing := 0 // polls in a row that found no record
	var missingSince time.Time
	lim := h.reattachLimits()
	err := agent.Await(ctx, func() error {
		for {
			forward()
			in, err := h.remoteInspection(bg, child, row.RunID)
			if err == nil && in != nil && in.CompletedAt != nil {
				insp = in
				if in.RequestID != "" && in.RequestID != f.streamID {
					follow(in) // answered, and ended before this poll
				}
				forward() // the chunks committed with the end
				return nil
			}
			switch {
			case err != nil:
			case in != nil:
				missing = 0
				follow(in)
			case missing == 0:
				missingSince = clock.Now()
			case missing >= missingPolls && gaveUp != "":
				ended = &Result{Status: StatusAborted}
				return nil
			case missing >= missingPolls && canceled:
				ended = &Result{Status: StatusAborted, Error: causeText(runCtx)}
				return nil
			case missing >= missingPolls && input != nil:
				missing = 0
				h.b.Logger().Warn("agenttool: remote child has no record of the run: starting it again", "run", row.RunID)
				id, err := r.StartChild(runCtx, RemoteStart{ParentPath: h.b.Path(), Class: row.AgentType, RunID: row.RunID, Input: input})
				if err != nil {
					h.b.Logger().Error("agenttool: start remote child again", "run", row.RunID, "err", err)
				} else if id != f.streamID {
					// The turn the parent was told of never committed: the
					// run is this one (its chunks are all new).
					f.streamID, f.after = id, -1
				}
				continue
			case missing >= missingPolls && lim.noProgress > 0 && clock.Since(missingSince) >= lim.noProgress:
				ended = &Result{Status: StatusInterrupted, Reason: ReasonNoProgress, Error: interruptedMessage(ReasonNoProgress)}
				return nil
			}
			tick := func() {
				if err == nil && in == nil {
					missing++
				}
			}
			select {
			case <-h.rt.Context().Done():
				return agent.ErrClosed
			case <-runCtx.Done():
				if !canceled {
					canceled = true
					if err := r.CancelChild(bg, RemoteCancel{Child: child, RunID: row.RunID, Reason: causeText(runCtx)}); err != nil {
						h.b.Logger().Error("agenttool: cancel remote child", "run", row.RunID, "err", err)
					}
				}
				select {
				case <-wake.hint:
				case <-wake.tick.Chan():
					tick()
				case <-h.rt.Context().Done():
					return agent.ErrClosed
				}
			case <-over:
				over = nil
				gaveUp = ReasonBudgetExceeded
				if err := r.CancelChild(bg, RemoteCancel{Child: child, RunID: row.RunID, Reason: "agent tool run stopped by the parent: budget-exceeded"}); err != nil {
					h.b.Logger().Error("agenttool: tear down remote child", "run", row.RunID, "err", err)
				}
			case <-wake.hint:
			case <-wake.tick.Chan():
				tick()
			}
		}
	})
	if err != nil {
		return Result{}, err // shutting down: the run resumes with the process
	}
	// Signals seen so far (milestone notices) are handled before the end
	// is delivered, so a chat reads them in order.
	f.signals.close()
	res := h.remoteResult(ctx, runCtx, row, insp, ended, gaveUp, usage)
	stopUsage()
	res.Usage = usage.usage()
	return h.finish(bg, row, res, f.after+1)
}

// remoteResult is the end of a remote run: the one decided without the
// child's record (ended), else the child's record (insp), aborted when the
// run was canceled, interrupted when the parent stopped it (gaveUp).
func (h *host) remoteResult(ctx, runCtx context.Context, row runRow, insp *Inspection, ended *Result, gaveUp Reason, usage *usageWatch) Result {
	var res Result
	if ended != nil {
		res = *ended
	} else if res = resultFromInspection(*insp); runCtx.Err() != nil && res.Status != StatusCompleted {
		res = Result{Status: StatusAborted, Error: causeText(runCtx)}
	}
	if gaveUp != "" && res.Status != StatusCompleted {
		// As on one node: the run stopped by its budget is interrupted,
		// not retryable.
		res = Result{Status: StatusInterrupted, Error: usage.budgetError(), Reason: gaveUp, ChildStillRunning: ptr(false)}
		h.publish(ctx, "recovery:gave-up", map[string]any{"runId": row.RunID, "agentType": row.AgentType, "reason": string(gaveUp)})
	}
	return res
}

// remoteFollow forwards a remote run's committed chunks to the parent's
// clients: the run's turn (streamID) after the last chunk forwarded
// (after).
type remoteFollow struct {
	h        *host
	bg       context.Context
	row      runRow
	child    agent.Path
	streamID string
	after    int
	waiting  []chat.WaitingCall
	signals  *signalDispatcher
	credit   *crediter
	usage    *usageWatch
}

// forward sends the chunks committed since the last one forwarded.
func (f *remoteFollow) forward() {
	h, row := f.h, f.row
	chunks, err := chat.StoredChunks(f.bg, h.rt.DB(), f.child, f.streamID, f.after)
	if err != nil {
		return
	}
	for _, c := range chunks {
		f.credit.offer()
		f.usage.offer(c.Body)
		h.current().broadcast(row.ParentToolCallID, eventSeq(c.Seq, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: c.Body})
		f.signals.offer(c.Body)
		f.after = c.Seq
	}
}

// setWaiting records what the run waits for (w). A run that waits for
// input goes on with a continuation turn, which the child records as the
// run's turn (its stream continues the run's sequence), and the child
// records what it waits for: the clients are told when it starts or stops
// waiting, as on one node.
func (f *remoteFollow) setWaiting(w []chat.WaitingCall) {
	h, row := f.h, f.row
	if (len(w) > 0) != (len(f.waiting) > 0) {
		f.forward() // what came before the change
		f.credit.offer()
		// An unstored chunk: it reuses the next position.
		h.current().broadcast(row.ParentToolCallID, eventSeq(f.after+1, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: waitingProgress(f.after+1, w)})
	}
	f.waiting = w
}

// follow follows the child's record of the run (in): to its continuation
// turn once the input it waited for was answered, and what it waits for.
func (f *remoteFollow) follow(in *Inspection) {
	if in.RequestID != "" && in.RequestID != f.streamID {
		// Answered: the input was received, and the run goes on
		// with the continuation.
		f.setWaiting(nil)
		f.forward() // the rest of the turn that ended waiting
		f.streamID = in.RequestID
		f.forward()
	}
	f.setWaiting(in.Waiting)
}
