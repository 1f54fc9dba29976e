package agenttool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/store"
)

// DefaultMaxRunningAgentTools is how many agent-tool runs of one parent
// execute at once unless Options.MaxRunningAgentTools or the parent's
// RunningLimiter says otherwise. Runs past it wait for a slot; they are
// never refused.
const DefaultMaxRunningAgentTools = 32

// RunningLimiter bounds the agent-tool runs of one parent whose child
// executes at once. A run dispatched past the bound is recorded and
// announced as usual (status starting) and waits, first come first served
// among the parent's runs, until a running one ends; then its child
// starts. Zero means the runtime's Options.MaxRunningAgentTools
// (DefaultMaxRunningAgentTools unless set), negative means unlimited.
//
// Unlike ConcurrencyLimiter, which refuses a dispatch past its cap (and
// counts the waiting runs, which are in flight), this bound only delays:
// one parent's fan-out of a thousand runs executes a bounded number at a
// time, and leaves the node to the other parents' runs meanwhile.
type RunningLimiter interface {
	MaxRunningAgentTools() int
}

// runningLimit is the parent's bound on its runs executing at once; below
// zero: unlimited.
func (h *host) runningLimit() int {
	n := h.opts.MaxRunningAgentTools
	if n == 0 {
		n = DefaultMaxRunningAgentTools
	}
	if l, ok := h.a.(RunningLimiter); ok {
		if v := l.MaxRunningAgentTools(); v != 0 {
			n = v
		}
	}
	return n
}

// slotTable holds, per parent (by path, so that a rehydrated parent finds
// the slots its runs hold), the runs executing and the runs waiting for a
// slot. One table serves a runtime.
type slotTable struct {
	mu      sync.Mutex
	parents map[string]*slotQueue
}

// slotQueue is one parent's share: how many slots are held, and the
// waiters in arrival order.
type slotQueue struct {
	held    int
	waiting []*slotWaiter
}

// slotWaiter is a run waiting for a slot; ready is closed when the slot
// is handed to it (granted, under slotTable.mu).
type slotWaiter struct {
	ready   chan struct{}
	granted bool
}

// runSlot is a held slot. release hands it to the parent's first waiter, or
// frees it; it does so once, and a nil slot (an unlimited parent's) holds
// nothing.
type runSlot struct {
	t    *slotTable
	key  string
	once sync.Once
}

func newSlotTable() *slotTable { return &slotTable{parents: map[string]*slotQueue{}} }

// release frees the slot once.
func (s *runSlot) release() {
	if s == nil {
		return
	}
	s.once.Do(func() { s.t.free(s.key) })
}

