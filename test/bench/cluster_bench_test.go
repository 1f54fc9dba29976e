package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/internal/clusterserve"
	"github.com/agentry/agentry/internal/proccpu"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/postgres"
)

// clusterEnv is a cluster of in-process nodes on one scratch PostgreSQL
// database, each served by internal/clusterserve exactly as `agentry serve
// --postgres` serves it (its own store/postgres pool, shard leases, the
// fence in every write transaction of an instance, the router and the
// node-to-node calls on a loopback port). The counts of a node's store do
// not depend on whether the nodes share a process.
type clusterEnv struct {
	nodes []*clusterNode
	conn  *pgx.Conn
}

type clusterNode struct {
	id   string
	rt   *agent.Runtime
	db   *postgres.DB
	done chan error
}

// quiet logs warnings and errors only (the nodes log every lease move).
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// clusterLease is the nodes' shard lease in the benchmarks: short, so that
// two nodes balance their shards quickly.
const clusterLease = 2 * time.Second

func startClusterEnv(b *testing.B, n int, k *toolKit) *clusterEnv {
	b.Helper()
	url := pg.URL(b)
	ctx, cancel := context.WithCancel(context.Background())
	e := &clusterEnv{}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	e.conn = conn
	b.Cleanup(func() {
		cancel()
		for _, nd := range e.nodes {
			if err := <-nd.done; err != nil && !errors.Is(err, context.Canceled) {
				b.Errorf("node %s: %v", nd.id, err)
			}
		}
		conn.Close(context.Background())
	})
	for i := range n {
		nd := &clusterNode{id: fmt.Sprintf("n%d", i+1), done: make(chan error, 1)}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		built := make(chan struct{})
		build := func(ctx context.Context, db store.DB, place agent.Placement, remote agenttool.Remote) (clusterserve.App, error) {
			defer close(built)
			nd.db = db.(*postgres.DB)
			rt, err := agent.New(ctx, agent.Options{DB: db, Logger: quiet, Placement: place, IdleTimeout: -1})
			if err != nil {
				return clusterserve.App{}, err
			}
			chat.Configure(rt, chat.Config{})
			agenttool.Install(rt, agenttool.Options{Remote: remote})
			rt.MustRegister(agent.Class{Name: "Assistant", New: func() agent.Agent { return &toolParent{k: k} }, Public: true})
			rt.MustRegister(agent.Class{Name: "Researcher", New: func() agent.Agent { return &toolResearcher{k: k} }})
			rt.MustRegister(counter.Class())
			srv := server.New(server.Options{Runtime: rt})
			nd.rt = rt
			return clusterserve.App{Runtime: rt, Handler: srv,
				Close: func() error { srv.Close(); return rt.Close() },
				Route: func(p string) (agent.Path, bool) {
					r, ok, err := srv.ParseRoute(p)
					return r.Path, ok && err == nil
				}}, nil
		}
		go func() {
			nd.done <- clusterserve.Run(ctx, clusterserve.Config{Listener: ln, Postgres: url, NodeID: nd.id,
				Lease: clusterLease, Logger: quiet, Build: build})
		}()
		select {
		case <-built:
		case err := <-nd.done:
			b.Fatalf("node %s: %v", nd.id, err)
		}
		e.nodes = append(e.nodes, nd)
	}
	e.waitBalanced(b)
	return e
}

