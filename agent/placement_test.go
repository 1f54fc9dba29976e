package agent_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/store"
)

// leases is a Placement that owns every instance under one lease epoch,
// which the test moves (the node lost its shards and took them back).
type leases struct {
	mu     sync.Mutex
	epoch  int64
	fenced []int64 // the epoch of each fenced write
}

var errStale = errors.New("fenced: an earlier hydration")

func (l *leases) Owns(agent.Path) bool { return true }

func (l *leases) Epoch(agent.Path) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch, true
}

func (l *leases) Fence(ctx context.Context, tx store.Tx, path agent.Path, epoch int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fenced = append(l.fenced, epoch)
	if epoch != 0 && epoch != l.epoch {
		return fmt.Errorf("%w: %s at epoch %d, the lease is at %d", errStale, path, epoch, l.epoch)
	}
	return nil
}

type placedAgent struct{ agent.Base }

// TestDroppedHydrationCannotWrite: an instance dropped because its node
// lost the lease keeps its goroutines, and the node may take the lease
// back (a new epoch) and hydrate the instance again. Every write of the
// dropped hydration, on its own or inside another instance's transaction
// (FenceAgent), is fenced with the epoch it was hydrated under and
// refused; the new hydration writes. (A dropped parent that could still
// write its runs' ends beside its new hydration would record a run's end,
// and tell its finish hook, twice.)
func TestDroppedHydrationCannotWrite(t *testing.T) {
	l, e, old := hydratePlaced(t)
	ctx := context.Background()
	path := agent.Root("Placed", "p")
	if err := agent.BaseOf(old).Storage().Put(ctx, "k", "first"); err != nil {
		t.Fatalf("write of the hydration at epoch 1: %v", err)
	}
	// The node lost the lease and took it back: the instance is dropped
	// and hydrated again under epoch 2.
	l.mu.Lock()
	l.epoch = 2
	l.mu.Unlock()
	e.rt.Drop(func(agent.Path) bool { return true })
	cur, err := e.rt.Get(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if cur == old {
		t.Fatal("the dropped instance was served again")
	}
	if err := agent.BaseOf(old).Storage().Put(ctx, "k", "stale"); !errors.Is(err, errStale) {
		t.Fatalf("write of the dropped hydration: %v, want it refused", err)
	}
	err = e.rt.DB().Update(ctx, func(tx store.Tx) error { return e.rt.FenceAgent(ctx, tx, old) })
	if !errors.Is(err, errStale) {
		t.Fatalf("FenceAgent of the dropped hydration: %v, want it refused", err)
	}
	if err := agent.BaseOf(cur).Storage().Put(ctx, "k", "second"); err != nil {
		t.Fatalf("write of the new hydration: %v", err)
	}
	if err := e.rt.DB().Update(ctx, func(tx store.Tx) error { return e.rt.FenceAgent(ctx, tx, cur) }); err != nil {
		t.Fatalf("FenceAgent of the new hydration: %v", err)
	}
	var v string
	if ok, err := agent.BaseOf(cur).Storage().Get(ctx, "k", &v); err != nil || !ok || v != "second" {
		t.Fatalf("stored %q %v %v, want second", v, ok, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ep := range l.fenced {
		if ep == 0 {
			t.Fatalf("a write of a hydrated instance was fenced without its epoch: %v", l.fenced)
		}
	}
}

// TestReacquiredLeaseRehydrates: the node took an instance's lease back
// at a new epoch before the instance hydrated under the old one was
// dropped (the drop runs late, or never: a renewal round that found the
// lease expired and took it again). The next Get does not serve the old
// hydration, whose writes are fenced: it hydrates the instance anew, and
// the new one writes. (A PostgreSQL outage longer than three quarters of
// a lease left a fan-out's parent serving requests from the old
// hydration, every write refused, its runs never recorded.)
func TestReacquiredLeaseRehydrates(t *testing.T) {
	l, e, old := hydratePlaced(t)
	ctx := context.Background()
	path := agent.Root("Placed", "p")
	l.mu.Lock()
	l.epoch = 2
	l.mu.Unlock()
	cur, err := e.rt.Get(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if cur == old {
		t.Fatal("the hydration of the lost lease was served under the new one")
	}
	if err := agent.BaseOf(cur).Storage().Put(ctx, "k", "new"); err != nil {
		t.Fatalf("write of the new hydration: %v", err)
	}
	if err := agent.BaseOf(old).Storage().Put(ctx, "k", "stale"); !errors.Is(err, errStale) {
		t.Fatalf("write of the old hydration: %v, want it refused", err)
	}
}

// hydratePlaced starts a runtime placed by leases at epoch 1 and hydrates
// the instance Placed "p" under that epoch.
func hydratePlaced(t *testing.T) (*leases, *rtEnv, agent.Agent) {
	t.Helper()
	l := &leases{epoch: 1}
	e := startRuntime(t, rtOptions{place: l, classes: []agent.Class{
		{Name: "Placed", New: func() agent.Agent { return &placedAgent{} }},
	}})
	old, err := e.rt.Get(context.Background(), agent.Root("Placed", "p"))
	if err != nil {
		t.Fatal(err)
	}
	return l, e, old
}

// TestDrainRefusesALateConnection: a connection that attaches while its
// instance is being drained (its request was routed here just before the
// node began to hand the shard over) is refused with ErrNotOwner, so the
// client reconnects to the new owner. Attached, it would never be closed
// (the drain closed the connections it saw), and it would stay on an
// instance the node forgets: a chat client on it waited for its turn's
// end forever (TestRollingRestart under -race).
func TestDrainRefusesALateConnection(t *testing.T) {
	_, e, _ := hydratePlaced(t)
	ctx := context.Background()
	path := agent.Root("Placed", "p")
	tr := newTransport()
	if _, err := e.rt.Connect(ctx, path, "c1", nil, tr); err != nil {
		t.Fatal(err)
	}
	// The first connection is closed by the drain but its transport never
	// reports it gone, so the instance stays in use and the drain waits
	// until dctx is canceled.
	dctx, cancel := context.WithCancel(ctx)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		e.rt.Drain(dctx, func(agent.Path) bool { return true })
	}()
	select {
	case code := <-tr.closed:
		if code != 1012 {
			t.Fatalf("drained connection closed with %d, want 1012", code)
		}
	case <-time.After(waitLimit):
		t.Fatal("the drain did not close the connection")
	}
	late := newTransport()
	_, err := e.rt.Connect(ctx, path, "c2", nil, late)
	cancel()
	<-drained
	if !errors.Is(err, agent.ErrNotOwner) {
		t.Fatalf("connection during the drain: %v, want ErrNotOwner", err)
	}
	// After the drain, the instance is hydrated anew for a connection.
	tr3 := newTransport()
	c3, err := e.rt.Connect(ctx, path, "c3", nil, tr3)
	if err != nil {
		t.Fatalf("connection after the drain: %v", err)
	}
	c3.Disconnect(1000, "done")
}