// try takes a slot of parent key at once if one is free and nobody waits
// (limit < 0: unlimited, a nil slot). ok is false when the run must wait.
func (t *slotTable) try(key string, limit int) (s *runSlot, ok bool) {
	if limit < 0 {
		return nil, true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queueLocked(key)
	if !q.takeFree(limit) {
		return nil, false
	}
	return &runSlot{t: t, key: key}, true
}

// queueLocked returns parent key's share, created empty if it has none;
// under t.mu.
func (t *slotTable) queueLocked(key string) *slotQueue {
	q := t.parents[key]
	if q == nil {
		q = &slotQueue{}
		t.parents[key] = q
	}
	return q
}

// takeFree takes a slot if one of limit's is free and nobody waits for
// one; under the table's mutex.
func (q *slotQueue) takeFree(limit int) bool {
	if q.held < max(limit, 1) && len(q.waiting) == 0 {
		q.held++
		return true
	}
	return false
}

// force takes a slot of parent key even past limit (limit < 0: unlimited,
// a nil slot): a run whose child executes already (re-attached after a
// restart) holds one, so that the runs waiting start only as it ends.
func (t *slotTable) force(key string, limit int) *runSlot {
	if limit < 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queueLocked(key)
	q.held++
	return &runSlot{t: t, key: key}
}

// acquire takes a slot of parent key, waiting behind the parent's earlier
// waiters until one is free or ctx ends; queued, if the run has to wait,
// is told once it is in line (with the slots held and the runs waiting,
// itself included). A waiter that ends holds nothing: a slot handed to it
// as it ended goes to the next waiter.
func (t *slotTable) acquire(ctx context.Context, key string, limit int, queued func(held, waiting int)) (*runSlot, error) {
	if limit < 0 {
		return nil, nil
	}
	t.mu.Lock()
	q := t.queueLocked(key)
	if q.takeFree(limit) {
		t.mu.Unlock()
		return &runSlot{t: t, key: key}, nil
	}
	w := &slotWaiter{ready: make(chan struct{})}
	q.waiting = append(q.waiting, w)
	held, waiting := q.held, len(q.waiting)
	t.mu.Unlock()
	if queued != nil {
		queued(held, waiting)
	}
	select {
	case <-w.ready:
		return &runSlot{t: t, key: key}, nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	if w.granted {
		t.mu.Unlock()
		(&runSlot{t: t, key: key}).release() // handed over as the wait ended: pass it on
	} else {
		for i, o := range q.waiting {
			if o == w {
				q.waiting = append(q.waiting[:i:i], q.waiting[i+1:]...)
				break
			}
		}
		t.dropIdle(key, q)
		t.mu.Unlock()
	}
	return nil, context.Cause(ctx)
}

// free hands a released slot to the parent's first waiter, or frees it.
func (t *slotTable) free(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.parents[key]
	if q == nil {
		return
	}
	if len(q.waiting) > 0 {
		w := q.waiting[0]
		q.waiting[0] = nil
		q.waiting = q.waiting[1:]
		w.granted = true
		close(w.ready)
		return
	}
	q.held--
	t.dropIdle(key, q)
}

// dropIdle forgets a parent that holds and awaits nothing; under t.mu.
func (t *slotTable) dropIdle(key string, q *slotQueue) {
	if q.held <= 0 && len(q.waiting) == 0 && t.parents[key] == q {
		delete(t.parents, key)
	}
}

// counts returns the slots held and the runs waiting of parent key.
func (t *slotTable) counts(key string) (held, waiting int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if q := t.parents[key]; q != nil {
		return q.held, len(q.waiting)
	}
	return 0, 0
}

// RunningAgentTools returns how many of parent's agent-tool runs hold a
// slot of its RunningLimiter bound in this process, and how many wait for
// one.
func RunningAgentTools(parent agent.Agent) (running, waiting int, err error) {
	h, err := hostOf(parent)
	if err != nil {
		return 0, 0, err
	}
	running, waiting = h.slots.counts(h.b.Path().String())
	return running, waiting, nil
}

// trySlot takes one of this parent's slots if one is free now.
func (h *host) trySlot() (*runSlot, bool) {
	return h.slots.try(h.b.Path().String(), h.runningLimit())
}

// forceSlot takes one of this parent's slots for a run whose child
// executes already, even past the bound.
func (h *host) forceSlot() *runSlot {
	return h.slots.force(h.b.Path().String(), h.runningLimit())
}

// awaitSlot waits, an await point of the parent, for one of its slots.
func (h *host) awaitSlot(ctx context.Context, row runRow) (*runSlot, error) {
	return h.awaitSlotIn(ctx, row, func() {})
}

// awaitSlotIn is awaitSlot that calls inLine once the run has a slot or
// is in line for one (or its wait ended); inLine may be called twice.
func (h *host) awaitSlotIn(ctx context.Context, row runRow, inLine func()) (*runSlot, error) {
	defer inLine()
	key := h.b.Path().String()
	limit := h.runningLimit()
	if s, ok := h.slots.try(key, limit); ok {
		return s, nil
	}
	waited := false
	var s *runSlot
	err := agent.Await(ctx, func() error {
		var err error
		s, err = h.slots.acquire(ctx, key, limit, func(held, waiting int) {
			waited = true
			h.publish(ctx, "queued", map[string]any{"runId": row.RunID, "agentType": row.AgentType, "running": held, "waiting": waiting})
			inLine()
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	if waited {
		h.publish(ctx, "dequeued", map[string]any{"runId": row.RunID, "agentType": row.AgentType})
	}
	return s, nil
}

// queue waits for a slot for a recorded run (status starting) that did
// not get one at its dispatch, then starts its child. A detached run waits
// in the background (the dispatch answers with a starting handle); an
// awaited run waits here, and canceling awaitCtx meanwhile ends it
// aborted, as a cancel of a running run does.
func (h *host) queue(ctx, awaitCtx context.Context, row runRow, input json.RawMessage) (Result, error) {
	return h.queueIn(ctx, awaitCtx, row, input, func() {})
}

// queueIn is queue that calls inLine once an awaited run has a slot or is
// in line for one (or its wait ended).
func (h *host) queueIn(ctx, awaitCtx context.Context, row runRow, input json.RawMessage, inLine func()) (Result, error) {
	if row.det.Detached {
		inLine()
		// The reconcile resumes the wait after a restart.
		if err := h.armReconcile(ctx, true); err != nil {
			h.b.Logger().Error("agenttool: arm reconcile", "err", err)
		}
		h.queueDetached(row, input)
		return Result{RunID: row.RunID, AgentType: row.AgentType, Status: StatusStarting}, nil
	}
	s, err := h.awaitSlotIn(awaitCtx, row, inLine)
	if err != nil {
		if h.rt.Context().Err() != nil {
			// Shutting down: the run is recovered with the process.
			return Result{}, agent.ErrClosed
		}
		return h.finish(context.WithoutCancel(ctx), row, Result{Status: StatusAborted, Error: causeText(awaitCtx)}, 0)
	}
	return h.dispatchChild(ctx, awaitCtx, row, input, s, true)
}

// queuedRun is a detached run waiting for its slot in this process.
type queuedRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	// started (under host.mu): the run left the queue to start its
	// child; a cancel from then on is a cancel of a run in flight.
	started bool
}

// queueDetached waits, in the background, for a slot for a recorded
// detached run, starts its child and follows it, holding the slot until
// the run ends. A run already waiting here is left to that wait.
func (h *host) queueDetached(row runRow, input json.RawMessage) {
	ctx, cancel := context.WithCancel(agent.WithAgent(h.rt.Context(), h.a))
	q := &queuedRun{cancel: cancel, done: make(chan struct{})}
	h.mu.Lock()
	if h.queued == nil {
		h.queued = map[string]*queuedRun{}
	}
	if _, ok := h.queued[row.RunID]; ok {
		h.mu.Unlock()
		cancel()
		return
	}
	h.queued[row.RunID] = q
	h.mu.Unlock()
	release := h.b.KeepAlive()
	h.rt.Go(func(context.Context) {
		defer release()
		defer close(q.done)
		defer cancel()
		s, err := h.awaitSlot(ctx, row)
		h.mu.Lock()
		if h.queued[row.RunID] == q {
			delete(h.queued, row.RunID)
		}
		q.started = err == nil && ctx.Err() == nil
		h.mu.Unlock()
		if !q.started {
			s.release()
			return // canceled (the cancel records the end) or shutting down (the reconcile resumes it)
		}
		if _, err := h.dispatchChild(context.WithoutCancel(ctx), ctx, row, input, s, true); err != nil && h.rt.Context().Err() == nil {
			h.b.Logger().Error("agenttool: queued detached run", "run", row.RunID, "err", err)
		}
	})
}

// isQueued reports whether a detached run waits for its slot here.
func (h *host) isQueued(runID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.queued[runID]
	return ok
}

// cancelQueued takes a detached run out of this process's queue before
// its child started; ok is false when it was not queued here (or has left
// the queue to start). Waiting for the queue's goroutine is an await point.
func (h *host) cancelQueued(ctx context.Context, runID string) bool {
	h.mu.Lock()
	q, ok := h.queued[runID]
	if ok {
		delete(h.queued, runID)
	}
	h.mu.Unlock()
	if !ok {
		return false
	}
	q.cancel()
	_ = agent.Await(ctx, func() error {
		<-q.done
		return nil
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	return !q.started
}

// errNotStarting refuses the start of a queued run's child: the run is no
// longer waiting (canceled, cleared, or started by a dispatch of its id).
var errNotStarting = errors.New("agenttool: the run is no longer waiting to start")

// startQueuedTx marks a queued run running in the transaction that starts
// its child, unless it is no longer starting.
func (h *host) startQueuedTx(runID string) func(ctx context.Context, tx store.Tx) error {
	return func(ctx context.Context, tx store.Tx) error {
		r, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET status = ?, queued_input = NULL WHERE instance_id = ? AND run_id = ? AND status = ?`,
			StatusRunning, h.iid, runID, StatusStarting)
		if err != nil {
			return fmt.Errorf("agenttool: mark running: %w", err)
		}
		if n, err := r.RowsAffected(); err != nil || n != 1 {
			return errors.Join(errNotStarting, err)
		}
		return nil
	}
}

// resumeQueued resumes, after a restart, an awaited run that was waiting
// for its slot: it waits again (behind the runs queued before it) and
// starts its child with the input recorded at its dispatch, as that
// dispatch would have. A dispatch of the run id that follows the run
// already is left to it. inLine is called once the run is in line (or has
// its slot, or is left to another dispatch).
func (h *host) resumeQueued(ctx context.Context, row runRow, inLine func()) {
	inLine = sync.OnceFunc(inLine)
	defer inLine()
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	pre := &liveRun{cancel: cancel, done: make(chan struct{})}
	if _, busy, err := h.registerLive(ctx, row.RunID, pre); err != nil || busy {
		if err != nil && h.rt.Context().Err() == nil {
			// Still recorded as waiting: the next start or dispatch of
			// the run id resumes it.
			h.b.Logger().Warn("agenttool: resume queued run", "run", row.RunID, "err", err)
		}
		return
	}
	defer h.releaseLive(row.RunID, pre)
	h.publish(ctx, "recovery:queued", map[string]any{"runId": row.RunID, "agentType": row.AgentType})
	res, err := h.queueIn(ctx, context.WithValue(runCtx, preKey{}, pre), row, row.queued, inLine)
	if err != nil {
		if h.rt.Context().Err() == nil {
			h.b.Logger().Warn("agenttool: resume queued run", "run", row.RunID, "err", err)
		}
		return
	}
	h.publish(ctx, "recovery:row", map[string]any{"runId": row.RunID, "agentType": row.AgentType,
		"status": string(res.Status), "reason": string(res.Reason), "error": res.Error})
}
