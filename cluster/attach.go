package cluster

import (
	"context"

	"github.com/agentry/agentry/agent"
)

// A node files its instances' wake reasons under their shards.
var _ agent.Sharder = (*Node)(nil)

// Attach makes rt follow this node's leases: the instances of acquired
// shards with unfinished work are woken (and their schedules fire here),
// the instances of shards handed over are drained, and those of lost
// shards are dropped. rt must have been created with this node as its
// Options.Placement. Call Attach before Run; hooks set in Config are kept.
func (n *Node) Attach(rt *agent.Runtime) {
	if n.cfg.Acquired == nil {
		n.cfg.Acquired = func(ctx context.Context, shards []int) {
			if err := rt.WakeShards(ctx, shards); err != nil && ctx.Err() == nil {
				n.log.Error("cluster: wake acquired shards", "err", err)
			}
		}
	}
	if n.cfg.Lost == nil {
		n.cfg.Lost = func(shards []int) {
			in := n.shardSet(shards)
			// Lost may be told inside a refused transaction: drop the
			// instances from a goroutine of their own.
			go rt.Drop(func(p agent.Path) bool { return in[n.ShardOf(p)] })
		}
	}
	if n.cfg.Drain == nil {
		n.cfg.Drain = func(ctx context.Context, shards []int) {
			in := n.shardSet(shards)
			rt.Drain(ctx, func(p agent.Path) bool { return in[n.ShardOf(p)] })
		}
	}
}

func (n *Node) shardSet(shards []int) map[int]bool {
	m := make(map[int]bool, len(shards))
	for _, s := range shards {
		m[s] = true
	}
	return m
}
