package agenttool_test

import (
	"context"
	"sync"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// The parts every kit of this package's tests shares: a runtime with the
// two layers, and a log of diag events to wait on.

// startEnv starts a server whose runtime has o's classes, chat configured
// with cc and agent tools installed with ao; setup, if set, then sees the
// runtime before it starts (to subscribe to its diag channels).
func startEnv(t *testing.T, o testenv.Options, cc chat.Config, ao agenttool.Options, setup func(rt *agent.Runtime)) *testenv.Env {
	t.Helper()
	o.Setup = func(rt *agent.Runtime) error {
		if err := chat.Configure(rt, cc); err != nil {
			return err
		}
		if err := agenttool.Install(rt, ao); err != nil {
			return err
		}
		if setup != nil {
			setup(rt)
		}
		return nil
	}
	return testenv.Start(t, o)
}

// events is a log of diag events that tests wait on: every add wakes the
// waiters.
type events struct {
	mu      sync.Mutex
	list    []diag.Event
	changed chan struct{}
}

// add records an event (a diag subscriber).
func (r *events) add(e diag.Event) {
	r.mu.Lock()
	r.list = append(r.list, e)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// all returns the events so far.
func (r *events) all() []diag.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]diag.Event(nil), r.list...)
}

// countWhere returns how many events match.
func (r *events) countWhere(match func(diag.Event) bool) int {
	n := 0
	for _, e := range r.all() {
		if match(e) {
			n++
		}
	}
	return n
}

// waitWhere returns the first event that matches once there is one, or
// fails the test with what (and the events seen) when ctx ends first.
func (r *events) waitWhere(t *testing.T, ctx context.Context, what func() string, match func(diag.Event) bool) diag.Event {
	t.Helper()
	for {
		r.mu.Lock()
		ch := r.changed
		for _, e := range r.list {
			if match(e) {
				r.mu.Unlock()
				return e
			}
		}
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what())
		}
	}
}

// waitCount waits until n events match.
func (r *events) waitCount(t *testing.T, ctx context.Context, what func() string, n int, match func(diag.Event) bool) {
	t.Helper()
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		if r.countWhere(match) >= n {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what())
		}
	}
}
