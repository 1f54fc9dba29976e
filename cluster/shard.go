// Package cluster runs Agentry on several nodes that share one PostgreSQL
// database. It owns the cluster's own tables (cluster_nodes, the
// membership with heartbeats, and cluster_shards, the shard leases), the
// placement of instances on shards, the lease manager that gives each shard
// one owner at a time, the fencing check that every write transaction of an
// instance runs, and the forwarding of client requests to a shard's owner.
//
// Instances hash by their full path to a fixed set of shards (1,024 by
// default). A node owns a shard while it holds the shard's lease; each
// acquisition raises the lease's epoch. Every write transaction of an
// instance first locks its shard's lease row (SELECT … FOR KEY SHARE) and checks
// that this node still holds it with the epoch the instance was hydrated
// under, as Temporal's RangeID: a node that lost a lease, even one that
// was paused and woke up past it, can no longer write, and neither can an
// instance it dropped with a lost lease once it took the lease back. A node stops serving a shard before its
// lease can expire (its local deadline is a quarter of the lease early).
// docs/cluster.md describes running a cluster and its failure model.
package cluster

import (
	"hash/fnv"

	"github.com/agentry/agentry/agent"
)

// DefaultShards is the number of shards of a cluster. It is fixed for the
// life of a database: changing it would move every instance.
const DefaultShards = 1024

// ShardOf returns the shard of the instance at path among n shards. It
// hashes the full path, so a parent's children (paths of their own) spread
// over the shards and so over the nodes.
func ShardOf(path agent.Path, n int) int {
	h := fnv.New64a()
	h.Write([]byte(path.String()))
	return int(h.Sum64() % uint64(n))
}
