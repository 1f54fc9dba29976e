package agenttool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
)

// Recovery budgets.
const (
	// DefaultReattachNoProgressTimeout is how long a re-attached parent
	// waits for the next chunk of a child before it gives up (no-progress),
	// and how long a recovery waits for the inspection of a run it could
	// not classify in time before it ends the run interrupted
	// (inspect-timeout, recovery-deadline).
	DefaultReattachNoProgressTimeout = 2 * time.Minute
	// recoveryInspectTimeout bounds one child inspection during recovery.
	recoveryInspectTimeout = 2 * time.Second
	// recoveryDeadline bounds the classification pass of a recovery.
	recoveryDeadline = 5 * time.Second
)

// ReattachNoProgressTimeouter overrides the re-attach no-progress timeout
// (the seed's agentToolReattachNoProgressTimeoutMs): zero or negative means
// do not wait (collect finished children only).
type ReattachNoProgressTimeouter interface {
	AgentToolReattachNoProgressTimeout() time.Duration
}

// ReattachMaxWindower sets a ceiling on one re-attach (the seed's
// agentToolReattachMaxWindowMs); past it the child is destroyed and the run
// interrupted (window-exceeded). Zero or negative means no ceiling, the
// default.
type ReattachMaxWindower interface {
	AgentToolReattachMaxWindow() time.Duration
}

// reattachLimits bound a re-attach: silence and total time; zero means
// unlimited.
type reattachLimits struct {
	noProgress  time.Duration
	maxWindow   time.Duration
	collectOnly bool // noProgress <= 0: do not wait at all
}

func (h *host) reattachLimits() reattachLimits {
	l := reattachLimits{noProgress: DefaultReattachNoProgressTimeout}
	if o, ok := h.a.(ReattachNoProgressTimeouter); ok {
		l.noProgress = o.AgentToolReattachNoProgressTimeout()
		if l.noProgress <= 0 {
			l.noProgress, l.collectOnly = 0, true
		}
	}
	if o, ok := h.a.(ReattachMaxWindower); ok && o.AgentToolReattachMaxWindow() > 0 {
		l.maxWindow = o.AgentToolReattachMaxWindow()
	}
	return l
}

// LayerStarted resumes the parent's unfinished runs after a restart or an
// eviction, in the background so start-up never waits for it: awaited runs
// that were in flight are recovered (collected when their child already
// finished, re-attached when it still runs), awaited runs whose end was
// recorded but not delivered to OnAgentToolFinish are delivered, detached
// runs go back to their reconcile.
func (h *host) LayerStarted(ctx context.Context) {
	h.mu.Lock()
	// A new instance has no detached runs but those its OnStart
	// dispatched, which follow themselves.
	skip := h.fresh
	h.mu.Unlock()
	if !skip {
		h.resumeDetached(ctx)
	}
	if undelivered := h.undelivered; len(undelivered) > 0 {
		h.undelivered = nil
		release := h.b.KeepAlive()
		h.rt.Go(func(ctx context.Context) {
			defer release()
			h.redeliverFinishes(agent.WithAgent(ctx, h.a), undelivered)
		})
	}
	rows := h.stale
	h.stale = nil
	if len(rows) == 0 {
		return
	}
	release := h.b.KeepAlive()
	h.rt.Go(func(ctx context.Context) {
		defer release()
		h.recover(agent.WithAgent(ctx, h.a), rows)
	})
}

// recoveryLookahead is how many rows ahead a parent's recovery inspects,
// and how many finished runs it collects at once.
const recoveryLookahead = 16

