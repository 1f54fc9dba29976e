package cluster

import (
	"context"
	"fmt"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/store"
)

// Fence is the check that every write transaction of the instance at path
// runs first (agent.Options.Placement). It refuses at once when this node
// is past the lease's local deadline or no longer holds it, and otherwise
// locks the shard's lease row (FOR KEY SHARE) and compares its owner and
// epoch with the lease this node acquired. The lock lasts until the
// transaction ends. A takeover locks the row FOR UPDATE, which conflicts
// with it, so the takeover skips the shard until the transaction ended (or
// the transaction, arriving second, reads the new epoch and fails): a
// transaction either commits before the takeover or fails. The owner's
// own renewals (plain UPDATEs, FOR NO KEY UPDATE) do not conflict with it,
// so writes never hold up a renewal, and two fences in one transaction
// (a child's and its parent's) cannot deadlock with one. The transaction's idle timeout is set to a quarter of the lease,
// so a node paused inside a transaction (SIGSTOP) loses the transaction,
// and the lock, to the database instead of holding the shard.
func (n *Node) Fence(ctx context.Context, tx store.Tx, path agent.Path) error {
	s := n.ShardOf(path)
	now := n.clock.Now()
	n.mu.Lock()
	l, ok := n.owned[s]
	var epoch int64
	if ok {
		epoch = l.epoch
		ok = now.Before(l.deadline)
	}
	n.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s (shard %d)", ErrNotOwner, path, s)
	}
	var owner string
	var got int64
	var set string
	err := tx.QueryRow(ctx, `SELECT set_config('idle_in_transaction_session_timeout', ?, true), COALESCE(owner, ''), epoch
		FROM cluster_shards WHERE shard = ? FOR KEY SHARE`, fmt.Sprint((n.cfg.Lease/4).Milliseconds()), s).Scan(&set, &owner, &got)
	if err != nil {
		return fmt.Errorf("cluster: fence shard %d: %w", s, err)
	}
	if owner != n.cfg.NodeID || got != epoch {
		n.mu.Lock()
		if cur := n.owned[s]; cur != nil && cur.epoch == epoch {
			delete(n.owned, s)
			n.mu.Unlock()
			n.lost([]int{s})
		} else {
			n.mu.Unlock()
		}
		return fmt.Errorf("%w: shard %d is at epoch %d of %q, this node held epoch %d", ErrFenced, s, got, owner, epoch)
	}
	return nil
}
