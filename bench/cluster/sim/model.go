// Command sim extrapolates the cluster's measured costs to 64 nodes and
// one million instances with a small deterministic model (no randomness,
// no timing: the same flags print the same table). It does not measure
// anything; its inputs are the per-operation costs that bench/cluster and
// test/bench measured on the development machine (BENCHMARKS.md, "Cluster
// mode"), given as flags with those figures as defaults.
//
//	go run ./bench/cluster/sim
//	go run ./bench/cluster/sim -pg-cores 32 -child-seconds 10
//
// The model, per node count N (every figure per second unless said):
//
//   - Placement. Children hash to shards independently of their parent, so
//     a fraction 1 − 1/N of a parent's children run on another node.
//   - Cost of one awaited child run = the local run's cost + (1 − 1/N) ×
//     the extra of a remote one (the node-to-node start, the follow through
//     the database), separately for node CPU, PostgreSQL CPU, commits and
//     round trips; the two were measured with 1 node (all local) and 2
//     nodes (half remote). A parent follows a remote child by reading it
//     every poll interval (100 ms): a child that runs T seconds costs T/0.1
//     more reads (PollRoundTrips round trips and PollPGCPU each). While it
//     streams, a child commits its chunks (StreamCommits and StreamTrips
//     per second, measured with a child that streams 20 chunks a second),
//     local or remote alike.
//   - Capacity. Nodes: N × NodeCores × Utilization of CPU. PostgreSQL: one
//     primary with PGCores × Utilization of CPU and at most PGCommits
//     commits per second (the WAL flush; with a synchronous standby each
//     group commit also waits a network round trip). Each node's pool:
//     MaxConns connections, each busy for round trips × RTT per run.
//     Throughput is the least of the four; the table names the bound.
//   - Background. Each node runs a lease step every Lease/4: a heartbeat,
//     a renewal of its shards, and reads of the membership and of all
//     shard rows. Its PostgreSQL cost is StepPGBase + StepPGPerShard × the
//     shards it owns + StepPGPerRead × all shards.
//   - Failover after a node's death (kill -9): its shards are taken once
//     their leases expire, up to one lease after its last renewal, plus up
//     to a quarter lease until the survivors' next step. Then each survivor
//     wakes the instances with unfinished work of the shards it took (8 at
//     a time, HydrateMs each): the dead node's in-flight runs (by Little's
//     law, its throughput × run time). The other instances of those shards
//     hydrate on their next request.
//   - Instances. I instances stored, spread evenly. Resident memory is
//     HeapPerInstance each while resident (a node keeps at most
//     MaxResident, the runtime's default 10,000, and evicts the least
//     recently used). After a death, if every instance is active (has a
//     request within the window), the dead node's I/N instances are
//     hydrated again by the survivors: a hydration storm of I/N ×
//     HydrateRoundTrips round trips, carried by the survivors' pools (RTT
//     each) and by PostgreSQL's spare CPU (a run's PostgreSQL CPU per round
//     trip), whichever is slower; the live load is not counted in it.
package main

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Params are the model's inputs: measured costs and the assumed sizes of
// a deployment.
type Params struct {
	// Measured per awaited child run (trivial child, no model time).
	NodeCPUms      float64 // node CPU of a run whose child is local
	NodeCPURemote  float64 // extra node CPU when the child is on another node
	PGCPUms        float64 // PostgreSQL CPU of a local run
	PGCPURemote    float64 // extra PostgreSQL CPU of a remote run
	Commits        float64 // commits of a local run
	CommitsRemote  float64 // extra commits of a remote run
	RoundTrips     float64 // round trips of a local run
	RoundTripsRem  float64 // extra round trips of a remote run
	PollRoundTrips float64 // round trips of one poll of a remote child
	PollPGCPUms    float64 // PostgreSQL CPU of one poll
	PollInterval   float64 // seconds between polls (agenttool.DefaultRemotePoll)
	StreamCommits  float64 // commits per second of a child's streaming (chunk flushes)
	StreamTrips    float64 // round trips per second of a child's streaming

	// Measured per lease step (every Lease/4 per node).
	StepPGBase     float64 // ms of PostgreSQL CPU
	StepPGPerShard float64 // ms per shard owned (renewal)
	StepPGPerRead  float64 // ms per shard row read (all shards, every step)

	// Measured per hydration of a stored instance.
	HydrateMs         float64 // wall time (loopback)
	HydrateRoundTrips float64
	HeapPerInstance   float64 // bytes of Go heap per resident instance

	// Assumed deployment.
	NodeCores    float64 // CPU cores per node
	PGCores      float64 // CPU cores of the PostgreSQL primary
	PGCommits    float64 // commits per second the primary can flush
	Utilization  float64 // usable fraction of a CPU before queueing dominates
	MaxConns     float64 // store pool per node
	RTTms        float64 // node ↔ PostgreSQL round trip
	Lease        float64 // seconds
	Shards       float64
	Instances    float64
	MaxResident  float64 // resident instances per node
	ChildSeconds float64 // how long a child run lasts (model time); 0 = the measured trivial child
	RunLatency   float64 // seconds a run is in flight besides ChildSeconds (measured: fan-out latency)
}