// recover classifies each run within a deadline (each inspection with its
// own timeout), finalizes the runs whose child finished without running
// anything again, and re-attaches the others in parallel. A run it could
// not classify in time (its inspection over its timeout, or past the
// deadline) is not ended for that: it goes on being classified in the
// background (deferred), so that it ends once, with what its child did.
func (h *host) recover(ctx context.Context, rows []runRow) {
	rows, queued := splitQueued(rows)
	clock := h.rt.Clock()
	start := clock.Now()
	h.publish(ctx, "recovery:begin", map[string]any{"runCount": len(rows) + len(queued), "totalTimeoutMs": recoveryDeadline.Milliseconds()})
	deadline := start.Add(recoveryDeadline)
	var reattach []pendingReattach
	type waiting struct {
		row     runRow
		started chan struct{}
	}
	var unstarted []waiting
	var deferred []deferredRow
	// The classification is in order, each inspection within what is
	// left of the deadline, as the reference's; but the inspections of the
	// next recoveryLookahead rows (each wakes a child) already run, and a
	// finished run is collected (its terminal write, its finish hook) while
	// the next rows are classified.
	answers := make([]chan inspection, len(rows))
	prefetched := 0
	prefetch := func(upto int) {
		for ; prefetched < min(upto, len(rows)); prefetched++ {
			answers[prefetched] = h.startInspection(agent.Unheld(ctx), rows[prefetched])
		}
	}
	var collecting sync.WaitGroup
	collectSem := make(chan struct{}, recoveryLookahead)
	collect := func(row runRow, res Result, ch *host, requestID string) {
		collectSem <- struct{}{}
		collecting.Add(1)
		go func() {
			defer collecting.Done()
			defer func() { <-collectSem }()
			h.recoveredRow(ctx, row, start, res, h.forwardStored(ctx, row, ch.streamChunks(ctx, requestID)))
		}()
	}
	var remote []remotePending
	for i, row := range rows {
		h.mu.Lock()
		_, live := h.live[row.RunID]
		h.mu.Unlock()
		if live {
			continue // re-dispatched meanwhile: its caller follows it
		}
		if r := h.remote(h.b.Path().Child(row.AgentType, row.RunID)); r != nil {
			// The child is on another node: read its record of the run.
			insp, err := h.remoteInspection(ctx, h.b.Path().Child(row.AgentType, row.RunID), row.RunID)
			switch {
			case err != nil:
				h.recoveredRow(ctx, row, start, Result{Status: StatusInterrupted, Reason: ReasonInspectFailed,
					Error: interruptedMessage(ReasonInspectFailed)}, 0)
			case insp != nil && insp.CompletedAt != nil:
				h.recoveredRow(ctx, row, start, resultFromInspection(*insp), h.forwardStoredRemote(ctx, row, insp.RequestID))
			case insp == nil:
				unstarted = append(unstarted, waiting{row, h.awaitStart(row.RunID)})
			default:
				// Executing already: it holds a slot before the runs that
				// were waiting take theirs.
				remote = append(remote, remotePending{row, insp.RequestID, r, h.forceSlot()})
			}
			continue
		}
		remaining := deadline.Sub(clock.Now())
		if remaining <= 0 {
			// Past the deadline: classified later, its inspection started
			// then (at most recoveryLookahead at a time) unless it is.
			h.publish(ctx, "recovery:deadline", map[string]any{"runId": row.RunID, "agentType": row.AgentType,
				"elapsedMs": clock.Since(start).Milliseconds()})
			deferred = append(deferred, deferredRow{row: row, answer: answers[i], reason: ReasonRecoveryDeadline})
			continue
		}
		prefetch(i + 1 + recoveryLookahead)
		child, ch, insp, err := h.awaitInspection(ctx, answers[i], min(remaining, recoveryInspectTimeout))
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			// Still inspecting: its answer is waited for in the background.
			deferred = append(deferred, deferredRow{row: row, answer: answers[i], reason: ReasonInspectTimeout})
		case err != nil:
			h.recoveredRow(ctx, row, start, Result{Status: StatusInterrupted, Reason: ReasonInspectFailed,
				Error: interruptedMessage(ReasonInspectFailed)}, 0)
		case insp != nil && insp.Status != childRunning:
			// Finished while the parent was away: collect it.
			collect(row, resultFromInspection(*insp), ch, insp.RequestID)
		case insp == nil:
			// The parent died before the child recorded the run: there is
			// no input to start it with. A re-dispatch of the same run id
			// (a recovered chat turn repeating its tool call) starts it;
			// wait for that within the no-progress budget.
			unstarted = append(unstarted, waiting{row, h.awaitStart(row.RunID)})
		default:
			p, err := h.pendingOf(ctx, row, child, ch, insp)
			if err != nil {
				h.recoveredRow(ctx, row, start, Result{Status: StatusError, Error: h.runError(row.RunID, err)}, 0)
				continue
			}
			// Executing already: it holds a slot before the runs that
			// were waiting take theirs.
			p.slot = h.forceSlot()
			reattach = append(reattach, p)
		}
	}
	collecting.Wait()
	var wg sync.WaitGroup
	lim := h.reattachLimits()
	for _, w := range unstarted {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.awaitRedispatch(ctx, w.row, w.started, lim, start)
		}()
	}
	h.requeue(ctx, queued, &wg)
	for _, p := range remote {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.reattachRemote(ctx, p, start)
		}()
	}
	for _, p := range reattach {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.reattachRecovered(ctx, p, lim, start)
		}()
	}
	inspecting := make(chan struct{}, recoveryLookahead)
	for _, d := range deferred {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.settleDeferred(ctx, d, inspecting, lim, start)
		}()
	}
	wg.Wait()
	h.publish(ctx, "recovery:complete", map[string]any{"runCount": len(rows) + len(queued), "elapsedMs": clock.Since(start).Milliseconds()})
}

