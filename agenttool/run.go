package agenttool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/agentry/agentry/agent"
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
// Past the parent's bound on runs executing at once (RunningLimiter) the
// run is recorded and announced as starting and waits for a slot, first
// come first served, before its child starts; the wait is an await point
// of the parent, and canceling ctx meanwhile aborts the run.
//
// The error is non-nil only when the run could not be dispatched: an
// unknown class, a concurrency cap reached (*CapError; the run id is not
// consumed), a child that is not a chat agent, a storage failure, or (in a
// cluster) a child whose owner could not be reached in time: that run
// stays recorded and not ended, and a dispatch of the same run id starts
// it.
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
	// A slot of the parent's bound on runs executing at once, if one is
	// free now; otherwise the run is recorded, announced, and waits.
	s, free := h.trySlot()
	if !det.Detached && maxActive <= 0 && free {
		if res, err, ok := h.runFused(ctx, awaitCtx, parent, run, input, det, unregister); ok {
			s.release()
			return res, err
		}
	}
	var queued json.RawMessage
	if !free {
		queued = input
	}
	inserted, exists, err := h.insertRun(ctx, run, maxActive, det, queued)
	if err != nil || exists || !inserted {
		s.release()
	}
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

	row := runRow{Run: run, det: det, traceParent: agent.TraceParent(ctx), queued: queued}
	if det.Detached {
		// The run must not inherit the turn's cancellation.
		ctx = agent.WithAgent(context.WithoutCancel(ctx), parent)
	}
	if !free {
		return h.queue(ctx, awaitCtx, row, input)
	}
	return h.dispatchChild(ctx, awaitCtx, row, input, s, false)
}

// dispatchChild starts the child of a recorded run that holds slot s (nil:
// an unlimited parent's) and, for an awaited run, follows it to its end;
// the slot is held until then (a detached run's follower holds it). A run
// that waited for its slot (queued) starts its child only if it is still
// starting, in the same transaction that marks it running: a cancel or a
// clear that came first leaves no child.
func (h *host) dispatchChild(ctx, awaitCtx context.Context, row runRow, input json.RawMessage, s *runSlot, queued bool) (Result, error) {
	held := s
	defer func() { held.release() }()
	runID, class := row.RunID, row.AgentType
	childPath := h.b.Path().Child(class, runID)
	if queued {
		if r := h.remote(childPath); r != nil {
			if fresh, ok, err := h.readRun(ctx, runID); err != nil || !ok || fresh.Status != StatusStarting {
				s.release()
				return h.notStarted(ctx, awaitCtx, row, err)
			}
		}
	}
	if r := h.remote(childPath); r != nil {
		held = nil
		return h.runRemote(ctx, awaitCtx, row, input, r, s)
	}
	child, releaseChild, err := h.rt.Acquire(ctx, childPath)
	if err != nil {
		if r := h.remote(childPath); r != nil {
			// The child's shard left this node meanwhile (its lease
			// lapsed): its new owner starts it.
			held = nil
			return h.runRemote(ctx, awaitCtx, row, input, r, s)
		}
		return h.dispatchFailed(ctx, row, h.runError(runID, fmt.Errorf("start child: %w", err)))
	}
	defer releaseChild()
	ch, err := hostOf(child)
	if err != nil {
		return Result{}, err
	}
	opt := childStart{}
	if queued {
		opt = childStart{parent: h.a, parentTx: h.startQueuedTx(runID)}
	}
	cr, started, err := ch.startChildRun(ctx, runID, input, ChildRequest{RunID: runID, AgentType: class, ParentPath: h.b.Path()}, opt)
	if err != nil {
		if errors.Is(err, errNotStarting) {
			s.release()
			return h.notStarted(ctx, awaitCtx, row, nil)
		}
		if r := h.remote(childPath); r != nil {
			// Refused by the fence: the child's shard left this node
			// meanwhile. Starting is idempotent; its new owner does it.
			held = nil
			return h.runRemote(ctx, awaitCtx, row, input, r, s)
		}
		return h.dispatchFailed(ctx, row, h.runError(runID, err))
	}
	if !queued || !started {
		if err := h.markRunning(ctx, runID); err != nil {
			if h.rt.Context().Err() != nil {
				// Shutting down: the run is recovered with the process.
				return Result{}, agent.ErrClosed
			}
			return Result{}, fmt.Errorf("agenttool: mark running: %w", err)
		}
	}
	row.Status = StatusRunning
	if row.det.Detached {
		if err := h.armReconcile(ctx, true); err != nil {
			h.b.Logger().Error("agenttool: arm reconcile", "err", err)
		}
		held = nil
		h.followHeld(row, s)
		return Result{RunID: runID, AgentType: class, Status: StatusRunning}, nil
	}
	return h.await(awaitCtx, row, child, cr, reattachLimits{})
}

