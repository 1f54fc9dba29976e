package agenttool

import (
	"context"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
)

// await follows a started child run to its end: it forwards the child's
// stream to the parent's clients, and records and returns the result.
func (h *host) await(ctx context.Context, row runRow, child agent.Agent, cr *childRun, lim reattachLimits) (Result, error) {
	release := agent.BaseOf(child).KeepAlive()
	defer release()
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lr := &liveRun{cancel: cancel, done: make(chan struct{})}
	h.mu.Lock()
	if other, ok := h.live[row.RunID]; ok && other != ctx.Value(preKey{}) {
		// Another caller already awaits this run: wait for its result.
		h.mu.Unlock()
		return h.waitLive(ctx, other, row.RunID)
	}
	h.live[row.RunID] = lr
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		if h.live[row.RunID] == lr {
			delete(h.live, row.RunID)
		}
		h.mu.Unlock()
		close(lr.done)
	}()
	if ctx.Value(preKey{}) == nil {
		// A re-attach: its row was read before it registered here, and a
		// terminal written meanwhile (a recovery's give-up) moved the
		// run's marks, which number what it forwards.
		if fresh, ok, err := h.readRun(context.WithoutCancel(ctx), row.RunID); err == nil && ok {
			if fresh.Status.Hard() {
				return fresh.Result(), nil
			}
			row.marks = fresh.marks
		}
	}
	ch, _ := hostOf(child)
	if ch != nil {
		// A re-attach's run has no fuse (a fresh dispatch's has one).
		ch.arm(cr, h)
	}

	cb, ok := chatOf(child)
	if !ok {
		return h.finish(ctx, row, Result{Status: StatusError, Error: errNoChat.Error()}, 0)
	}
	next := 0
	signals := h.newSignalDispatcher(row)
	defer signals.close()
	var idleC, windowC <-chan time.Time
	// The no-progress timer is armed once the chunks stored so far were
	// forwarded (FollowStream sends them before it returns): forwarding
	// that backlog is not progress, and must not reset a running budget.
	var idleMu sync.Mutex
	var idle clockwork.Timer
	if lim.maxWindow > 0 {
		window := h.rt.Clock().NewTimer(lim.maxWindow)
		defer window.Stop()
		windowC = window.Chan()
	}
	// A re-attach after an interrupted end forwards only what came after
	// it: clients already have the rest, with the same sequences.
	after := -1
	if n := len(row.marks); n > 0 {
		after = row.marks[n-1] - 1
	}
	// Forwarded child chunks are progress of the parent's turn that waits
	// for the run (chat.CreditProgress); credited outside the child's
	// chat lock, which the follower runs under.
	credit := h.progressCrediter(ctx, row)
	defer credit.stop()
	// The child's usage reports go up to the parent's turn, and are held
	// against the run's token budget.
	usage := newUsageWatch(row.TokenBudget)
	stopUsage := usage.relay(ctx, row.RunID)
	defer stopUsage()
	// The run's turn, and what it waits for (waiting.go): a run that
	// waits for input goes on with a continuation turn, whose stream
	// continues the run's sequence.
	streamID, waiting, changed := ch.runState(cr)
	forward := func(seq int, body string) {
		credit.offer()
		usage.offer(body)
		idleMu.Lock()
		if idle != nil {
			idle.Reset(lim.noProgress)
		}
		next = seq + 1
		idleMu.Unlock()
		h.broadcast(row.ParentToolCallID, eventSeq(seq, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: body})
		signals.offer(body)
	}
	stop, err := cb.FollowStream(context.WithoutCancel(runCtx), streamID, after, forward)
	if err != nil {
		if h.rt.Context().Err() != nil {
			return Result{}, agent.ErrClosed // the run resumes with the process
		}
		return h.finish(ctx, row, Result{Status: StatusError, Error: h.runError(row.RunID, err)}, 0)
	}
	if lim.noProgress > 0 {
		idleMu.Lock()
		idle = h.rt.Clock().NewTimer(lim.noProgress)
		idleMu.Unlock()
		defer idle.Stop()
		idleC = idle.Chan()
	}
	var gaveUp Reason
	// onChange follows the run to its next turn and tells the clients
	// when it starts or stops waiting for input; waiting stops the
	// no-progress timer.
	onChange := func() {
		s, w, c := ch.runState(cr)
		changed = c
		idleMu.Lock()
		from := next - 1
		if idle != nil {
			if len(w) > 0 {
				idle.Stop()
			} else {
				idle.Reset(lim.noProgress)
			}
		}
		idleMu.Unlock()
		if s != streamID {
			stop()
			streamID = s
			var ferr error
			if stop, ferr = cb.FollowStream(context.WithoutCancel(runCtx), s, from, forward); ferr != nil {
				h.b.Logger().Error("agenttool: follow the run's next turn", "run", row.RunID, "err", ferr)
				stop = func() {}
			}
		}
		if (len(w) > 0) != (len(waiting) > 0) {
			// Starting or ending a wait for input is progress of the
			// parent's turn: its recovery budgets see the run alive.
			credit.offer()
			idleMu.Lock()
			at := next
			idleMu.Unlock()
			// An unstored chunk: it reuses the next position.
			h.broadcast(row.ParentToolCallID, eventSeq(at, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: waitingProgress(at, w)})
		}
		waiting = w
	}
	if len(waiting) > 0 {
		// Waiting already (a re-attach, or a quick child).
		credit.offer()
		idleMu.Lock()
		if idle != nil {
			idle.Stop()
		}
		at := next
		idleMu.Unlock()
		h.broadcast(row.ParentToolCallID, eventSeq(at, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: waitingProgress(at, waiting)})
	}
	// Waiting for the child is an await point of the parent: it takes its
	// other inputs meanwhile (an RPC, another tool call, this run's
	// progress deliveries).
	_ = agent.Await(ctx, func() error {
		for {
			select {
			case <-changed:
				onChange()
				continue
			case <-cr.done:
			case <-h.rt.Context().Done():
			case <-idleC:
				gaveUp = ReasonNoProgress
			case <-usage.over:
				gaveUp = ReasonBudgetExceeded
				if err := ch.cancelChildRun(context.WithoutCancel(ctx), row.RunID, "agent tool run stopped by the parent: budget-exceeded"); err != nil {
					h.b.Logger().Error("agenttool: tear down child", "run", row.RunID, "err", err)
				}
				select {
				case <-cr.done:
				case <-h.rt.Context().Done():
				}
			case <-windowC:
				gaveUp = ReasonWindowExceeded
				if err := ch.cancelChildRun(context.WithoutCancel(ctx), row.RunID, "agent tool run given up by parent recovery: window-exceeded"); err != nil {
					h.b.Logger().Error("agenttool: tear down child", "run", row.RunID, "err", err)
				}
				select {
				case <-cr.done:
				case <-h.rt.Context().Done():
				}
			case <-runCtx.Done():
				reason := causeText(runCtx)
				if h.rt.Context().Err() != nil {
					// Shutting down, not canceled: the run resumes with the process.
				} else if err := ch.cancelChildRun(context.WithoutCancel(ctx), row.RunID, reason); err != nil {
					h.b.Logger().Error("agenttool: cancel child", "run", row.RunID, "err", err)
				}
				select {
				case <-cr.done:
				case <-h.rt.Context().Done():
				}
			}
			return nil
		}
	})
	if ch.disarm(cr) {
		// The child's end claimed the fuse before the parent stopped
		// waiting: it commits the parent's row; take that end.
		select {
		case <-cr.done:
		case <-h.rt.Context().Done():
		}
	}
	stop()
	// Signals seen so far (milestone notices) are handled before the end
	// is delivered, so a chat reads them in order.
	signals.close()
	if h.rt.Context().Err() != nil {
		return Result{}, agent.ErrClosed
	}
	bg := context.WithoutCancel(ctx)
	end := ch.endOf(cr)
	if won, marks, ok := ch.fused(cr); ok {
		res := Result{RunID: row.RunID, AgentType: row.AgentType, Status: StatusCompleted, Summary: end.summary}
		// The child's end transaction recorded its usage with the end.
		stopUsage()
		res.Usage = usage.usage()
		return h.finished(bg, row, res, won, marks)
	}
	var insp *Inspection
	if end != nil {
		// Recorded by this process: no need to read it back.
		in := end.inspection(row.RunID)
		insp = &in
	} else {
		insp, err = ch.inspectChild(bg, row.RunID)
	}
	if err == nil && insp != nil && insp.Status.Active() && gaveUp == "" && runCtx.Err() == nil {
		childPath := agent.BaseOf(child).Path()
		if r := h.remote(childPath); r != nil {
			// The child's shard moved to another node while its turn ran
			// here: the turn ended without recording the run's end, and
			// the new owner recovers it. Follow the run there, as this
			// registration's successor (nothing else awaits it meanwhile
			// but through waitLive, which reads the run's end).
			h.mu.Lock()
			if h.live[row.RunID] == lr {
				delete(h.live, row.RunID)
			}
			h.mu.Unlock()
			h.publish(ctx, "agent-tool:child-moved", map[string]any{"runId": row.RunID, "agentType": row.AgentType})
			// The child has a record of the run, so the follower never
			// needs the input to start it again.
			return h.awaitRemote(ctx, row, childPath, insp.RequestID, nil, r)
		}
	}
	var res Result
	switch {
	case err != nil:
		res = Result{Status: StatusError, Error: h.runError(row.RunID, err)}
	case insp == nil:
		res = Result{Status: StatusError, Error: msgRunFailed}
	default:
		res = resultFromInspection(*insp)
	}
	if runCtx.Err() != nil && res.Status != StatusCompleted {
		res = Result{Status: StatusAborted, Error: causeText(runCtx)}
	}
	if gaveUp != "" && res.Status != StatusCompleted {
		// The parent stops waiting; the run stays repairable.
		res = Result{Status: StatusInterrupted, Error: interruptedMessage(gaveUp), Reason: gaveUp,
			ChildStillRunning: ptr(gaveUp == ReasonNoProgress)}
		if gaveUp == ReasonBudgetExceeded {
			res.Error = usage.budgetError()
		}
		h.publish(ctx, "recovery:gave-up", map[string]any{"runId": row.RunID, "agentType": row.AgentType, "reason": string(gaveUp)})
	}
	// Chunks committed after the follower stopped (a give-up, a cancel)
	// are forwarded before the end, which is numbered after them: a client
	// never has a gap below the terminal event.
	mark := next
	if end != nil && after < 0 {
		// The end was recorded after the turn's last chunks reached the
		// follower, which was attached until then and had the whole
		// stream.
	} else if chunks, err := cb.StreamChunks(bg, streamID, next-1); err == nil && len(chunks) > 0 {
		for _, c := range chunks {
			h.current().broadcast(row.ParentToolCallID, eventSeq(c.Seq, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: c.Body})
			usage.offer(c.Body)
		}
		mark = chunks[len(chunks)-1].Seq + 1
	}
	stopUsage()
	res.Usage = usage.usage()
	return h.finish(bg, row, res, mark)
}

