package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/store"
)

// Epoch returns the epoch of the lease under which this node serves the
// instance at path now (agent.Placement): ok is false when Owns is.
func (n *Node) Epoch(path agent.Path) (int64, bool) {
	s := n.ShardOf(path)
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	l, ok := n.owned[s]
	if !ok || l.draining || !now.Before(l.deadline) {
		return 0, false
	}
	return l.epoch, true
}

// Fence is the check that every write transaction of the instance at path
// runs first (agent.Options.Placement). epoch is the lease epoch the
// writing hydration of the instance was made under (Epoch), or zero for
// the lease held now. It refuses at once when this node is past the
// lease's local deadline (an error that wraps store.ErrUndecided as well
// while the lease is still held: the node's next round renews or drops
// it, and store/postgres runs the transaction again until then), no
// longer holds it, or holds it at another
// epoch than the hydration's (the node lost the shard and took it back:
// the instance it dropped then may still run, and must not write beside
// the new hydration). Otherwise it locks the shard's lease row (FOR KEY
// SHARE) and compares its owner and epoch with the lease this node
// acquired. The lock lasts until the transaction ends. A takeover locks the
// row FOR UPDATE, which conflicts with it, so the takeover skips the shard
// until the transaction ended (or the transaction, arriving second, reads
// the new epoch and fails): a transaction either commits before the
// takeover or fails. The owner's own renewals (plain UPDATEs, FOR NO KEY
// UPDATE) do not conflict with it, so writes never hold up a renewal, and
// two fences in one transaction (a child's and its parent's) cannot
// deadlock with one.
//
// The lock lasts as long as the transaction, however slow, which is
// harmless while the owner lives: it renews the lease meanwhile and no
// takeover is due. A node paused inside a transaction (SIGSTOP) must not
// keep the shard past its lease, though, so the transaction's idle limit
// (idle_in_transaction_session_timeout) is the time left until the lease
// expires as this node last renewed it: the database ends a transaction
// that stays idle until the lease could have expired, and with it the
// lock, so a takeover waits at most for that transaction's own duration
// beyond the lease. A transaction of a live owner is cut only if it sits
// idle between two statements for that long (three quarters of a lease
// or more, for a node whose renewals are on time).
func (n *Node) Fence(ctx context.Context, tx store.Tx, path agent.Path, epoch int64) error {
	s := n.ShardOf(path)
	now := n.clock.Now()
	n.mu.Lock()
	l, ok := n.owned[s]
	var held int64
	var idle time.Duration
	lapsed := false
	if ok {
		held = l.epoch
		ok = now.Before(l.deadline)
		lapsed = !ok && !l.draining && (epoch == 0 || epoch == held)
		// The lease expires a quarter lease after the local deadline.
		idle = l.deadline.Add(n.cfg.Lease / 4).Sub(now)
	}
	n.mu.Unlock()
	if lapsed {
		// Past the local deadline but not lost: the next lease round
		// renews the lease (under the same epoch, so this hydration
		// writes again) or drops it. Refused now, and undecided: the
		// store runs the transaction again, and this fence decides then.
		return fmt.Errorf("%w: %s (shard %d, lease past its local deadline, not renewed yet): %w", ErrNotOwner, path, s, store.ErrUndecided)
	}
	if !ok {
		return fmt.Errorf("%w: %s (shard %d)", ErrNotOwner, path, s)
	}
	if epoch != 0 && epoch != held {
		return fmt.Errorf("%w: %s was hydrated under epoch %d of shard %d, which this node now holds at epoch %d",
			ErrFenced, path, epoch, s, held)
	}
	var owner string
	var got int64
	var set string
	err := tx.QueryRow(ctx, `SELECT set_config('idle_in_transaction_session_timeout', ?, true), COALESCE(owner, ''), epoch
		FROM cluster_shards WHERE shard = ? FOR KEY SHARE`, fmt.Sprint(idle.Milliseconds()), s).Scan(&set, &owner, &got)
	if err != nil {
		return fmt.Errorf("cluster: fence shard %d: %w", s, err)
	}
	if owner != n.cfg.NodeID || got != held {
		n.mu.Lock()
		if cur := n.owned[s]; cur != nil && cur.epoch == held {
			delete(n.owned, s)
			n.mu.Unlock()
			n.lost([]int{s})
		} else {
			n.mu.Unlock()
		}
		return fmt.Errorf("%w: shard %d is at epoch %d of %q, this node held epoch %d", ErrFenced, s, got, owner, held)
	}
	return nil
}