// notStarted answers for a queued run whose slot came after it stopped
// waiting (canceled, cleared, started by another dispatch): its stored
// result, or its handle.
func (h *host) notStarted(ctx, awaitCtx context.Context, row runRow, err error) (Result, error) {
	if err != nil {
		return Result{}, fmt.Errorf("agenttool: read run: %w", err)
	}
	fresh, ok, err := h.readRun(context.WithoutCancel(ctx), row.RunID)
	if err != nil {
		return Result{}, fmt.Errorf("agenttool: read run: %w", err)
	}
	if !ok {
		return Result{RunID: row.RunID, AgentType: row.AgentType, Status: StatusAborted, Error: msgCancelled}, nil
	}
	if row.det.Detached {
		return Result{RunID: row.RunID, AgentType: row.AgentType, Status: fresh.Status}, nil
	}
	if fresh.Status.Active() {
		// Started by another dispatch of the run id: follow it as one.
		return h.redispatch(awaitCtx, fresh, false, row.queued)
	}
	return fresh.Result(), nil
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
			inserted, taken, err := h.insertRunTx(ctx, tx, running, 0, det, nil)
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
		if !row.det.Detached && !row.det.FinishDelivered && !h.markPending(row.RunID) {
			// An end recorded and not delivered, and no delivery of it is
			// under way here: the delivery was cut (a crash, or a copy of
			// this parent that lost its shard, whose hook's transaction
			// the fence refused, while this copy had started already).
			// Deliver it now; the delivery mark lets only one delivery's
			// transaction commit.
			h.deliverFinish(ctx, row.Run, row.Result(), row.marks)
		}
		return row.Result(), nil
	}
	if detached || row.det.Detached {
		var s *runSlot
		if row.Status == StatusStarting {
			if h.isQueued(row.RunID) {
				// Waiting for its slot here: it starts when it has one.
				return Result{RunID: row.RunID, AgentType: row.AgentType, Status: StatusStarting}, nil
			}
			free := false
			if s, free = h.trySlot(); !free {
				// No slot free: it waits for one, in line.
				return h.queue(ctx, ctx, row, input)
			}
			// The first dispatch died between recording the run and
			// starting its child: start it now, with this dispatch's
			// input (starting is idempotent).
			if err := h.startRecordedChild(ctx, row, input); err != nil {
				s.release()
				return h.finish(ctx, row, Result{Status: StatusError, Error: h.runError(row.RunID, err)}, 0)
			}
			row.Status = StatusRunning
		}
		if err := h.armReconcile(ctx, false); err != nil {
			s.release()
			return Result{}, fmt.Errorf("agenttool: arm reconcile: %w", err)
		}
		if row.Status.Active() {
			h.followHeld(row, s)
		} else {
			s.release()
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
		// child (or the child between recording it and starting its turn),
		// or the run was waiting for its slot: start it now, with this
		// dispatch's input, once it has a slot. Starting is idempotent.
		s, err := h.awaitSlot(ctx, row)
		if err != nil {
			if h.rt.Context().Err() != nil {
				return Result{}, agent.ErrClosed
			}
			return h.finish(context.WithoutCancel(ctx), row, Result{Status: StatusAborted, Error: causeText(ctx)}, 0)
		}
		defer s.release()
		cr, _, err = ch.startChildRun(ctx, row.RunID, input, ChildRequest{RunID: row.RunID, AgentType: row.AgentType, ParentPath: h.b.Path()}, childStart{})
		if err != nil {
			if r := h.remote(h.b.Path().Child(row.AgentType, row.RunID)); r != nil {
				// Refused by the fence: the child's shard left this node
				// meanwhile; its new owner starts it (idempotently), once
				// the run has a slot again.
				s.release()
				return h.redispatchRemote(ctx, row, input, r)
			}
			return h.finish(ctx, row, Result{Status: StatusError, Error: h.runError(row.RunID, err)}, 0)
		}
		if err := h.redispatched(ctx, row.RunID); err != nil {
			return Result{}, err
		}
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

// served reports whether this copy of the instance is the one the runtime
// serves at its path now (hydrated and started). A copy dropped because its
// node lost the shard's lease (its writes are fenced), evicted or
// destroyed is not, whether or not the instance was hydrated again.
func (h *host) served() bool {
	a, ok := h.rt.Lookup(h.b.Path())
	return ok && a == h.a
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
