package agenttool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/ids"
	"github.com/agentry/agentry/store"
)

// liveRun is a run this process is awaiting.
type liveRun struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// RunAgentTool runs the chat agent class as a child of parent and waits
// for its result (the seed's runAgentTool). The registry row is written
// before the child wakes; the child is the parent's sub-agent named by the
// run id, started idempotently; every chunk of its stream reaches the
// parent's clients as agent-tool-event frames.
//
// A run id that exists already never starts a second child: a finished run
// returns its stored result (whatever the new input), and a run still in
// flight (or interrupted) is followed to its end. Canceling ctx aborts the
// run (status aborted, with the context's cause as the reason).
//
// The error is non-nil only when the run could not be dispatched: an
// unknown class, a concurrency cap reached (*CapError; the run id is not
// consumed), a child that is not a chat agent, or a storage failure.
func RunAgentTool[C agent.ClassName](ctx context.Context, parent agent.Agent, c C, opts RunOptions) (Result, error) {
	class := string(c)
	h, err := hostOf(parent)
	if err != nil {
		return Result{}, err
	}
	ctx, span := h.startRunSpan(ctx, class, opts)
	res, err := h.run(ctx, parent, class, opts)
	span.SetAttributes(attrRunID.String(res.RunID), attrStatus.String(string(res.Status)))
	agent.EndSpan(span, err)
	if err != nil && h.rt.Context().Err() != nil {
		// The runtime closed under the dispatch: whatever failed because
		// of it, the run is recovered with the process.
		return Result{}, agent.ErrClosed
	}
	return res, err
}

func (h *host) run(ctx context.Context, parent agent.Agent, class string, opts RunOptions) (Result, error) {
	// The parent is pinned while it dispatches and awaits the run.
	release := h.b.KeepAlive()
	defer release()
	if !h.rt.HasClass(class) {
		return Result{}, fmt.Errorf("agenttool: %w %q", agent.ErrUnknownClass, class)
	}
	runID := opts.RunID
	if runID == "" {
		runID = ids.Random()
	}
	det, err := h.detachedColumns(opts.Detached, h.rt.Clock().Now())
	if err != nil {
		return Result{}, err
	}
	input, err := json.Marshal(opts.Input)
	if err != nil {
		return Result{}, fmt.Errorf("agenttool: marshal input: %w", err)
	}
	// An awaited run is live from before its row is read or written, so
	// that CancelAgentTool (and clear) reach it while it is being
	// dispatched, a second dispatch of the same id waits for it instead of
	// finding a row whose child has not started yet, and a recovery of the
	// parent leaves a run that a dispatch follows again to that dispatch
	// (one end, not the recovery's interrupted one and then the real one).
	awaitCtx := ctx
	unregister := func() {}
	if !det.Detached {
		runCtx, cancelRun := context.WithCancelCause(ctx)
		defer cancelRun(nil)
		pre := &liveRun{cancel: cancelRun, done: make(chan struct{})}
		other, busy, err := h.registerLive(ctx, runID, pre)
		if err != nil {
			return Result{}, err
		}
		if busy {
			return h.waitLive(ctx, other, runID)
		}
		var once sync.Once
		unregister = func() {
			once.Do(func() {
				h.mu.Lock()
				if h.live[runID] == pre {
					delete(h.live, runID)
				}
				h.mu.Unlock()
				close(pre.done)
			})
		}
		defer unregister()
		awaitCtx = context.WithValue(runCtx, preKey{}, pre)
	}
	if opts.RunID == "" {
		// A new id: no row can hold it (and recording the run checks).
	} else if row, ok, err := h.readRun(ctx, runID); err != nil {
		return Result{}, fmt.Errorf("agenttool: read run: %w", err)
	} else if ok {
		h.publish(ctx, "redispatch", map[string]any{"runId": runID, "agentType": row.AgentType, "status": string(row.Status)})
		return h.redispatch(awaitCtx, row, det.Detached, input)
	}
	preview, err := inputPreview(opts.InputPreview, opts.Input, input)
	if err != nil {
		return Result{}, err
	}
	run := Run{RunID: runID, ParentToolCallID: opts.ParentToolCallID, AgentType: class, InputPreview: preview,
		Status: StatusStarting, Display: opts.Display, DisplayOrder: opts.DisplayOrder, StartedAt: h.rt.Clock().Now(),
		TokenBudget: opts.Tokens}
	maxActive := 0
	if l, ok := parent.(ConcurrencyLimiter); ok {
		maxActive = l.MaxConcurrentAgentTools()
	}
	if !det.Detached && maxActive <= 0 {
		if res, err, ok := h.runFused(ctx, awaitCtx, parent, run, input, det, unregister); ok {
			return res, err
		}
	}
	inserted, exists, err := h.insertRun(ctx, run, maxActive, det)
	if err != nil {
		return Result{}, fmt.Errorf("agenttool: record run: %w", err)
	}
	if exists {
		unregister()
		row, _, err := h.readRun(ctx, runID)
		if err != nil {
			return Result{}, fmt.Errorf("agenttool: read run: %w", err)
		}
		return h.redispatch(ctx, row, det.Detached, input)
	}
	if !inserted {
		capErr := &CapError{Max: maxActive}
		return Result{RunID: runID, AgentType: class, Status: StatusError, Error: capErr.Error()}, capErr
	}
	h.announce(ctx, parent, run)

	row := runRow{Run: run, det: det, traceParent: agent.TraceParent(ctx)}
	if det.Detached {
		// The run must not inherit the turn's cancellation.
		ctx = agent.WithAgent(context.WithoutCancel(ctx), parent)
	}
	if r := h.remote(h.b.Path().Child(class, runID)); r != nil {
		return h.runRemote(ctx, awaitCtx, row, input, r)
	}
	child, releaseChild, err := h.rt.Acquire(ctx, h.b.Path().Child(class, runID))
	if err != nil {
		if r := h.remote(h.b.Path().Child(class, runID)); r != nil {
			// The child's shard left this node meanwhile (its lease
			// lapsed): its new owner starts it.
			return h.runRemote(ctx, awaitCtx, row, input, r)
		}
		return h.dispatchFailed(ctx, row, h.runError(runID, fmt.Errorf("start child: %w", err)))
	}
	defer releaseChild()
	ch, err := hostOf(child)
	if err != nil {
		return Result{}, err
	}
	cr, _, err := ch.startChildRun(ctx, runID, input, ChildRequest{RunID: runID, AgentType: class, ParentPath: h.b.Path()}, childStart{})
	if err != nil {
		if r := h.remote(h.b.Path().Child(class, runID)); r != nil {
			// Refused by the fence: the child's shard left this node
			// meanwhile. Starting is idempotent; its new owner does it.
			return h.runRemote(ctx, awaitCtx, row, input, r)
		}
		return h.dispatchFailed(ctx, row, h.runError(runID, err))
	}
	if err := h.markRunning(ctx, runID); err != nil {
		if h.rt.Context().Err() != nil {
			// Shutting down: the run is recovered with the process.
			return Result{}, agent.ErrClosed
		}
		return Result{}, fmt.Errorf("agenttool: mark running: %w", err)
	}
	row.Status = StatusRunning
	if det.Detached {
		if err := h.armReconcile(ctx, true); err != nil {
			h.b.Logger().Error("agenttool: arm reconcile", "err", err)
		}
		h.follow(row)
		return Result{RunID: runID, AgentType: class, Status: StatusRunning}, nil
	}
	return h.await(awaitCtx, row, child, cr, reattachLimits{})
}