// splitQueued takes out of rows the runs that were waiting for a slot:
// they wait again and start with the input of their dispatch, and are not
// inspected (a local child's record of a run is written with the run's
// start, and a start is idempotent).
func splitQueued(rows []runRow) (rest, queued []runRow) {
	rest = slices.DeleteFunc(slices.Clone(rows), func(r runRow) bool {
		if r.Status == StatusStarting && r.queued != nil {
			queued = append(queued, r)
			return true
		}
		return false
	})
	return rest, queued
}

// requeue puts the recovered runs that were waiting for a slot in line
// again, one after the other in the order of their dispatch, each followed
// in a goroutine of wg.
func (h *host) requeue(ctx context.Context, queued []runRow, wg *sync.WaitGroup) {
	for _, row := range queued {
		inLine := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.resumeQueued(ctx, row, func() { close(inLine) })
		}()
		select {
		case <-inLine:
		case <-ctx.Done():
		}
	}
}

// remotePending is a recovered run whose child, on another node, has a
// record of it and has not finished it.
type remotePending struct {
	row      runRow
	streamID string
	r        Remote
	slot     *runSlot // held while the run is followed (nil: taken then)
}

// reattachRemote follows a recovered run whose child is on another node
// (p) to its end, starting the child's turn first if it was recorded but
// not started.
func (h *host) reattachRemote(ctx context.Context, p remotePending, start time.Time) {
	defer p.slot.release()
	clock := h.rt.Clock()
	child := h.b.Path().Child(p.row.AgentType, p.row.RunID)
	streamID := p.streamID
	if streamID == "" {
		// Recorded by the child but its turn not started: start it
		// with the input it was recorded with.
		id, err := p.r.StartChild(ctx, RemoteStart{ParentPath: h.b.Path(), Class: p.row.AgentType, RunID: p.row.RunID})
		if err != nil {
			h.recoveredRow(ctx, p.row, start, Result{Status: StatusError, Error: h.runError(p.row.RunID, err)}, 0)
			return
		}
		streamID = id
	}
	if p.row.Status == StatusStarting {
		if err := h.markRunning(ctx, p.row.RunID); err != nil {
			h.b.Logger().Error("agenttool: recover run", "run", p.row.RunID, "err", err)
		} else {
			p.row.Status = StatusRunning
		}
	}
	h.publish(ctx, "recovery:reattach", map[string]any{"runId": p.row.RunID, "agentType": p.row.AgentType})
	res, err := h.awaitRemote(ctx, p.row, child, streamID, nil, p.r)
	if err != nil {
		return
	}
	h.publish(ctx, "recovery:row", map[string]any{"runId": p.row.RunID, "agentType": p.row.AgentType,
		"status": string(res.Status), "reason": string(res.Reason), "error": res.Error,
		"elapsedMs": clock.Since(start).Milliseconds()})
}

