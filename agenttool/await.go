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
// stream to the parent's clients, and records and returns the result. Its
// steps (awaiting's methods) share one awaiting.
func (h *host) await(ctx context.Context, row runRow, child agent.Agent, cr *childRun, lim reattachLimits) (Result, error) {
	release := agent.BaseOf(child).KeepAlive()
	defer release()
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lr := &liveRun{cancel: cancel, done: make(chan struct{})}
	if other, taken := h.claimLive(ctx, row.RunID, lr); taken {
		// Another caller already awaits this run: wait for its result.
		return h.waitLive(ctx, other, row.RunID)
	}
	defer h.releaseLive(row.RunID, lr)
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
	a := &awaiting{h: h, ctx: ctx, runCtx: runCtx, row: row, child: child, cr: cr, lim: lim, lr: lr, ch: ch, cb: cb}
	a.signals = h.newSignalDispatcher(row)
	defer a.signals.close()
	// The no-progress timer is armed once the chunks stored so far were
	// forwarded (FollowStream sends them before it returns): forwarding
	// that backlog is not progress, and must not reset a running budget.
	if lim.maxWindow > 0 {
		window := h.rt.Clock().NewTimer(lim.maxWindow)
		defer window.Stop()
		a.windowC = window.Chan()
	}
	// A re-attach after an interrupted end forwards only what came after
	// it: clients already have the rest, with the same sequences.
	a.after = -1
	if n := len(row.marks); n > 0 {
		a.after = row.marks[n-1] - 1
	}
	// Forwarded child chunks are progress of the parent's turn that waits
	// for the run (chat.CreditProgress); credited outside the child's
	// chat lock, which the follower runs under.
	a.credit = h.progressCrediter(ctx, row)
	defer a.credit.stop()
	// The child's usage reports go up to the parent's turn, and are held
	// against the run's token budget.
	a.usage = newUsageWatch(row.TokenBudget)
	a.stopUsage = a.usage.relay(ctx, row.RunID)
	defer a.stopUsage()
	// The run's turn, and what it waits for (waiting.go): a run that
	// waits for input goes on with a continuation turn, whose stream
	// continues the run's sequence.
	a.streamID, a.waiting, a.changed = ch.runState(cr)
	var err error
	a.stop, err = cb.FollowStream(context.WithoutCancel(runCtx), a.streamID, a.after, a.forward)
	if err != nil {
		if h.rt.Context().Err() != nil {
			return Result{}, agent.ErrClosed // the run resumes with the process
		}
		return h.finish(ctx, row, Result{Status: StatusError, Error: h.runError(row.RunID, err)}, 0)
	}
	if lim.noProgress > 0 {
		a.idleMu.Lock()
		a.idle = h.rt.Clock().NewTimer(lim.noProgress)
		a.idleMu.Unlock()
		defer a.idle.Stop()
		a.idleC = a.idle.Chan()
	}
	if len(a.waiting) > 0 {
		a.waitingAlready()
	}
	// Waiting for the child is an await point of the parent: it takes its
	// other inputs meanwhile (an RPC, another tool call, this run's
	// progress deliveries).
	_ = agent.Await(ctx, a.wait)
	return a.end()
}

// awaiting is what the steps of one await share.
type awaiting struct {
	h           *host
	ctx, runCtx context.Context
	row         runRow
	child       agent.Agent
	cr          *childRun
	lim         reattachLimits
	lr          *liveRun
	ch          *host
	cb          *chat.Base

	signals   *signalDispatcher
	credit    *crediter
	usage     *usageWatch
	stopUsage func()

	idleC, windowC <-chan time.Time
	idleMu         sync.Mutex
	idle           clockwork.Timer
	next           int // under idleMu while the follower runs

	after    int
	streamID string
	waiting  []chat.WaitingCall
	changed  <-chan struct{}
	stop     func()
	gaveUp   Reason
}

// claimLive registers lr as the await of runID, unless another caller
// already awaits it (other).
func (h *host) claimLive(ctx context.Context, runID string, lr *liveRun) (other *liveRun, taken bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if other, ok := h.live[runID]; ok && other != ctx.Value(preKey{}) {
		return other, true
	}
	h.live[runID] = lr
	return nil, false
}

// releaseLive ends lr's registration as the await of runID.
func (h *host) releaseLive(runID string, lr *liveRun) {
	h.mu.Lock()
	if h.live[runID] == lr {
		delete(h.live, runID)
	}
	h.mu.Unlock()
	close(lr.done)
}

// forward sends one chunk of the child's stream to the parent's clients;
// it is progress.
func (a *awaiting) forward(seq int, body string) {
	a.credit.offer()
	a.usage.offer(body)
	a.idleMu.Lock()
	if a.idle != nil {
		a.idle.Reset(a.lim.noProgress)
	}
	a.next = seq + 1
	a.idleMu.Unlock()
	a.h.broadcast(a.row.ParentToolCallID, eventSeq(seq, a.row.marks), Event{Kind: "chunk", RunID: a.row.RunID, Body: body})
	a.signals.offer(body)
}