// announce tells the parent's hook, the observers and the clients that a
// recorded run was dispatched.
func (h *host) announce(ctx context.Context, parent agent.Agent, run Run) {
	if o, ok := parent.(StartObserver); ok {
		_ = agent.Enter(ctx, parent, func(ctx context.Context) error {
			o.OnAgentToolStart(ctx, run)
			return nil
		})
	}
	h.countStarted(ctx, run)
	h.publish(ctx, "start", map[string]any{"runId": run.RunID, "agentType": run.AgentType, "parentToolCallId": run.ParentToolCallID})
	order := run.DisplayOrder
	h.broadcast(run.ParentToolCallID, 0, Event{Kind: "started", RunID: run.RunID, AgentType: run.AgentType,
		InputPreview: run.InputPreview, Order: &order, Display: run.Display})
}

// errRunTaken aborts a fused dispatch whose run id the registry holds.
var errRunTaken = errors.New("agenttool: run id taken")

// runFused dispatches an awaited run to a child that this dispatch
// creates, in one transaction: the parent's registry row (running), the
// child's record of the run and the child's turn. The child's end then
// records the parent's terminal row in its own end transaction (see
// parentFuse). ok is false when the run was not dispatched this way and
// nothing of it was stored: the caller dispatches it the usual way, which
// also records a failure to start the child.
func (h *host) runFused(ctx, awaitCtx context.Context, parent agent.Agent, run Run, input json.RawMessage,
	det detachedCols, unregister func()) (res Result, err error, ok bool) {
	if h.remote(h.b.Path().Child(run.AgentType, run.RunID)) != nil {
		return Result{}, nil, false // on another node: no shared transaction
	}
	child, releaseChild, err := h.rt.Acquire(ctx, h.b.Path().Child(run.AgentType, run.RunID))
	if err != nil {
		return Result{}, nil, false
	}
	defer releaseChild()
	ch, err := hostOf(child)
	if err != nil || !agent.BaseOf(child).Created() {
		return Result{}, nil, false // an existing child may know the run
	}
	running := run
	running.Status = StatusRunning
	exists := false
	// A connection from the commit on replays the run (its child streams
	// at once, before the started event goes out); "some runs" only costs
	// a connection a listing if the dispatch fails.
	h.mu.Lock()
	h.hasRuns = 1
	h.mu.Unlock()
	// The parent's pending delivery marks ride the dispatch.
	ms := h.takeMarks()
	cr, started, err := ch.startChildRun(ctx, run.RunID, input,
		ChildRequest{RunID: run.RunID, AgentType: run.AgentType, ParentPath: h.b.Path()},
		childStart{fuse: &parentFuse{parent: h, runID: run.RunID}, parent: h.a, parentTx: func(ctx context.Context, tx store.Tx) error {
			if err := h.writeMarksTx(ctx, tx, ms); err != nil {
				return err
			}
			inserted, taken, err := h.insertRunTx(ctx, tx, running, 0, det)
			switch {
			case err != nil:
				return err
			case taken:
				exists = true
				return errRunTaken
			case !inserted:
				return errors.New("agenttool: run not recorded")
			}
			return nil
		}})
	if err != nil || !started {
		h.restoreMarks(ms)
	}
	if exists {
		unregister()
		row, _, err := h.readRun(ctx, run.RunID)
		if err != nil {
			return Result{}, fmt.Errorf("agenttool: read run: %w", err), true
		}
		res, err := h.redispatch(ctx, row, false, input)
		return res, err, true
	}
	if err != nil || !started {
		return Result{}, nil, false
	}
	h.announce(ctx, parent, run)
	res, err = h.await(awaitCtx, runRow{Run: running, det: det, traceParent: agent.TraceParent(ctx)}, child, cr, reattachLimits{})
	return res, err, true
}

