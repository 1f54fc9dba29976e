package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// defaults are the costs measured on 2026-12-01 (BENCHMARKS.md, "Cluster
// mode": bench/cluster and BenchmarkClusterAwaited, BenchmarkPostgresHydrate)
// and a deployment's assumed sizes.
func defaults() Params {
	return Params{
		// bench/cluster's quietest pass (load 6–18): 1 node (all local),
		// and the remote extra fitted from 2 nodes (50 % remote: 4.1 and
		// 4.0 ms) and 4 nodes (75 %: 3.5 and 3.7 ms). The loaded passes
		// gave 1.3–5.0 ms of node CPU: CPU per run moves with the load.
		NodeCPUms: 3.21, NodeCPURemote: 3.8,
		PGCPUms: 4.20, PGCPURemote: 3.9,
		Commits: 3.08, CommitsRemote: 3.1,
		RoundTrips: 42.3, RoundTripsRem: 23.7,
		// BenchmarkClusterAwaited/nodes=2/awaited-1s-child against
		// nodes=2/awaited: about 2 read transactions and 6 round trips per
		// poll; PostgreSQL CPU = 6 × about 0.1 ms per round trip of a run.
		PollRoundTrips: 6, PollPGCPUms: 0.6, PollInterval: 0.1,
		// The same benchmark: the 1 s child's 20 chunks cost 11 commits
		// and 56 round trips more than the trivial child's (polls apart).
		StreamCommits: 11, StreamTrips: 56,
		// BenchmarkLeaseStep: 0.35 ms + 5 µs per owned shard (the base
		// includes reading all 1,024 shard rows).
		StepPGBase: 0.35, StepPGPerShard: 0.005, StepPGPerRead: 0,
		// BenchmarkPostgresHydrate (1.0 ms, 10 round trips, 1 commit);
		// heap per resident child with its finished turn from bench/cluster.
		HydrateMs: 1.0, HydrateRoundTrips: 10, HeapPerInstance: 14000,

		// Assumed.
		NodeCores: 2, PGCores: 16, PGCommits: 20000, Utilization: 0.7,
		MaxConns: 16, RTTms: 0.3, Lease: 10, Shards: 1024,
		Instances: 1_000_000, MaxResident: 10_000,
		ChildSeconds: 0, RunLatency: 0.5,
	}
}

func main() {
	p := defaults()
	fs := flag.NewFlagSet("sim", flag.ExitOnError)
	f := func(v *float64, name, usage string) { fs.Float64Var(v, name, *v, usage) }
	f(&p.NodeCPUms, "node-cpu", "node CPU ms per local run (measured)")
	f(&p.NodeCPURemote, "node-cpu-remote", "extra node CPU ms per remote run (measured)")
	f(&p.PGCPUms, "pg-cpu", "PostgreSQL CPU ms per local run (measured)")
	f(&p.PGCPURemote, "pg-cpu-remote", "extra PostgreSQL CPU ms per remote run (measured)")
	f(&p.Commits, "commits", "commits per local run (measured)")
	f(&p.CommitsRemote, "commits-remote", "extra commits per remote run (measured)")
	f(&p.RoundTrips, "round-trips", "round trips per local run (measured)")
	f(&p.RoundTripsRem, "round-trips-remote", "extra round trips per remote run (measured)")
	f(&p.PollRoundTrips, "poll-round-trips", "round trips per poll of a remote child")
	f(&p.PollPGCPUms, "poll-pg-cpu", "PostgreSQL CPU ms per poll")
	f(&p.PollInterval, "poll", "seconds between polls of a remote child")
	f(&p.StreamCommits, "stream-commits", "commits per second of a streaming child (measured)")
	f(&p.StreamTrips, "stream-round-trips", "round trips per second of a streaming child (measured)")
	f(&p.StepPGBase, "step-pg", "PostgreSQL CPU ms per lease step (measured)")
	f(&p.StepPGPerShard, "step-pg-shard", "PostgreSQL CPU ms per owned shard per lease step (measured)")
	f(&p.StepPGPerRead, "step-pg-read", "PostgreSQL CPU ms per shard row read per lease step (measured)")
	f(&p.HydrateMs, "hydrate-ms", "ms per hydration of a stored instance (measured)")
	f(&p.HydrateRoundTrips, "hydrate-round-trips", "round trips per hydration (measured)")
	f(&p.HeapPerInstance, "heap", "bytes of heap per resident instance (measured)")
	f(&p.NodeCores, "node-cores", "CPU cores per node (assumed)")
	f(&p.PGCores, "pg-cores", "CPU cores of the PostgreSQL primary (assumed)")
	f(&p.PGCommits, "pg-commits", "commits per second the primary can flush (assumed)")
	f(&p.Utilization, "utilization", "usable fraction of a CPU (assumed)")
	f(&p.MaxConns, "max-conns", "store connections per node")
	f(&p.RTTms, "rtt", "node to PostgreSQL round trip, ms (assumed)")
	f(&p.Lease, "lease", "shard lease, seconds")
	f(&p.Shards, "shards", "shards")
	f(&p.Instances, "instances", "stored instances")
	f(&p.MaxResident, "max-resident", "resident instances per node")
	f(&p.ChildSeconds, "child-seconds", "model time of a child run, seconds (0: the measured trivial child)")
	f(&p.RunLatency, "run-latency", "seconds a run is in flight besides its model time (measured fan-out latency)")
	nodes := fs.String("nodes", "1,2,4,8,16,32,64", "node counts")
	fs.Parse(os.Args[1:])
	var ns []int
	for _, s := range strings.Split(*nodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "sim: bad -nodes", *nodes)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	Print(os.Stdout, p, Model(p, ns))
}