// runError is the error text a failed run records and shows (to the
// parent's model, to clients in agent-tool events) for an internal error:
// its public message, or an internal error id with err logged
// (agent.Runtime.ClientMessage).
func (h *host) runError(runID string, err error) string {
	return h.rt.ClientMessage(err, "agent", h.b.Path().String(), "run", runID)
}

// crediter credits the parent's chat turn for a run's forwarded chunks,
// from its own goroutine.
type crediter struct {
	kick chan struct{}
	done chan struct{}
}

// progressCrediter returns the crediter of a run that a parent's chat turn
// waits for: a bound, awaited run; others get a no-op.
func (h *host) progressCrediter(ctx context.Context, row runRow) *crediter {
	if row.ParentToolCallID == "" || row.det.Detached {
		return nil
	}
	if _, ok := chatOf(h.a); !ok {
		return nil
	}
	cr := &crediter{kick: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(cr.done)
		for range cr.kick {
			if err := chat.CreditProgress(ctx, h.current().a); err != nil && ctx.Err() == nil {
				h.b.Logger().Warn("agenttool: credit parent progress", "run", row.RunID, "err", err)
			}
		}
	}()
	return cr
}

func (c *crediter) offer() {
	if c == nil {
		return
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *crediter) stop() {
	if c == nil {
		return
	}
	close(c.kick)
	<-c.done
}