// preKey marks the context of a dispatch whose run was registered live
// before its row was written; await takes the registration over.
type preKey struct{}

// waitLive waits for another caller's run and returns its stored result.
func (h *host) waitLive(ctx context.Context, other *liveRun, runID string) (Result, error) {
	err := agent.Await(ctx, func() error {
		select {
		case <-other.done:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	if err != nil {
		return Result{}, err
	}
	r, _, err := h.readRun(context.WithoutCancel(ctx), runID)
	return r.Result(), err
}

// registerLive registers a dispatch's run as live, unless another caller
// has it live (busy: its registration is other). A recovery of the parent
// that is recording the run's end now is waited for first (an await point):
// the dispatch then reads that end.
func (h *host) registerLive(ctx context.Context, runID string, pre *liveRun) (other *liveRun, busy bool, err error) {
	for {
		h.mu.Lock()
		rec, recovering := h.recovering[runID]
		if !recovering {
			other, busy = h.live[runID]
			if !busy {
				h.live[runID] = pre
			}
			h.mu.Unlock()
			return other, busy, nil
		}
		h.mu.Unlock()
		err := agent.Await(ctx, func() error {
			select {
			case <-rec:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
		if err != nil {
			return nil, false, err
		}
	}
}

// dispatchFailed records a run whose child could not be started.
func (h *host) dispatchFailed(ctx context.Context, row runRow, msg string) (Result, error) {
	res, err := h.finish(ctx, row, Result{Status: StatusError, Error: msg}, 0)
	if row.det.Detached && err == nil {
		// A detached dispatch answers with a handle, status error.
		return Result{RunID: row.RunID, AgentType: row.AgentType, Status: StatusError, Error: res.Error}, nil
	}
	return res, err
}

// redispatch answers a dispatch of a run id the registry holds: a finished
// run returns its stored result, detached or not; a run in flight is
// followed to its end (awaited) or answered with a running handle
// (detached).
func (h *host) redispatch(ctx context.Context, row runRow, detached bool, input json.RawMessage) (Result, error) {
	if row.Status.Hard() {
		return row.Result(), nil
	}
	if detached || row.det.Detached {
		if row.Status == StatusStarting {
			// The first dispatch died between recording the run and
			// starting its child: start it now, with this dispatch's
			// input (starting is idempotent).
			if err := h.startRecordedChild(ctx, row, input); err != nil {
				return h.finish(ctx, row, Result{Status: StatusError, Error: h.runError(row.RunID, err)}, 0)
			}
			row.Status = StatusRunning
		}
		if err := h.armReconcile(ctx, false); err != nil {
			return Result{}, fmt.Errorf("agenttool: arm reconcile: %w", err)
		}
		if row.Status.Active() {
			h.follow(row)
		}
		return Result{RunID: row.RunID, AgentType: row.AgentType, Status: StatusRunning}, nil
	}
	h.mu.Lock()
	other, busy := h.live[row.RunID]
	h.mu.Unlock()
	if busy && other != ctx.Value(preKey{}) {
		return h.waitLive(ctx, other, row.RunID)
	}
	if r := h.remote(h.b.Path().Child(row.AgentType, row.RunID)); r != nil {
		return h.redispatchRemote(ctx, row, input, r)
	}
	child, releaseChild, err := h.rt.Acquire(ctx, h.b.Path().Child(row.AgentType, row.RunID))
	if err != nil {
		if r := h.remote(h.b.Path().Child(row.AgentType, row.RunID)); r != nil {
			return h.redispatchRemote(ctx, row, input, r) // its shard left this node meanwhile
		}
		return Result{}, fmt.Errorf("agenttool: child of %s: %w", row.RunID, err)
	}
	defer releaseChild()
	ch, err := hostOf(child)
	if err != nil {
		return Result{}, err
	}
	insp, err := ch.inspectChild(ctx, row.RunID)
	if err != nil {
		return Result{}, err
	}
	var cr *childRun
	if insp == nil || insp.RequestID == "" {
		// The parent died between recording the run and starting the
		// child (or the child between recording it and starting its turn):
		// start it now, with this dispatch's input. Starting is idempotent.
		cr, _, err = ch.startChildRun(ctx, row.RunID, input, ChildRequest{RunID: row.RunID, AgentType: row.AgentType, ParentPath: h.b.Path()}, childStart{})
		if err != nil {
			if r := h.remote(h.b.Path().Child(row.AgentType, row.RunID)); r != nil {
				// Refused by the fence: the child's shard left this node
				// meanwhile; its new owner starts it (idempotently).
				return h.redispatchRemote(ctx, row, input, r)
			}
			return h.finish(ctx, row, Result{Status: StatusError, Error: h.runError(row.RunID, err)}, 0)
		}
		if err := h.markRunning(ctx, row.RunID); err != nil {
			return Result{}, fmt.Errorf("agenttool: mark running: %w", err)
		}
		h.mu.Lock()
		if ch, ok := h.unstarted[row.RunID]; ok {
			close(ch) // a recovery waiting for this re-dispatch stops waiting
			delete(h.unstarted, row.RunID)
		}
		h.mu.Unlock()
	} else {
		cr = ch.track(row.RunID, insp.RequestID, insp.Status != childRunning)
	}
	h.publish(ctx, "recovery:reattach", map[string]any{"runId": row.RunID, "agentType": row.AgentType})
	return h.await(ctx, row, child, cr, h.reattachLimits())
}

// startRecordedChild starts the child of a run recorded as starting whose
// child has no record of it, and marks the run running.
func (h *host) startRecordedChild(ctx context.Context, row runRow, input json.RawMessage) error {
	if r := h.remote(h.b.Path().Child(row.AgentType, row.RunID)); r != nil {
		if _, err := r.StartChild(ctx, RemoteStart{ParentPath: h.b.Path(), Class: row.AgentType, RunID: row.RunID, Input: input}); err != nil {
			return fmt.Errorf("start child: %w", err)
		}
		return h.markRunning(ctx, row.RunID)
	}
	child, releaseChild, err := h.rt.Acquire(ctx, h.b.Path().Child(row.AgentType, row.RunID))
	if err != nil {
		return fmt.Errorf("start child: %w", err)
	}
	defer releaseChild()
	ch, err := hostOf(child)
	if err != nil {
		return err
	}
	if _, _, err := ch.startChildRun(ctx, row.RunID, input, ChildRequest{RunID: row.RunID, AgentType: row.AgentType, ParentPath: h.b.Path()}, childStart{}); err != nil {
		return err
	}
	return h.markRunning(ctx, row.RunID)
}

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

// inputPreview is the registry's view of the input: the explicit preview,
// else the input string (first 500 characters) or the input's JSON (cut to
// 497 characters plus "...").
func inputPreview(explicit, input any, raw json.RawMessage) (json.RawMessage, error) {
	var v any
	switch {
	case explicit != nil:
		v = explicit
	case input == nil:
		return nil, nil
	default:
		if s, ok := input.(string); ok {
			v = truncateRunes(s, 500)
		} else if len(raw) > 500 {
			v = truncateRunes(string(raw), 497) + "..."
		} else {
			v = string(raw)
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("agenttool: marshal input preview: %w", err)
	}
	return b, nil
}

func truncateRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

// current returns the host of the parent instance now in memory: this one,
// or — when this parent was evicted while it awaited a run — the one that
// replaced it, so the clients connected there see the run's end.
func (h *host) current() *host {
	a, ok := h.rt.Lookup(h.b.Path())
	if !ok || a == h.a {
		return h
	}
	if cur, err := hostOf(a); err == nil {
		return cur
	}
	return h
}