// Row is the model's answer for one node count.
type Row struct {
	Nodes        int
	Remote       float64 // fraction of children on another node than the parent
	NodeBound    float64 // runs/s the nodes' CPU allows
	PGCPUBound   float64 // runs/s PostgreSQL's CPU allows
	CommitBound  float64 // runs/s PostgreSQL's commit rate allows
	PoolBound    float64 // runs/s the nodes' pools allow
	Throughput   float64 // the least of the four
	Bound        string  // which one
	PGCores      float64 // PostgreSQL cores busy at Throughput (runs and lease steps)
	PGCommitsSec float64
	RoundTripSec float64
	BackgroundPG float64 // PostgreSQL cores busy with lease steps alone
	Connections  float64 // PostgreSQL connections of all nodes
	FailoverSec  float64 // worst case: lease + quarter lease + wake of in-flight work
	InFlight     float64 // runs in flight on one node at Throughput
	PerNode      float64 // stored instances per node
	MemPerNodeMB float64 // resident instances' heap per node, at most MaxResident
	StormSec     float64 // re-hydrating a dead node's I/N instances with the survivors' spare pool
}

// Model computes the rows for the node counts.
func Model(p Params, nodes []int) []Row {
	out := make([]Row, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, row(p, n))
	}
	return out
}

func row(p Params, n int) Row {
	N := float64(n)
	r := Row{Nodes: n, Remote: 1 - 1/N}
	polls := 0.0
	if p.PollInterval > 0 {
		// A remote child is read once when it starts and then every
		// interval while it runs.
		polls = math.Ceil(p.ChildSeconds / p.PollInterval)
	}
	// A child that streams for ChildSeconds flushes its chunks in commits
	// of their own, wherever it runs; PostgreSQL's CPU for them is that of
	// a run's round trip.
	perTrip := p.PGCPUms / p.RoundTrips
	streamTrips := p.ChildSeconds * p.StreamTrips
	nodeCPU := p.NodeCPUms + r.Remote*p.NodeCPURemote
	pgCPU := p.PGCPUms + streamTrips*perTrip + r.Remote*(p.PGCPURemote+polls*p.PollPGCPUms)
	commits := p.Commits + p.ChildSeconds*p.StreamCommits + r.Remote*p.CommitsRemote
	trips := p.RoundTrips + streamTrips + r.Remote*(p.RoundTripsRem+polls*p.PollRoundTrips)

	// Background: lease steps of every node.
	stepsPerSec := N * 4 / p.Lease
	stepPG := p.StepPGBase + p.StepPGPerShard*p.Shards/N + p.StepPGPerRead*p.Shards
	r.BackgroundPG = stepsPerSec * stepPG / 1000
	pgCoresForRuns := p.PGCores*p.Utilization - r.BackgroundPG

	r.NodeBound = N * p.NodeCores * p.Utilization * 1000 / nodeCPU
	r.PGCPUBound = math.Max(0, pgCoresForRuns) * 1000 / pgCPU
	r.CommitBound = p.PGCommits / commits
	r.PoolBound = N * p.MaxConns / (trips * p.RTTms / 1000)
	r.Throughput, r.Bound = r.NodeBound, "node CPU"
	for _, b := range []struct {
		v    float64
		name string
	}{{r.PGCPUBound, "PostgreSQL CPU"}, {r.CommitBound, "PostgreSQL commits"}, {r.PoolBound, "connection pools"}} {
		if b.v < r.Throughput {
			r.Throughput, r.Bound = b.v, b.name
		}
	}
	r.PGCommitsSec = r.Throughput * commits
	r.RoundTripSec = r.Throughput * trips
	r.PGCores = r.Throughput*pgCPU/1000 + r.BackgroundPG
	r.Connections = N * (p.MaxConns + 4) // + the lease manager's pgxpool (4 on small machines)

	// Failover: detection, then the wake of the dead node's in-flight work.
	r.InFlight = r.Throughput / N * (p.RunLatency + p.ChildSeconds)
	if n > 1 {
		perSurvivor := r.InFlight / (N - 1)
		wake := math.Ceil(perSurvivor/8) * p.HydrateMs / 1000
		r.FailoverSec = p.Lease + p.Lease/4 + wake
		// Hydration storm: the dead node's share of all instances, over
		// the survivors' pools (each hydration holds a connection for its
		// round trips).
		// round trips and over PostgreSQL's spare CPU (at the measured
		// PostgreSQL CPU per round trip of a run), whichever is slower.
		dead := p.Instances / N
		poolTrips := (N - 1) * p.MaxConns / (p.RTTms / 1000) // round trips/s all survivors' pools can carry
		perTrip := p.PGCPUms / p.RoundTrips / 1000           // PostgreSQL CPU seconds per round trip
		cpuSec := dead * p.HydrateRoundTrips * perTrip / math.Max(p.PGCores*p.Utilization-r.BackgroundPG, 1e-9)
		r.StormSec = math.Max(dead*p.HydrateRoundTrips/poolTrips, cpuSec)
	}
	r.PerNode = p.Instances / N
	resident := math.Min(r.PerNode, p.MaxResident)
	r.MemPerNodeMB = resident * p.HeapPerInstance / (1 << 20)
	return r
}

