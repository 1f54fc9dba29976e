package cluster

import (
	"errors"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/store"
)

// TestLapsedLeaseIsUndecided: a write past the node's local deadline,
// while the node still holds the lease (its next round has not run), is
// refused with an error that wraps store.ErrUndecided as well as
// ErrNotOwner: that round may renew the lease under the same epoch, and
// the hydration then writes again, so the refusal must not be final (the
// store runs the transaction again). Once the round decided, the answer is
// final either way: renewed, the write passes; taken by another node, it
// is refused without ErrUndecided. Before, the refusal in between was
// final, and in TestPostgresRestartDuringFanOut a chat turn whose chunks it
// refused was aborted while its lease was renewed, so the turn's end
// committed "aborted" (and a finish hook's write refused the same way left
// its end undelivered, with no later hydration to deliver it).
func TestLapsedLeaseIsUndecided(t *testing.T) {
	d := newDB(t)
	clock := clockwork.NewFakeClock()
	a := join(t, d, "a", clock, nil)
	step(t, a)
	p := pathOnShard(t, 3)
	epoch, ok := a.Epoch(p)
	if !ok {
		t.Fatal("a does not serve the shard it acquired")
	}
	clock.Advance(a.Lease() * 3 / 4) // the local deadline, not the expiry
	err := fenceAt(t, d, a, p, epoch)
	if !errors.Is(err, ErrNotOwner) || !errors.Is(err, store.ErrUndecided) {
		t.Fatalf("write past the local deadline of a held lease: %v, want ErrNotOwner and store.ErrUndecided", err)
	}
	step(t, a) // the next round renews it, same epoch
	if cur, ok := a.Epoch(p); !ok || cur != epoch {
		t.Fatalf("renewed lease at epoch %d (%v), want %d", cur, ok, epoch)
	}
	if err := fenceAt(t, d, a, p, epoch); err != nil {
		t.Fatalf("write of the same hydration after the renewal: %v", err)
	}

	// Lapsed again, and this time another node takes the shard: a's next
	// round drops it, and the refusal is final.
	clock.Advance(a.Lease() + time.Millisecond)
	if err := fenceAt(t, d, a, p, epoch); !errors.Is(err, store.ErrUndecided) {
		t.Fatalf("write of a lapsed lease: %v, want store.ErrUndecided", err)
	}
	b := join(t, d, "b", clock, nil)
	step(t, b, a)
	if a.Owns(p) {
		t.Fatal("a still serves a shard b took")
	}
	err = fenceAt(t, d, a, p, epoch)
	if !errors.Is(err, ErrNotOwner) || errors.Is(err, store.ErrUndecided) {
		t.Fatalf("write of a lost lease: %v, want ErrNotOwner, final", err)
	}
	if err := fence(t, d, b, p); err != nil {
		t.Fatalf("write of the new owner: %v", err)
	}
}