// pendingReattach is a recovered run whose child still runs it, for the
// recovery to follow.
type pendingReattach struct {
	row   runRow
	child agent.Agent
	ch    *host
	cr    *childRun
	slot  *runSlot // held while the run is followed (nil: taken then)
}

// pendingOf returns the re-attach of a run whose child records it as
// running (insp): a run recorded but whose turn never started is started
// first, with the input it was recorded with.
func (h *host) pendingOf(ctx context.Context, row runRow, child agent.Agent, ch *host, insp *Inspection) (pendingReattach, error) {
	if insp.RequestID == "" {
		cr, _, err := ch.startChildRun(ctx, row.RunID, nil, ChildRequest{RunID: row.RunID, AgentType: row.AgentType, ParentPath: h.b.Path()}, childStart{})
		if err != nil {
			return pendingReattach{}, err
		}
		return pendingReattach{row: row, child: child, ch: ch, cr: cr}, nil
	}
	return pendingReattach{row: row, child: child, ch: ch, cr: ch.track(row.RunID, insp.RequestID, false)}, nil
}

// reattachRecovered follows a recovered run whose child still runs it to
// its end, within the re-attach limits.
func (h *host) reattachRecovered(ctx context.Context, p pendingReattach, lim reattachLimits, start time.Time) {
	if p.slot == nil {
		p.slot = h.forceSlot()
	}
	defer p.slot.release()
	if p.row.Status == StatusStarting {
		// The dispatch died after starting the child but before
		// recording it running: the child has its turn now.
		if err := h.markRunning(ctx, p.row.RunID); err != nil {
			h.b.Logger().Error("agenttool: recover run", "run", p.row.RunID, "err", err)
		} else {
			p.row.Status = StatusRunning
		}
	}
	h.publish(ctx, "recovery:reattach", map[string]any{"runId": p.row.RunID, "agentType": p.row.AgentType,
		"budgetMs": lim.noProgress.Milliseconds()})
	var res Result
	var err error
	if lim.collectOnly {
		release, ok := h.claimRun(ctx, p.row)
		if !ok {
			return // followed by a dispatch meanwhile
		}
		p.row.inFlight = true
		res, err = h.finish(ctx, p.row, Result{Status: StatusInterrupted, Reason: ReasonNoProgress,
			Error: interruptedMessage(ReasonNoProgress), ChildStillRunning: ptr(true)}, h.forwardStored(ctx, p.row, p.ch.runChunks(ctx, p.row.RunID)))
		release()
	} else {
		res, err = h.await(ctx, p.row, p.child, p.cr, lim)
	}
	if err != nil {
		return
	}
	h.publish(ctx, "recovery:row", map[string]any{"runId": p.row.RunID, "agentType": p.row.AgentType,
		"status": string(res.Status), "reason": string(res.Reason), "error": res.Error,
		"elapsedMs": h.rt.Clock().Since(start).Milliseconds()})
}

// awaitRedispatch waits, within the no-progress budget, for a re-dispatch
// of a recovered run whose child never recorded it (started is closed by
// it, which then follows the run); without one the run is interrupted.
func (h *host) awaitRedispatch(ctx context.Context, row runRow, started chan struct{}, lim reattachLimits, start time.Time) {
	var timeout <-chan time.Time
	if lim.noProgress > 0 {
		t := h.rt.Clock().NewTimer(lim.noProgress)
		defer t.Stop()
		timeout = t.Chan()
	}
	select {
	case <-started:
		return // the re-dispatch follows it to its end
	case <-timeout:
	case <-ctx.Done():
		return
	}
	h.mu.Lock()
	delete(h.unstarted, row.RunID)
	h.mu.Unlock()
	h.recoveredRow(ctx, row, start, Result{Status: StatusInterrupted, Reason: ReasonNoProgress,
		Error: interruptedMessage(ReasonNoProgress), ChildStillRunning: ptr(true)}, 0)
}

// deferredRow is a run the classification pass could not classify in
// time: reason is why (inspect-timeout, recovery-deadline), answer its
// inspection if one was started.
type deferredRow struct {
	row    runRow
	answer chan inspection
	reason Reason
}

