package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// Placement decides which instances a runtime hosts when it is one node of
// a cluster (package cluster implements it). Without one (Options.Placement
// nil) the runtime hosts every instance, as a single node does.
type Placement interface {
	// Owns reports whether this node serves the instance at path now.
	Owns(path Path) bool
	// Epoch returns the epoch of the lease under which this node serves
	// the instance at path now; ok is false when it does not serve it
	// (whenever Owns is false). A
	// hydration of the instance records it, and its writes are fenced
	// with it.
	Epoch(path Path) (epoch int64, ok bool)
	// Fence runs first in every write transaction of the instance at path;
	// an error aborts the transaction. It is how a node that lost the
	// instance (even one paused past its lease) is kept from writing.
	// epoch is the epoch the writing hydration of the instance was made
	// under (Epoch at its hydration): a write of an earlier hydration is
	// refused even when this node holds the lease again, at a later
	// epoch, so an instance dropped with a lost lease never writes beside
	// its next hydration. Zero fences by the lease this node holds now,
	// for a write that belongs to no one hydration.
	Fence(ctx context.Context, tx store.Tx, path Path, epoch int64) error
}

// Sharder is an optional part of a Placement that groups instances into
// shards (package cluster's leases). The runtime stores each wake reason
// (Base.KeepAwake) with its instance's shard, so that waking the shards a
// node acquires (Runtime.WakeShards) reads only their reasons, not the
// whole cluster's.
type Sharder interface {
	// ShardOf returns the shard of the instance at path. It must not
	// change for the life of the database.
	ShardOf(path Path) int
	// Owned returns the shards this node serves now.
	Owned() []int
}

// RemoteForgetter is an optional part of a Placement: Destroy tells it
// the destroyed descendants that other nodes own, so that those nodes drop
// the ones they hold in memory (ForgetDestroyed there). Their rows are
// gone already; a node that is not reached drops them when it loses
// them, or when they are evicted.
type RemoteForgetter interface {
	ForgetRemote(ctx context.Context, paths []Path) error
}

// RemoteGate is an optional part of a Placement: it asks the node that
// owns a parent whether a client may reach its sub-agent at path (the
// parent's OnBeforeSubAgent and its layers' gates), when the parent is not
// served here. CheckSubAgent uses it.
type RemoteGate interface {
	CheckRemoteSubAgent(ctx context.Context, r *http.Request, path Path) error
}

// ErrNotOwner is returned for an instance that another node of the cluster
// owns (Options.Placement): it is not hydrated here.
var ErrNotOwner = errors.New("agent: instance owned by another node")

// fencedDB is an instance's view of the runtime's database: every Update
// runs the placement's fence for the instance first, at the epoch of its
// hydration (0: the lease held now).
type fencedDB struct {
	store.DB
	p     Placement
	path  Path
	epoch int64
}

func (d fencedDB) Update(ctx context.Context, fn func(store.Tx) error) error {
	return d.DB.Update(ctx, func(tx store.Tx) error {
		if err := d.p.Fence(ctx, tx, d.path, d.epoch); err != nil {
			return err
		}
		return fn(tx)
	})
}

// dbFor returns the database as the instance at path writes it: fenced
// under a placement by the lease held now.
func (rt *Runtime) dbFor(path Path) store.DB { return rt.dbAt(path, 0) }

// dbAt is dbFor fenced at a hydration's epoch.
func (rt *Runtime) dbAt(path Path, epoch int64) store.DB {
	if rt.place == nil {
		return rt.db
	}
	return fencedDB{DB: rt.db, p: rt.place, path: path, epoch: epoch}
}

// DBFor returns the database as the instance at path must write it: with a
// Placement, every Update first runs its fence for that instance. Framework
// layers write each instance's rows through it (Base.DB).
func (rt *Runtime) DBFor(path Path) store.DB { return rt.dbFor(path) }

// Fence runs the placement's fence for the instance at path in tx, by the
// lease this node holds now, for a transaction that also writes another
// instance's rows. Without a placement it does nothing. FenceAgent fences
// one hydration, which is what a write on behalf of an agent in memory
// needs.
func (rt *Runtime) Fence(ctx context.Context, tx store.Tx, path Path) error {
	if rt.place == nil {
		return nil
	}
	return rt.place.Fence(ctx, tx, path, 0)
}

// FenceAgent runs, in tx, the fence that every write of the hydrated
// instance a runs (Base.DB): for a transaction of another instance that
// also writes a's rows (a child's turn end that writes its parent's
// registry row). A hydration dropped when its node lost the lease cannot
// pass it, even after the node took the lease back. Without a placement it
// does nothing.
func (rt *Runtime) FenceAgent(ctx context.Context, tx store.Tx, a Agent) error {
	if rt.place == nil {
		return nil
	}
	in := a.base().in
	return rt.place.Fence(ctx, tx, in.path, in.epoch)
}