// waitBalanced waits until the nodes own every shard, each about its
// share, and have read the owners (a lease step each quarter lease).
func (e *clusterEnv) waitBalanced(b *testing.B) {
	b.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		count := map[string]int{}
		rows, err := e.conn.Query(context.Background(),
			`SELECT owner, count(*) FROM cluster_shards WHERE owner IS NOT NULL AND expires_at > $1 GROUP BY owner`, time.Now().UnixMilli())
		if err == nil {
			for rows.Next() {
				var o string
				var c int
				if rows.Scan(&o, &c) == nil {
					count[o] = c
				}
			}
			rows.Close()
		}
		ok, total := true, 0
		for _, nd := range e.nodes {
			ok = ok && count[nd.id] >= cluster.DefaultShards/len(e.nodes)-8
			total += count[nd.id]
		}
		if ok && total == cluster.DefaultShards {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("shards not balanced: %v", count)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(clusterLease / 2)
}

// stats sums the nodes' store counters.
func (e *clusterEnv) stats() postgres.Stats {
	var s postgres.Stats
	for _, nd := range e.nodes {
		x := nd.db.Stats()
		s.Updates += x.Updates
		s.Committed += x.Committed
		s.Retries += x.Retries
		s.Views += x.Views
		s.Statements += x.Statements
		s.RoundTrips += x.RoundTrips
	}
	return s
}

// parent returns a parent Assistant on the first node.
func (e *clusterEnv) parent(b *testing.B, prefix string) *toolParent {
	b.Helper()
	rt := e.nodes[0].rt
	for i := 0; ; i++ {
		p := agent.Root("Assistant", fmt.Sprintf("%s-%d", prefix, i))
		if !rt.Owns(p) {
			continue
		}
		a, err := rt.Get(context.Background(), p)
		if err != nil {
			b.Fatal(err)
		}
		return a.(*toolParent)
	}
}

func reportClusterStats(b *testing.B, s0, s1 postgres.Stats, runs int) {
	per := func(n int64) float64 { return float64(n) / float64(runs) }
	b.ReportMetric(per(s1.Updates-s0.Updates), "tx/run")
	b.ReportMetric(per(s1.Views-s0.Views), "views/run")
	b.ReportMetric(per(s1.Committed-s0.Committed), "commits/run")
	b.ReportMetric(per(s1.Statements-s0.Statements), "stmts/run")
	b.ReportMetric(per(s1.RoundTrips-s0.RoundTrips), "roundtrips/run")
	b.ReportMetric(per(s1.Retries-s0.Retries), "retries/run")
}

// BenchmarkClusterAwaited is BenchmarkAgentToolAwaited/direct/workers=1 and
// BenchmarkAgentToolFanOut/n=100 in cluster mode: the parent is on the
// first of nodes in-process cluster nodes, with the fence in every write
// transaction. With one node every child is local; with two, about half
// the children are on the other node (remote-children/run), started by a
// node-to-node call and followed through the database every 100 ms
// (agenttool.DefaultRemotePoll); awaited-1s-child runs a child that takes
// one second, to measure the cost of that follow per poll. The counts are every node's store
// together. It needs PostgreSQL (internal/testkit/pgtest) and skips without it.
//
//	go test -run '^$' -bench 'ClusterAwaited' -benchtime 100x -count 3 ./test/bench/
func BenchmarkClusterAwaited(b *testing.B) {
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("nodes=%d/awaited", n), func(b *testing.B) { benchClusterAwaited(b, n, newToolKit()) })
		b.Run(fmt.Sprintf("nodes=%d/fan-out=100", n), func(b *testing.B) { benchClusterFanOut(b, n) })
	}
	// The same child, streaming its 20 chunks 50 ms apart (a 1 s run):
	// against nodes=2/awaited, what following a remote child costs per
	// second, i.e. per 10 polls.
	b.Run("nodes=2/awaited-1s-child", func(b *testing.B) {
		k := newToolKit()
		k.researcher = scripted.New(scripted.WithChunkSize(5), scripted.WithDelay(50*time.Millisecond),
			scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text(strings.Repeat("abcde", researcherDeltas))})))
		benchClusterAwaited(b, 2, k)
	})
}

func benchClusterAwaited(b *testing.B, n int, k *toolKit) {
	e := startClusterEnv(b, n, k)
	p := e.parent(b, "awaited")
	ctx := context.Background()
	if err := checkResearch(p.RunOnce(ctx)); err != nil {
		b.Fatal(err)
	}
	remote := 0
	s0 := e.stats()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		id := fmt.Sprintf("a-%d", i)
		res, err := agenttool.RunAgentTool(ctx, p, "Researcher", agenttool.RunOptions{RunID: id, Input: map[string]string{"query": "q"}})
		if err := checkResearch(res, err); err != nil {
			b.Fatal(err)
		}
		if !e.nodes[0].rt.Owns(p.Path().Child("Researcher", id)) {
			remote++
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	waitStableFn(func() int64 { return e.stats().RoundTrips })
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "runs/s")
	b.ReportMetric(float64(remote)/float64(b.N), "remote-children/run")
	reportClusterStats(b, s0, e.stats(), b.N)
}

func benchClusterFanOut(b *testing.B, n int) {
	e := startClusterEnv(b, n, newToolKit())
	ctx := context.Background()
	if err := checkResearch(e.parent(b, "warm").RunOnce(ctx)); err != nil {
		b.Fatal(err)
	}
	const k = 100
	var remote atomic.Int64
	s0 := e.stats()
	var sum time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		p := e.parent(b, fmt.Sprintf("fan%d", i))
		b.StartTimer()
		t0 := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, k)
		for j := range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("f%d-%d", i, j)
				res, err := agenttool.RunAgentTool(ctx, p, "Researcher", agenttool.RunOptions{RunID: id,
					Input: map[string]string{"query": "q"}, ParentToolCallID: "call-fan", DisplayOrder: j})
				if err := checkResearch(res, err); err != nil {
					errs <- err
				}
				if !e.nodes[0].rt.Owns(p.Path().Child("Researcher", id)) {
					remote.Add(1)
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
		sum += time.Since(t0)
	}
	b.StopTimer()
	waitStableFn(func() int64 { return e.stats().RoundTrips })
	b.ReportMetric(float64(k*b.N)/sum.Seconds(), "runs/s")
	b.ReportMetric(float64(remote.Load())/float64(k*b.N), "remote-children/run")
	reportClusterStats(b, s0, e.stats(), k*b.N)
}