// settleDeferred classifies a deferred run once its inspection answers
// and goes on as the classification pass would have (collect, re-attach,
// wait for a re-dispatch). The run stays in flight meanwhile: a re-dispatch
// of it follows it (and the recovery then leaves it alone), and its one
// end is what its child did. Only an inspection that does not answer
// within the no-progress budget ends the run, interrupted with the
// deferral's reason; a parent that does not wait (a no-progress budget of
// zero or less) ends it so at once, as the reference does. inspecting
// bounds the inspections started here.
func (h *host) settleDeferred(ctx context.Context, d deferredRow, inspecting chan struct{}, lim reattachLimits, start time.Time) {
	interrupted := Result{Status: StatusInterrupted, Reason: d.reason, Error: interruptedMessage(d.reason)}
	if lim.collectOnly {
		h.recoveredRow(ctx, d.row, start, interrupted, 0)
		return
	}
	t := h.rt.Clock().NewTimer(lim.noProgress)
	defer t.Stop()
	answer := d.answer
	if answer == nil {
		select {
		case inspecting <- struct{}{}:
		case <-t.Chan():
			h.recoveredRow(ctx, d.row, start, interrupted, 0)
			return
		case <-ctx.Done():
			return
		}
		inner := h.startInspection(agent.Unheld(ctx), d.row)
		answer = make(chan inspection, 1)
		go func() {
			a := <-inner
			<-inspecting
			answer <- a
		}()
	}
	var a inspection
	select {
	case a = <-answer:
	case <-t.Chan():
		h.recoveredRow(ctx, d.row, start, interrupted, 0)
		return
	case <-ctx.Done():
		return
	}
	t.Stop()
	h.publish(ctx, "recovery:classified", map[string]any{"runId": d.row.RunID, "agentType": d.row.AgentType, "deferred": string(d.reason)})
	h.mu.Lock()
	_, skip := h.live[d.row.RunID]
	h.mu.Unlock()
	if !skip {
		// Ended meanwhile (by a re-dispatch that came and went)?
		fresh, ok, err := h.readRun(ctx, d.row.RunID)
		skip = err == nil && (!ok || !fresh.Status.Active())
	}
	if skip {
		h.publish(ctx, "recovery:skip", map[string]any{"runId": d.row.RunID, "agentType": d.row.AgentType})
		return // re-dispatched meanwhile: its caller follows it, or did
	}
	switch {
	case a.err != nil:
		h.recoveredRow(ctx, d.row, start, Result{Status: StatusInterrupted, Reason: ReasonInspectFailed,
			Error: interruptedMessage(ReasonInspectFailed)}, 0)
	case a.insp != nil && a.insp.Status != childRunning:
		h.recoveredRow(ctx, d.row, start, resultFromInspection(*a.insp), h.forwardStored(ctx, d.row, a.ch.streamChunks(ctx, a.insp.RequestID)))
	case a.insp == nil:
		h.awaitRedispatch(ctx, d.row, h.awaitStart(d.row.RunID), lim, start)
	default:
		p, err := h.pendingOf(ctx, d.row, a.child, a.ch, a.insp)
		if err != nil {
			h.recoveredRow(ctx, d.row, start, Result{Status: StatusError, Error: h.runError(d.row.RunID, err)}, 0)
			return
		}
		h.reattachRecovered(ctx, p, lim, start)
	}
}

// recoveredRow finalizes one row during recovery and reports it on the
// agentTool channel with its typed reason.
func (h *host) recoveredRow(ctx context.Context, row runRow, start time.Time, res Result, mark int) {
	release, ok := h.claimRun(ctx, row)
	if !ok {
		return // followed by a dispatch meanwhile, which records its end
	}
	defer release()
	row.inFlight = true // not over an end another path recorded meanwhile
	stored, err := h.finish(ctx, row, res, mark)
	if err != nil {
		h.b.Logger().Error("agenttool: recover run", "run", row.RunID, "err", err)
		return
	}
	h.publish(ctx, "recovery:row", map[string]any{"runId": row.RunID, "agentType": row.AgentType,
		"status": string(stored.Status), "reason": string(stored.Reason), "error": stored.Error,
		"elapsedMs": h.rt.Clock().Since(start).Milliseconds()})
}