// Owns reports whether this runtime serves the instance at path: always
// without a placement.
func (rt *Runtime) Owns(path Path) bool { return rt.place == nil || rt.place.Owns(path) }

// Placement returns the runtime's placement, nil on a single node.
func (rt *Runtime) Placement() Placement { return rt.place }

// Wake hydrates every instance with unfinished work (a KeepAwake reason)
// that match selects and this runtime owns, as Start does for all of them.
// It reads every wake reason of the database; a cluster node wakes the
// shards it acquires with WakeShards, which reads only theirs.
func (rt *Runtime) Wake(ctx context.Context, match func(Path) bool) error {
	err := rt.wakeMatching(ctx, match)
	rt.sched.poke()
	return err
}

// WakeShards hydrates every instance with unfinished work on the given
// shards that this runtime owns (a cluster node calls it for the shards it
// acquires). It reads only those shards' wake reasons (and the reasons
// stored without a shard, which it files under theirs). The runtime's
// placement must be a Sharder.
func (rt *Runtime) WakeShards(ctx context.Context, shards []int) error {
	if _, ok := rt.place.(Sharder); !ok {
		return errors.New("agent: WakeShards needs a placement that is a Sharder")
	}
	err := rt.wakeShards(ctx, shards)
	rt.sched.poke()
	return err
}

// Drain hands the resident instances that match selects over to another
// node: their client connections are closed with 1012 (service restart,
// which the npm clients answer by reconnecting, to the new owner), and
// Drain waits until each is no longer in use, at most until ctx is done,
// before it forgets them. The caller has stopped routing new inputs to
// them (Placement.Owns reports false).
func (rt *Runtime) Drain(ctx context.Context, match func(Path) bool) {
	list := rt.residentMatching(match)
	for _, in := range list {
		// Marked first: a connection that was being set up when the
		// drain began (its request routed here just before) is refused
		// rather than left attached to an instance the node forgets.
		in.moveOut(1012, "agent moved to another node")
	}
	var wg sync.WaitGroup
	for _, in := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in.waitIdle(ctx)
		}()
	}
	wg.Wait()
	rt.forget(list, "drain")
}

// Drop forgets at once the resident instances that match selects (their
// node lost them): their connections are closed with 1012 and work still
// running on them can no longer write (the placement's fence refuses it).
func (rt *Runtime) Drop(match func(Path) bool) {
	list := rt.residentMatching(match)
	rt.forget(list, "lost")
	for _, in := range list {
		in.moveOut(1012, "agent moved to another node")
	}
}

// ForgetDestroyed drops the resident instances at paths (and below them),
// which another node destroyed (Destroy there deleted their rows): their
// connections are closed with 1000 and work still running on them fails,
// as after a Destroy here. Paths not in memory are skipped.
func (rt *Runtime) ForgetDestroyed(paths []Path) {
	gone := make(map[string]bool, len(paths))
	for _, p := range paths {
		gone[p.String()] = true
	}
	list := rt.residentMatching(func(p Path) bool {
		for n := len(p); n > 0; n-- {
			if gone[p[:n].String()] {
				return true
			}
		}
		return false
	})
	rt.forgetDestroyed(list)
}

// forgetDestroyed forgets destroyed instances and closes their connections.
func (rt *Runtime) forgetDestroyed(list []*instance) {
	rt.mu.Lock()
	for _, in := range list {
		rt.forgetLocked(in)
	}
	rt.mu.Unlock()
	for _, in := range list {
		in.mu.Lock()
		in.destroyed = true
		in.mu.Unlock()
		in.closeConns(1000, "agent destroyed")
	}
}

func (rt *Runtime) residentMatching(match func(Path) bool) []*instance {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []*instance
	for _, in := range rt.instances {
		if match(in.path) {
			out = append(out, in)
		}
	}
	return out
}

func (rt *Runtime) forget(list []*instance, reason string) {
	rt.mu.Lock()
	for _, in := range list {
		rt.forgetLocked(in)
	}
	rt.mu.Unlock()
	for _, in := range list {
		rt.diag.Publish(rt.ctx, diag.ChannelAgent, "evict", in.key, map[string]any{"reason": reason})
	}
}

// waitIdle waits until the instance is not in use, or ctx is done.
func (in *instance) waitIdle(ctx context.Context) {
	rt := in.rt
	for {
		rt.mu.Lock()
		if in.busy == 0 {
			rt.mu.Unlock()
			return
		}
		if in.idleWait == nil {
			in.idleWait = make(chan struct{})
		}
		ch := in.idleWait
		rt.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

func notOwned(path Path) error { return fmt.Errorf("%w: %s", ErrNotOwner, path) }
