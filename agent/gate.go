package agent

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// The input gate: an instance takes one input at a time. See
// docs/concurrency.md for the contract.
//
// Every input (an RPC call, a message or state frame, an HTTP request, a
// schedule callback, a framework delivery such as a chat tool call or an
// agent-tool finish hook) runs while it holds the instance's gate. A holder
// lets other inputs in only at an await point (Await), and takes the gate
// back before it goes on, like a monitor. The gate is re-entrant along one
// chain of calls: code that holds it and reaches a hook of the same instance
// synchronously does not wait for itself. The chain is carried by the
// context, so a goroutine started from gated code must not use that
// context's hold (use Unheld).

// gate is an instance's input gate: a FIFO semaphore of one.
type gate chan struct{}

// hold is one acquisition of an instance's gate. It is carried by the
// context of the code that holds it; prev links the holds of the calls
// that led here (another instance's, or an outer hold of this one that was
// released at an await point).
type hold struct {
	in   *instance
	prev *hold
	// held is false while the hold's code waits at an await point.
	held atomic.Bool

	mu   sync.Mutex
	pins []*instance // instances Get returned to this input: released with it
}

// pin keeps other in memory until the hold's input ends.
func (h *hold) pin(other *instance) {
	h.mu.Lock()
	h.pins = append(h.pins, other)
	h.mu.Unlock()
}

func (h *hold) unpin() {
	h.mu.Lock()
	pins := h.pins
	h.pins = nil
	h.mu.Unlock()
	for _, in := range pins {
		in.release()
	}
}

type holdKey struct{}

func holdOf(ctx context.Context) *hold {
	h, _ := ctx.Value(holdKey{}).(*hold)
	return h
}

// holds reports whether ctx's chain holds in's gate now.
func holds(ctx context.Context, in *instance) bool {
	for h := holdOf(ctx); h != nil; h = h.prev {
		if h.in == in && h.held.Load() {
			return true
		}
	}
	return false
}

// enter acquires in's gate for the code that will run with the returned
// context, and returns the function that releases it. It returns at once
// when ctx's chain holds the gate already, or when the class takes
// concurrent inputs.
func (in *instance) enter(ctx context.Context) (context.Context, func(), error) {
	return in.enterFor(ctx, ctx)
}

// enterFor is enter that waits for the gate as long as wait lasts and
// returns ctx (which may outlive wait) carrying the hold.
func (in *instance) enterFor(wait, ctx context.Context) (context.Context, func(), error) {
	if in.class.Concurrent || holds(ctx, in) {
		return ctx, func() {}, nil
	}
	select {
	case in.gate <- struct{}{}:
	case <-wait.Done():
		return ctx, nil, fmt.Errorf("agent: waiting for %s: %w", in.key, context.Cause(wait))
	}
	// An input pins its instance: it is not evicted while the input runs
	// or waits at an await point.
	in.pin()
	h := &hold{in: in, prev: holdOf(ctx)}
	h.held.Store(true)
	var released atomic.Bool
	return context.WithValue(ctx, holdKey{}, h), func() {
		if released.Swap(true) {
			return
		}
		h.held.Store(false)
		<-in.gate
		h.unpin()
		in.release()
	}, nil
}

// Enter runs fn as an input of agent a: it waits for a's input gate
// (unless ctx already holds it), runs fn with a context that holds it, and
// releases it. Framework layers deliver to agent code through Enter, so a
// hook never runs concurrently with the agent's other inputs.
func Enter(ctx context.Context, a Agent, fn func(ctx context.Context) error) error {
	in := a.base().in
	ctx, leave, err := in.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	return fn(WithAgent(ctx, a))
}

// Await is the documented await point of the input gate: it releases every
// gate that ctx's chain holds, runs wait, and takes the gates back (in the
// order they were first taken) before it returns, whatever wait returned.
// Other inputs of the instance may run meanwhile. The framework calls it
// around long waits (a model stream, an awaited agent-tool run, a call into
// another instance); agent code calls it around its own (a timer, an HTTP
// request), so that the instance keeps answering.
func Await(ctx context.Context, wait func() error) error {
	var released []*hold
	for h := holdOf(ctx); h != nil; h = h.prev {
		if h.held.Load() {
			h.held.Store(false)
			<-h.in.gate
			released = append(released, h)
		}
	}
	defer func() {
		// Outermost first, as they were taken.
		for i := len(released) - 1; i >= 0; i-- {
			h := released[i]
			h.in.gate <- struct{}{}
			h.held.Store(true)
		}
	}()
	return wait()
}

// Unheld returns ctx without its gate holds, for a goroutine that outlives
// (or runs beside) the gated code that starts it: such a goroutine must
// Enter again before it runs agent code.
func Unheld(ctx context.Context) context.Context {
	if holdOf(ctx) == nil {
		return ctx
	}
	return context.WithValue(ctx, holdKey{}, (*hold)(nil))
}

// Holds reports whether ctx holds the input gate of agent a, for checks in
// framework code.
func Holds(ctx context.Context, a Agent) bool { return holds(ctx, a.base().in) }