// onChange follows the run to its next turn and tells the clients when it
// starts or stops waiting for input; waiting stops the no-progress timer.
func (a *awaiting) onChange() {
	h, row := a.h, a.row
	s, w, c := a.ch.runState(a.cr)
	a.changed = c
	a.idleMu.Lock()
	from := a.next - 1
	if a.idle != nil {
		if len(w) > 0 {
			a.idle.Stop()
		} else {
			a.idle.Reset(a.lim.noProgress)
		}
	}
	a.idleMu.Unlock()
	if s != a.streamID {
		a.stop()
		a.streamID = s
		var ferr error
		if a.stop, ferr = a.cb.FollowStream(context.WithoutCancel(a.runCtx), s, from, a.forward); ferr != nil {
			h.b.Logger().Error("agenttool: follow the run's next turn", "run", row.RunID, "err", ferr)
			a.stop = func() {}
		}
	}
	if (len(w) > 0) != (len(a.waiting) > 0) {
		// Starting or ending a wait for input is progress of the
		// parent's turn: its recovery budgets see the run alive.
		a.credit.offer()
		a.idleMu.Lock()
		at := a.next
		a.idleMu.Unlock()
		// An unstored chunk: it reuses the next position.
		h.broadcast(row.ParentToolCallID, eventSeq(at, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: waitingProgress(at, w)})
	}
	a.waiting = w
}

// waitingAlready tells the clients of a run that waits for input already
// (a re-attach, or a quick child).
func (a *awaiting) waitingAlready() {
	a.credit.offer()
	a.idleMu.Lock()
	if a.idle != nil {
		a.idle.Stop()
	}
	at := a.next
	a.idleMu.Unlock()
	a.h.broadcast(a.row.ParentToolCallID, eventSeq(at, a.row.marks), Event{Kind: "chunk", RunID: a.row.RunID, Body: waitingProgress(at, a.waiting)})
}