// Print writes the assumptions and the table as Markdown.
func Print(w io.Writer, p Params, rows []Row) {
	fmt.Fprintf(w, "Inputs (measured): node CPU %.2f ms/run local, +%.2f ms remote; PostgreSQL CPU %.2f ms/run local, +%.2f ms remote; "+
		"commits %.2f local, +%.2f remote; round trips %.1f local, +%.1f remote; poll %.0f round trips, %.2f ms PostgreSQL CPU, every %.1f s; streaming child %.0f commits and %.0f round trips a second; "+
		"lease step %.2f ms + %.4f ms/shard owned + %.4f ms/shard read; hydration %.2f ms, %.0f round trips; %.0f B heap per resident instance.\n",
		p.NodeCPUms, p.NodeCPURemote, p.PGCPUms, p.PGCPURemote, p.Commits, p.CommitsRemote, p.RoundTrips, p.RoundTripsRem,
		p.PollRoundTrips, p.PollPGCPUms, p.PollInterval, p.StreamCommits, p.StreamTrips, p.StepPGBase, p.StepPGPerShard, p.StepPGPerRead,
		p.HydrateMs, p.HydrateRoundTrips, p.HeapPerInstance)
	fmt.Fprintf(w, "Assumed: %.0f cores per node, PostgreSQL primary with %.0f cores and %.0f commits/s, %.0f %% usable CPU, "+
		"%.0f connections per node, RTT %.2f ms, lease %.0f s, %.0f shards, %s instances (at most %.0f resident per node), child run %.1f s of model time, %.2f s in flight besides.\n\n",
		p.NodeCores, p.PGCores, p.PGCommits, p.Utilization*100, p.MaxConns, p.RTTms, p.Lease, p.Shards, thousands(p.Instances),
		p.MaxResident, p.ChildSeconds, p.RunLatency)
	fmt.Fprintln(w, "| nodes | remote children | node-CPU bound | PG-CPU bound | commit bound | pool bound | **runs/s** | bound | PG cores busy (leases) | commits/s | round trips/s | PG connections | failover | instances/node | heap/node | re-hydrate I/N |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fo, storm := "—", "—"
		if r.Nodes > 1 {
			fo = fmt.Sprintf("%.1f s", r.FailoverSec)
			storm = fmt.Sprintf("%.1f s", r.StormSec)
		}
		fmt.Fprintf(w, "| %d | %.0f %% | %s | %s | %s | %s | **%s** | %s | %.1f (%.2f) | %s | %s | %s | %s | %s | %.0f MB | %s |\n",
			r.Nodes, r.Remote*100, thousands(r.NodeBound), thousands(r.PGCPUBound), thousands(r.CommitBound), thousands(r.PoolBound),
			thousands(r.Throughput), r.Bound, r.PGCores, r.BackgroundPG, thousands(r.PGCommitsSec), thousands(r.RoundTripSec),
			thousands(r.Connections), fo, thousands(r.PerNode), r.MemPerNodeMB, storm)
	}
}

// thousands formats v rounded, with commas.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