// waitStableFn waits until f stops changing for 200 ms (the last writes
// of the runs after their results were returned), ignoring the lease
// steps' own statements, which go through the node's pool, not the store.
func waitStableFn(f func() int64) {
	last := f()
	for {
		time.Sleep(200 * time.Millisecond)
		if v := f(); v == last {
			return
		} else {
			last = v
		}
	}
}

// BenchmarkPostgresHydrate measures hydrating a stored instance on
// PostgreSQL, what a node does for each instance with unfinished work of
// the shards it takes over: b.N Counter instances are written and evicted
// before the timer, then hydrated one after another (rt.Get) on one
// in-process cluster node (fenced store, as after a takeover).
//
//	go test -run '^$' -bench 'PostgresHydrate' -benchtime 2000x -count 3 ./test/bench/
func BenchmarkPostgresHydrate(b *testing.B) {
	e := startClusterEnv(b, 1, newToolKit())
	rt := e.nodes[0].rt
	ctx := context.Background()
	for i := range b.N {
		p := agent.Root("Counter", instanceName(i))
		if _, err := rt.Call(ctx, p, "increment", i+1); err != nil {
			b.Fatal(err)
		}
		rt.Evict(p)
	}
	s0 := e.stats()
	heap0 := heapAfterGC()
	b.ResetTimer()
	for i := range b.N {
		if _, err := rt.Get(ctx, agent.Root("Counter", instanceName(i))); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(heapAfterGC()-heap0)/float64(b.N), "heap-B/live")
	reportClusterStats(b, s0, e.stats(), b.N)
}

// BenchmarkLeaseStep measures one round of the lease protocol
// (cluster.Node.Step: heartbeat, renewal of the node's shards, reads of
// the membership and of all shard rows) of a node that owns 1/nodes of
// the 1,024 shards: the other nodes are rows of cluster_nodes with a
// heartbeat that does not expire, so the node takes its share and no
// more. pg-cpu-µs/step is the whole PostgreSQL server's CPU (all its
// processes, from /proc) per step; nothing else uses the database.
//
//	go test -run '^$' -bench 'LeaseStep' -benchtime 2000x -count 3 ./test/bench/
func BenchmarkLeaseStep(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchLeaseStep(b, n) })
	}
}

func benchLeaseStep(b *testing.B, nodes int) {
	ctx := context.Background()
	url := pg.URL(b)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	node, err := cluster.Join(ctx, cluster.Config{Pool: pool, NodeID: "n0", Addr: "127.0.0.1:1", Lease: time.Minute, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()
	far := time.Now().Add(24 * time.Hour).UnixMilli()
	for i := 1; i < nodes; i++ {
		if _, err := pool.Exec(ctx, `INSERT INTO cluster_nodes (node_id, addr, heartbeat_at, expires_at) VALUES ($1, '127.0.0.1:1', $2, $2)`,
			fmt.Sprintf("other-%d", i), far); err != nil {
			b.Fatal(err)
		}
	}
	share := (cluster.DefaultShards + nodes - 1) / nodes
	for len(node.Owned()) < share {
		if err := node.Step(ctx); err != nil {
			b.Fatal(err)
		}
	}
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		b.Fatal(err)
	}
	postmaster, err := proccpu.Parent(backend)
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	pg0, _ := proccpu.Tree(postmaster)
	self0, _ := proccpu.Process(os.Getpid(), false)
	b.ResetTimer()
	for range b.N {
		if err := node.Step(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	pg1, _ := proccpu.Tree(postmaster)
	self1, _ := proccpu.Process(os.Getpid(), false)
	if got := len(node.Owned()); got != share {
		b.Fatalf("owns %d shards, want %d", got, share)
	}
	b.ReportMetric(float64(share), "shards-owned")
	b.ReportMetric(float64((pg1-pg0).Microseconds())/float64(b.N), "pg-cpu-µs/step")
	b.ReportMetric(float64((self1-self0).Microseconds())/float64(b.N), "node-cpu-µs/step")
}
