// Command cluster measures the throughput of an Agentry cluster: it starts
// a scratch PostgreSQL (internal/testkit/pgtest) and, for each node count, that
// many node processes on loopback (this same binary, subcommand "node",
// through internal/clusterserve as `agentry serve --postgres` does), places
// parents on every node, and drives awaited agent-tool fan-outs through the
// nodes. Each parent's children are placed by their own path, so they run
// on all nodes; a child on another node than its parent is started by a
// node-to-node call and followed through the database.
//
// Rounds alternate the node counts (1 2 4 1 2 4 …), each on a fresh
// database and fresh processes. Each measurement prints child runs/s, the
// CPU the nodes and PostgreSQL spent per run, the store's commits and
// round trips per run (counted by every node's store/postgres), the
// PostgreSQL commits per run counted by the server (pg_stat_database:
// everything, lease renewals included), the background cost of the idle
// cluster (heartbeats and lease renewals) and, with two nodes or more, the
// failover time after a kill -9 of one node. /proc/loadavg is printed
// before and after each figure. The summary gives the median and range of
// each figure over the rounds.
//
//	go run ./bench/cluster -nodes 1,2,4 -rounds 3
//
// The child is the benchmarks' trivial Researcher (20 × "abcde", no model
// delay), so the figures are the framework's own cost per run.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/proccpu"
	"github.com/agentry/agentry/internal/testkit/pgtest"
)

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == "node" {
		err = runNode(os.Args[2:])
	} else {
		err = drive(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

// config is the driver's flags.
type config struct {
	nodes    []int
	rounds   int
	parents  int
	fanOut   int
	batches  int
	lease    time.Duration
	idle     time.Duration
	failover bool
	postgres string
	logDir   string
}

func drive(args []string) error {
	fs := flag.NewFlagSet("cluster", flag.ExitOnError)
	nodes := fs.String("nodes", "1,2,4", "node counts to measure, comma-separated")
	var c config
	fs.IntVar(&c.rounds, "rounds", 3, "rounds; each measures every node count once")
	fs.IntVar(&c.parents, "parents", 8, "parents, spread evenly over the nodes")
	fs.IntVar(&c.fanOut, "fanout", 100, "children per fan-out")
	fs.IntVar(&c.batches, "batches", 3, "fan-outs per parent and measurement (all parents at once, one after another)")
	fs.DurationVar(&c.lease, "lease", 10*time.Second, "the nodes' shard lease")
	fs.DurationVar(&c.idle, "idle", 5*time.Second, "how long to measure the idle cluster's background cost")
	fs.BoolVar(&c.failover, "failover", true, "with 2 nodes or more, kill -9 one node at the end and time the failover")
	fs.StringVar(&c.postgres, "postgres", "", "an existing cluster's admin URL (default: a scratch cluster by internal/testkit/pgtest)")
	fs.StringVar(&c.logDir, "logs", "", "folder for the nodes' logs (default: a temporary folder)")
	fs.Parse(args)
	for _, s := range strings.Split(*nodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 16 {
			return fmt.Errorf("bad -nodes %q", *nodes)
		}
		c.nodes = append(c.nodes, n)
	}
	if c.logDir == "" {
		d, err := os.MkdirTemp("", "agentry-cluster-bench-")
		if err != nil {
			return err
		}
		c.logDir = d
	}
	var pg pgtest.Cluster
	defer pg.Stop()
	newDB := pg.NewDatabase
	if c.postgres != "" {
		newDB = func() (string, error) { return createDatabase(c.postgres) }
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Printf("# %s, %d CPUs (shared), GOMAXPROCS default; parents=%d fanout=%d batches=%d lease=%s; logs in %s\n",
		time.Now().UTC().Format(time.RFC3339), numCPU(), c.parents, c.fanOut, c.batches, c.lease, c.logDir)
	results := map[int][]result{}
	for r := range c.rounds {
		for _, n := range c.nodes {
			url, err := newDB()
			if err != nil {
				return err
			}
			res, err := measure(self, url, n, r, c)
			if err != nil {
				return fmt.Errorf("round %d, %d nodes: %w", r+1, n, err)
			}
			results[n] = append(results[n], res)
			res.print(r+1, n)
		}
	}
	summarize(c, results)
	return nil
}

var dbSeq int

// createDatabase makes a fresh database on an existing cluster.
func createDatabase(admin string) (string, error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	dbSeq++
	name := fmt.Sprintf("agentry_bench_%d_%d", os.Getpid(), dbSeq)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	cfg := conn.Config()
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name), nil
}

// result is one measurement of one node count.
type result struct {
	runs        int // completed child runs
	failed      int // child runs that did not complete
	elapsed     time.Duration
	nodeCPU     time.Duration // all nodes, during the timed part
	pgCPU       time.Duration // PostgreSQL, all its processes
	commits     int64         // the nodes' store commits
	roundTrips  int64
	statements  int64
	views       int64
	retries     int64
	serverXacts int64 // pg_stat_database commits + rollbacks of the database
	heapPerRun  float64
	spread      []int // resident instances of each node after the runs
	loadBefore  string
	loadAfter   string

	idle        time.Duration
	idleNodeCPU time.Duration
	idlePGCPU   time.Duration
	idleXacts   int64

	failover time.Duration // kill -9 to every shard owned by a live node
}

func (r result) runsPerSec() float64 { return float64(r.runs) / r.elapsed.Seconds() }
func (r result) per(v int64) float64 { return float64(v) / float64(r.runs) }
func (r result) perMs(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000 / float64(r.runs)
}

func (r result) print(round, n int) {
	fmt.Printf("round %d nodes=%d: %d runs (%d failed) in %.2fs = %.0f runs/s; node CPU %.2f ms/run, PostgreSQL CPU %.2f ms/run; "+
		"store commits %.2f, round trips %.1f, statements %.1f, read tx %.2f, retries %.3f per run; server xacts %.2f/run; "+
		"heap %.0f B/run; resident instances per node %v; load before %s, after %s\n",
		round, n, r.runs, r.failed, r.elapsed.Seconds(), r.runsPerSec(), r.perMs(r.nodeCPU), r.perMs(r.pgCPU),
		r.per(r.commits), r.per(r.roundTrips), r.per(r.statements), r.per(r.views), r.per(r.retries), r.per(r.serverXacts),
		r.heapPerRun, r.spread, r.loadBefore, r.loadAfter)
	fmt.Printf("round %d nodes=%d idle %.1fs: node CPU %.1f ms/s, PostgreSQL CPU %.1f ms/s, server xacts %.1f/s",
		round, n, r.idle.Seconds(), perSec(r.idleNodeCPU, r.idle), perSec(r.idlePGCPU, r.idle), float64(r.idleXacts)/r.idle.Seconds())
	if r.failover > 0 {
		fmt.Printf("; failover after kill -9 of one node: %.2fs", r.failover.Seconds())
	}
	fmt.Println()
}

func perSec(d, over time.Duration) float64 {
	return float64(d.Microseconds()) / 1000 / over.Seconds()
}

// node is a running node process.
type node struct {
	id   string
	addr string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startNode(self, url, id string, c config, logName string) (*node, error) {
	logf, err := os.Create(logName)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "node", "-postgres", url, "-node-id", id, "-lease", c.lease.String())
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	n := &node{id: id, cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		buf := make([]byte, 0, 256)
		one := make([]byte, 1)
		for {
			if _, err := out.Read(one); err != nil {
				break
			}
			if one[0] == '\n' {
				if a, ok := strings.CutPrefix(string(buf), "listening "); ok {
					addr <- a
				}
				buf = buf[:0]
				continue
			}
			buf = append(buf, one[0])
		}
		io.Copy(io.Discard, out)
	}()
	go func() {
		n.err = cmd.Wait()
		logf.Close()
		close(n.done)
	}()
	select {
	case n.addr = <-addr:
		return n, nil
	case <-n.done:
		return nil, fmt.Errorf("node %s exited before listening: %v (log %s)", id, n.err, logName)
	case <-time.After(60 * time.Second):
		n.kill()
		return nil, fmt.Errorf("node %s did not listen within 60 s (log %s)", id, logName)
	}
}

func (n *node) kill() {
	n.cmd.Process.Kill()
	<-n.done
}

// stop ends the node with SIGTERM (it hands its shards over), or kills it
// after 30 s.
func (n *node) stop() {
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		n.kill()
	}
}

// settle is how long pg_stat_database needs to count every transaction
// that ended.
const settle = 1500 * time.Millisecond

var httpClient = &http.Client{Timeout: 5 * time.Minute}

func getJSON(url string, out any) error {
	resp, err := httpClient.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, out)
}