// claimRun makes the recovery the one that records a run's end, unless a
// dispatch of its id follows the run already, which then records the end
// itself (the run ends once: an interrupted end here and the real one
// there would both be delivered). A dispatch that comes while the claim
// holds waits for it (registerLive), then reads the recorded end and
// re-attaches to a run given up. release ends the claim.
func (h *host) claimRun(ctx context.Context, row runRow) (release func(), ok bool) {
	h.mu.Lock()
	if _, live := h.live[row.RunID]; live {
		h.mu.Unlock()
		h.publish(ctx, "recovery:skip", map[string]any{"runId": row.RunID, "agentType": row.AgentType})
		return nil, false
	}
	done := make(chan struct{})
	h.recovering[row.RunID] = done
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		delete(h.recovering, row.RunID)
		h.mu.Unlock()
		close(done)
	}, true
}

// awaitStart registers a recovered run whose child never started it: a
// re-dispatch of the run id closes the returned channel.
func (h *host) awaitStart(runID string) chan struct{} {
	started := make(chan struct{})
	h.mu.Lock()
	h.unstarted[runID] = started
	h.mu.Unlock()
	return started
}

// redispatched records that a re-dispatch started the child of run runID
// (its row goes from starting to running) and closes the channel of
// awaitStart, if a recovery waits on it.
func (h *host) redispatched(ctx context.Context, runID string) error {
	if err := h.markRunning(ctx, runID); err != nil {
		return fmt.Errorf("agenttool: mark running: %w", err)
	}
	h.mu.Lock()
	if ch, ok := h.unstarted[runID]; ok {
		close(ch) // a recovery waiting for this re-dispatch stops waiting
		delete(h.unstarted, runID)
	}
	h.mu.Unlock()
	return nil
}

// inspection is the answer of startInspection.
type inspection struct {
	child agent.Agent
	ch    *host
	insp  *Inspection
	err   error
}

// startInspection wakes a run's child and inspects the run in the
// background; the answer arrives on the channel. ctx must not hold the
// parent's gate.
func (h *host) startInspection(ctx context.Context, row runRow) chan inspection {
	done := make(chan inspection, 1)
	if h.remote(h.b.Path().Child(row.AgentType, row.RunID)) != nil {
		return done // on another node: inspected through its record
	}
	go func() {
		var a inspection
		a.child, a.err = h.rt.Get(ctx, h.b.Path().Child(row.AgentType, row.RunID))
		if a.err == nil {
			if a.ch, a.err = hostOf(a.child); a.err == nil {
				a.insp, a.err = a.ch.inspectChild(ctx, row.RunID)
			}
		}
		done <- a
	}()
	return done
}

// awaitInspection waits for a started inspection, within timeout. A nil
// inspection means the child does not know the run yet.
func (h *host) awaitInspection(ctx context.Context, done chan inspection, timeout time.Duration) (agent.Agent, *host, *Inspection, error) {
	t := h.rt.Clock().NewTimer(timeout)
	defer t.Stop()
	var a inspection
	err := agent.Await(ctx, func() error {
		select {
		case a = <-done:
			return a.err
		case <-t.Chan():
			return context.DeadlineExceeded
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return a.child, a.ch, a.insp, nil
}

// forwardStored sends the parent's clients the chunks of a run's child
// stream after the run's last terminal mark, as a re-attach does, and
// returns the sequence after the last one. A run collected without being
// followed has no forwarder (chunks are the child's stream of the run): a client whose connect replay read the run
// while it was still streaming would otherwise miss the rest of it (the
// replay marks drop what it already has).
func (h *host) forwardStored(ctx context.Context, row runRow, chunks []chat.StreamChunk) int {
	if len(chunks) == 0 {
		return 0
	}
	after := -1
	if n := len(row.marks); n > 0 {
		after = row.marks[n-1] - 1
	}
	for _, c := range chunks {
		if c.Seq > after {
			h.broadcast(row.ParentToolCallID, eventSeq(c.Seq, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: c.Body})
		}
	}
	return chunks[len(chunks)-1].Seq + 1
}