// wait waits, as an await point of the parent, for the child's end, a
// give-up (no progress, the token budget, the recovery window), a cancel
// or the runtime's shutdown.
func (a *awaiting) wait() error {
	h, ctx, row, ch, cr := a.h, a.ctx, a.row, a.ch, a.cr
	for {
		select {
		case <-a.changed:
			a.onChange()
			continue
		case <-cr.done:
		case <-h.rt.Context().Done():
		case <-a.idleC:
			a.gaveUp = ReasonNoProgress
		case <-a.usage.over:
			a.gaveUp = ReasonBudgetExceeded
			if err := ch.cancelChildRun(context.WithoutCancel(ctx), row.RunID, "agent tool run stopped by the parent: budget-exceeded"); err != nil {
				h.b.Logger().Error("agenttool: tear down child", "run", row.RunID, "err", err)
			}
			select {
			case <-cr.done:
			case <-h.rt.Context().Done():
			}
		case <-a.windowC:
			a.gaveUp = ReasonWindowExceeded
			if err := ch.cancelChildRun(context.WithoutCancel(ctx), row.RunID, "agent tool run given up by parent recovery: window-exceeded"); err != nil {
				h.b.Logger().Error("agenttool: tear down child", "run", row.RunID, "err", err)
			}
			select {
			case <-cr.done:
			case <-h.rt.Context().Done():
			}
		case <-a.runCtx.Done():
			reason := causeText(a.runCtx)
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
}

// end takes the run's end once the wait is over: the child's end when it
// committed the parent's row (the fuse), else the child's record of the
// run; a child that moved to another node is followed there. It forwards
// the chunks committed after the follower stopped and records the end.
func (a *awaiting) end() (Result, error) {
	h, ctx, row, ch, cr, runCtx, usage, gaveUp := a.h, a.ctx, a.row, a.ch, a.cr, a.runCtx, a.usage, a.gaveUp
	if ch.disarm(cr, h) {
		// The child's end claimed the fuse before the parent stopped
		// waiting: it commits the parent's row; take that end.
		select {
		case <-cr.done:
		case <-h.rt.Context().Done():
		}
	}
	a.stop()
	// Signals seen so far (milestone notices) are handled before the end
	// is delivered, so a chat reads them in order.
	a.signals.close()
	if h.rt.Context().Err() != nil {
		return Result{}, agent.ErrClosed
	}
	bg := context.WithoutCancel(ctx)
	end := ch.endOf(cr)
	if won, marks, ok := ch.fused(cr, h); ok {
		res := Result{RunID: row.RunID, AgentType: row.AgentType, Status: StatusCompleted, Summary: end.summary}
		// The child's end transaction recorded its usage with the end.
		a.stopUsage()
		res.Usage = usage.usage()
		return h.finished(bg, row, res, won, marks)
	}
	var insp *Inspection
	var err error
	if end != nil {
		// Recorded by this process: no need to read it back.
		in := end.inspection(row.RunID)
		insp = &in
	} else {
		insp, err = ch.inspectChild(bg, row.RunID)
	}
	if err == nil && insp != nil && insp.Status.Active() && gaveUp == "" && runCtx.Err() == nil {
		childPath := agent.BaseOf(a.child).Path()
		if r := h.remote(childPath); r != nil {
			// The child's shard moved to another node while its turn ran
			// here: the turn ended without recording the run's end, and
			// the new owner recovers it. Follow the run there, as this
			// registration's successor (nothing else awaits it meanwhile
			// but through waitLive, which reads the run's end).
			h.mu.Lock()
			if h.live[row.RunID] == a.lr {
				delete(h.live, row.RunID)
			}
			h.mu.Unlock()
			h.publish(ctx, "agent-tool:child-moved", map[string]any{"runId": row.RunID, "agentType": row.AgentType})
			// The child has a record of the run, so the follower never
			// needs the input to start it again.
			return h.awaitRemote(ctx, row, childPath, insp.RequestID, nil, r)
		}
		if !ch.served() {
			// The child's copy was dropped while its turn ran (its node
			// lost the shard's lease, and may have taken it back): that
			// copy's end was refused by the fence, and the copy the
			// runtime serves now recovers the turn. Follow the run there
			// rather than end it with what the dropped copy saw.
			if res, err, ok := a.followCurrentChild(bg, childPath); ok {
				return res, err
			}
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
	mark := a.next
	if end != nil && a.after < 0 {
		// The end was recorded after the turn's last chunks reached the
		// follower, which was attached until then and had the whole
		// stream.
	} else if chunks, err := a.cb.StreamChunks(bg, a.streamID, a.next-1); err == nil && len(chunks) > 0 {
		for _, c := range chunks {
			h.current().broadcast(row.ParentToolCallID, eventSeq(c.Seq, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: c.Body})
			usage.offer(c.Body)
		}
		mark = chunks[len(chunks)-1].Seq + 1
	}
	a.stopUsage()
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
type crediter struct{ credit *onDemand }

// progressCrediter returns the crediter of a run that a parent's chat turn
// waits for: a bound, awaited run; others get a no-op.
func (h *host) progressCrediter(ctx context.Context, row runRow) *crediter {
	if row.ParentToolCallID == "" || row.det.Detached {
		return nil
	}
	if _, ok := chatOf(h.a); !ok {
		return nil
	}
	return &crediter{credit: newOnDemand(func() {
		if err := chat.CreditProgress(ctx, h.current().a); err != nil && ctx.Err() == nil {
			h.b.Logger().Warn("agenttool: credit parent progress", "run", row.RunID, "err", err)
		}
	})}
}

func (c *crediter) offer() {
	if c == nil {
		return
	}
	c.credit.kick()
}

func (c *crediter) stop() {
	if c == nil {
		return
	}
	c.credit.stop()
}

// followCurrentChild follows the run on the copy of its child that the
// runtime serves now, as this registration's successor, when the copy it
// awaited was dropped with its turn unfinished (TestPostgresRestartDuring-
// FanOut: a run ended "Agent tool run failed" although its child, hydrated
// again on the same node, completed it). ok is false when there is no such
// copy to follow: the run ends with what the dropped copy recorded.
func (a *awaiting) followCurrentChild(ctx context.Context, childPath agent.Path) (Result, error, bool) {
	h, row := a.h, a.row
	child, release, err := h.rt.Acquire(ctx, childPath)
	if err != nil {
		return Result{}, nil, false
	}
	defer release()
	ch, err := hostOf(child)
	if err != nil || ch == a.ch {
		return Result{}, nil, false
	}
	insp, err := ch.inspectChild(ctx, row.RunID)
	if err != nil || insp == nil {
		return Result{}, nil, false
	}
	h.publish(ctx, "agent-tool:child-replaced", map[string]any{"runId": row.RunID, "agentType": row.AgentType})
	if !insp.Status.Active() {
		// The current copy finished the run already: collect its end.
		res, err := h.finish(ctx, row, resultFromInspection(*insp), h.forwardStored(ctx, row, ch.runChunks(ctx, row.RunID)))
		return res, err, true
	}
	p, err := h.pendingOf(ctx, row, child, ch, insp)
	if err != nil {
		return Result{}, nil, false
	}
	h.mu.Lock()
	if h.live[row.RunID] == a.lr {
		delete(h.live, row.RunID)
	}
	h.mu.Unlock()
	res, err := h.await(a.ctx, row, child, p.cr, a.lim)
	return res, err, true
}