// owners reads the live owner of each shard.
func owners(ctx context.Context, conn *pgx.Conn) (map[int]string, error) {
	rows, err := conn.Query(ctx, `SELECT shard, owner FROM cluster_shards WHERE owner IS NOT NULL AND expires_at > $1`,
		time.Now().UnixMilli())
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for rows.Next() {
		var s int
		var o string
		if err := rows.Scan(&s, &o); err != nil {
			return nil, err
		}
		out[s] = o
	}
	return out, rows.Err()
}

// waitBalanced waits until the live nodes ids own every shard, each at
// least its share minus 8.
func waitBalanced(ctx context.Context, conn *pgx.Conn, ids []string, limit time.Duration) (map[int]string, error) {
	deadline := time.Now().Add(limit)
	for {
		own, err := owners(ctx, conn)
		if err == nil {
			count := map[string]int{}
			for _, o := range own {
				count[o]++
			}
			ok, total := true, 0
			for _, id := range ids {
				ok = ok && count[id] >= cluster.DefaultShards/len(ids)-8
				total += count[id]
			}
			if ok && total == cluster.DefaultShards {
				return own, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("shards not balanced over %v within %v (last error %v)", ids, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// measure runs one measurement of n nodes on the database at url.
func measure(self, url string, n, round int, c config) (res result, err error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return res, err
	}
	defer conn.Close(ctx)
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return res, err
	}
	postmaster, err := proccpu.Parent(backend)
	if err != nil {
		return res, err
	}
	nodes := make([]*node, 0, n)
	defer func() {
		var wg sync.WaitGroup
		for _, nd := range nodes {
			wg.Add(1)
			go func() { defer wg.Done(); nd.stop() }()
		}
		wg.Wait()
	}()
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("n%d", i+1)
		nd, err := startNode(self, url, ids[i], c, fmt.Sprintf("%s/r%d-n%d-%s.log", c.logDir, round+1, n, ids[i]))
		if err != nil {
			return res, err
		}
		nodes = append(nodes, nd)
	}
	own, err := waitBalanced(ctx, conn, ids, 60*time.Second)
	if err != nil {
		return res, err
	}
	// Let every node read the final owners (a Step each quarter lease).
	time.Sleep(c.lease / 2)
	addr := map[string]string{}
	for _, nd := range nodes {
		addr[nd.id] = nd.addr
	}
	parents := chooseParents(own, n, round, c)
	var failed atomic.Int64
	fan := func(tag string, k int) error {
		var wg sync.WaitGroup
		errs := make(chan error, len(parents))
		for i, p := range parents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out fanOutResult
				u := fmt.Sprintf("http://%s/agents/assistant/%s/fan-out?n=%d&tag=%s-%d", addr[p.node], p.name, k, tag, i)
				if err := getJSON(u, &out); err != nil {
					errs <- err
					return
				}
				if out.Statuses["completed"] != k {
					// Counted and printed, not fatal: a figure with failed
					// runs is reported as such.
					failed.Add(int64(k - out.Statuses["completed"]))
					fmt.Fprintf(os.Stderr, "round %d nodes=%d: parent %s on %s: %v %s\n", round+1, n, p.name, p.node, out.Statuses, out.Error)
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	// Warm-up: connections, prepared statements, the tables' first rows.
	if err := fan("warm", 10); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	// pg_stat_database counts a backend's transactions when it reports
	// them, at most once a second and about a second after it went idle:
	// let the counters settle before each snapshot.
	time.Sleep(settle)
	before, err := snapshot(ctx, conn, nodes, postmaster, true)
	if err != nil {
		return res, err
	}
	res.loadBefore = loadavg()
	t0 := time.Now()
	for b := range c.batches {
		if err := fan(fmt.Sprintf("b%d", b), c.fanOut); err != nil {
			return res, err
		}
	}
	res.elapsed = time.Since(t0)
	res.loadAfter = loadavg()
	time.Sleep(settle)
	after, err := snapshot(ctx, conn, nodes, postmaster, true)
	if err != nil {
		return res, err
	}
	res.failed = int(failed.Load())
	res.runs = c.batches*c.fanOut*len(parents) - res.failed
	res.nodeCPU, res.pgCPU = after.nodeCPU-before.nodeCPU, after.pgCPU-before.pgCPU
	res.commits = after.store.Committed - before.store.Committed
	res.roundTrips = after.store.RoundTrips - before.store.RoundTrips
	res.statements = after.store.Statements - before.store.Statements
	res.views = after.store.Views - before.store.Views
	res.retries = after.store.Retries - before.store.Retries
	res.serverXacts = after.xacts - before.xacts
	res.heapPerRun = float64(int64(after.heap)-int64(before.heap)) / float64(res.runs)
	res.spread = after.resident
	if err := measureIdle(ctx, conn, nodes, postmaster, c, &res); err != nil {
		return res, err
	}
	// The timed figures include the settling wait after the runs (and the
	// stats reads): take the idle cluster's cost of that time off.
	settled := after.at.Sub(t0) - res.elapsed
	frac := settled.Seconds() / res.idle.Seconds()
	res.nodeCPU -= time.Duration(frac * float64(res.idleNodeCPU))
	res.pgCPU -= time.Duration(frac * float64(res.idlePGCPU))
	res.serverXacts -= int64(frac*float64(res.idleXacts)) + 1
	if c.failover && n >= 2 {
		victim := nodes[len(nodes)-1]
		t := time.Now()
		victim.kill()
		nodes = nodes[:len(nodes)-1]
		if _, err := waitBalanced(ctx, conn, ids[:len(ids)-1], 60*time.Second); err != nil {
			return res, fmt.Errorf("failover: %w", err)
		}
		res.failover = time.Since(t)
	}
	return res, nil
}

// parent is a parent agent of a measurement and the node that owns it.
type parent struct{ name, node string }

// chooseParents picks the parents of a measurement of n nodes: the first
// names whose shard each node owns (own), parents/n per node; each
// parent's requests go to its owner.
func chooseParents(own map[int]string, n, round int, c config) []parent {
	var parents []parent
	quota := map[string]int{}
	for i := 0; len(parents) < c.parents && i < 100_000; i++ {
		name := fmt.Sprintf("p%d-%d-%d", round+1, n, i)
		o := own[cluster.ShardOf(agent.Root("Assistant", name), cluster.DefaultShards)]
		if quota[o] >= (c.parents+n-1)/n {
			continue
		}
		quota[o]++
		parents = append(parents, parent{name, o})
	}
	return parents
}

// measureIdle records in res what the idle cluster costs: heartbeats and
// lease renewals only, over c.idle.
func measureIdle(ctx context.Context, conn *pgx.Conn, nodes []*node, postmaster int, c config, res *result) error {
	idle0, err := snapshot(ctx, conn, nodes, postmaster, false)
	if err != nil {
		return err
	}
	time.Sleep(c.idle)
	idle1, err := snapshot(ctx, conn, nodes, postmaster, false)
	if err != nil {
		return err
	}
	res.idle = idle1.at.Sub(idle0.at)
	res.idleNodeCPU, res.idlePGCPU = idle1.nodeCPU-idle0.nodeCPU, idle1.pgCPU-idle0.pgCPU
	res.idleXacts = idle1.xacts - idle0.xacts - 1 // the snapshot's own read
	return nil
}

// snap is the counters at one moment.
type snap struct {
	at       time.Time
	nodeCPU  time.Duration
	pgCPU    time.Duration
	xacts    int64
	store    storeTotals
	heap     uint64
	resident []int
}

type storeTotals struct{ Committed, RoundTrips, Statements, Views, Retries int64 }

func snapshot(ctx context.Context, conn *pgx.Conn, nodes []*node, postmaster int, stats bool) (snap, error) {
	s := snap{at: time.Now()}
	if stats {
		for _, nd := range nodes {
			var ns nodeStats
			if err := getJSON("http://"+nd.addr+"/bench/stats?gc=1", &ns); err != nil {
				return s, err
			}
			s.store.Committed += ns.Store.Committed
			s.store.RoundTrips += ns.Store.RoundTrips
			s.store.Statements += ns.Store.Statements
			s.store.Views += ns.Store.Views
			s.store.Retries += ns.Store.Retries
			s.heap += ns.HeapAlloc
			s.resident = append(s.resident, ns.Resident)
		}
	}
	for _, nd := range nodes {
		t, err := proccpu.Process(nd.cmd.Process.Pid, false)
		if err != nil {
			return s, err
		}
		s.nodeCPU += t
	}
	pg, err := proccpu.Tree(postmaster)
	if err != nil {
		return s, err
	}
	s.pgCPU = pg
	if err := conn.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.xacts); err != nil {
		return s, err
	}
	return s, nil
}

func summarize(c config, results map[int][]result) {
	fmt.Println()
	fmt.Println("| nodes | child runs/s median (range) | node CPU ms/run | PostgreSQL CPU ms/run | store commits/run | round trips/run | server xacts/run | idle: node CPU ms/s, PG CPU ms/s, xacts/s | failover after kill -9 | failed runs |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, n := range c.nodes {
		rs := results[n]
		col := func(f func(result) float64) []float64 {
			out := make([]float64, len(rs))
			for i, r := range rs {
				out[i] = f(r)
			}
			return out
		}
		rps := col(result.runsPerSec)
		fo := "—"
		if rs[0].failover > 0 {
			fo = rangeOf(col(func(r result) float64 { return r.failover.Seconds() }), "%.2f") + " s"
		}
		failed := 0
		for _, r := range rs {
			failed += r.failed
		}
		fmt.Printf("| %d | %s | %s | %s | %s | %s | %s | %s, %s, %s | %s | %d |\n", n,
			rangeOf(rps, "%.0f"),
			rangeOf(col(func(r result) float64 { return r.perMs(r.nodeCPU) }), "%.2f"),
			rangeOf(col(func(r result) float64 { return r.perMs(r.pgCPU) }), "%.2f"),
			rangeOf(col(func(r result) float64 { return r.per(r.commits) }), "%.2f"),
			rangeOf(col(func(r result) float64 { return r.per(r.roundTrips) }), "%.1f"),
			rangeOf(col(func(r result) float64 { return r.per(r.serverXacts) }), "%.2f"),
			rangeOf(col(func(r result) float64 { return perSec(r.idleNodeCPU, r.idle) }), "%.1f"),
			rangeOf(col(func(r result) float64 { return perSec(r.idlePGCPU, r.idle) }), "%.1f"),
			rangeOf(col(func(r result) float64 { return float64(r.idleXacts) / r.idle.Seconds() }), "%.1f"),
			fo, failed)
	}
}

// rangeOf formats the median and, with more than one value, the range.
func rangeOf(v []float64, f string) string {
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if len(s) == 1 {
		return fmt.Sprintf(f, med)
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", med, s[0], s[len(s)-1])
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\nprocessor") + 1
}
