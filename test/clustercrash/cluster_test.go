// Package clustercrash runs cluster nodes as processes on loopback over one
// scratch PostgreSQL and checks the cluster's promises: a parent's children
// spread over the nodes, a request to any node reaches the owner, and the
// death of a node (kill -9) loses no run, fires each finish hook once and
// runs no finished child again.
package clustercrash

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

var (
	pg  pgtest.Cluster
	bin = &testenv.Binary{Pkg: "github.com/agentry/agentry/test/clustercrash/server", Race: testenv.Race}
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pg.Wrap(m), goleak.Cleanup(func(code int) {
		bin.Remove()
		os.Exit(code)
	}))
}

// fanOut is the size of the fan-outs: 1,000, or 300 under -race (three
// race-built nodes on two cores); AGENTRY_CLUSTER_FANOUT overrides it.
func fanOut() int {
	if n, err := strconv.Atoi(os.Getenv("AGENTRY_CLUSTER_FANOUT")); err == nil && n > 0 {
		return n
	}
	if testenv.Race {
		return 300
	}
	return 1000
}

// lease is the nodes' shard lease: 2s, or 5s for race-built nodes, whose
// renewals a loaded two-core machine can hold up past a 2s lease's local
// deadline (1.5s).
func lease() string {
	if testenv.Race {
		return "5s"
	}
	return "2s"
}

type env struct {
	t     *testing.T
	url   string
	pool  *pgxpool.Pool
	nodes map[string]*testenv.Process
}

func newEnv(t *testing.T) *env {
	url := pg.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &env{t: t, url: url, pool: pool, nodes: map[string]*testenv.Process{}}
}

func (e *env) start(id string) *testenv.Process {
	e.t.Helper()
	p := testenv.StartProcess(e.t, 60*time.Second, bin.Path(e.t), "-postgres", e.url, "-node-id", id, "-lease", lease(), "-delay", "10ms")
	e.nodes[id] = p
	return p
}

// until polls cond (a read of the shared database or of a node) until it
// holds, for at most limit. The nodes are other processes: there is no
// event to wait for in this one.
func (e *env) until(limit time.Duration, what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// owners returns the live owner of each shard.
func (e *env) owners() map[int]string {
	rows, err := e.pool.Query(context.Background(), `SELECT shard, owner FROM cluster_shards WHERE owner IS NOT NULL`)
	if err != nil {
		return nil // the nodes have not created the table yet
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var s int
		var o string
		if err := rows.Scan(&s, &o); err != nil {
			e.t.Fatal(err)
		}
		out[s] = o
	}
	return out
}

// balanced waits until each of ids owns a share of the shards.
func (e *env) balanced(ids ...string) {
	e.t.Helper()
	e.until(60*time.Second, "balanced shards", func() bool {
		count := map[string]int{}
		for _, o := range e.owners() {
			count[o]++
		}
		total := 0
		for _, id := range ids {
			if count[id] < cluster.DefaultShards/len(ids)-8 {
				return false
			}
			total += count[id]
		}
		return total == cluster.DefaultShards
	})
}

// fanName returns a Fan instance name whose shard owner is id.
func (e *env) fanName(id string) string { return e.fanNameFrom(id, 0) }

// fanNameFrom is fanName among the names fan{from}, fan{from+1}, ….
func (e *env) fanNameFrom(id string, from int) string {
	own := e.owners()
	for i := from; i < from+100000; i++ {
		name := fmt.Sprint("fan", i)
		if own[cluster.ShardOf(agent.Path{{Class: "Fan", Name: name}}, cluster.DefaultShards)] == id {
			return name
		}
	}
	e.t.Fatal("no name")
	return ""
}

// get GETs path from host and decodes its JSON answer into out; see
// askAgain for a 503.
func get(t *testing.T, host, path string, out any) error {
	c := &http.Client{Timeout: 120 * time.Second}
	status, body, err := askAgain(t, "GET "+path, func() (*http.Response, error) { return c.Get("http://" + host + path) })
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, status, body)
	}
	return json.Unmarshal(body, out)
}

// askAgain sends a request until it is answered with something other than
// a 503 with Retry-After (the agent's shard is being handed over, or its
// owner is unreachable for now), as a client does, for up to 30 s: such a
// refusal comes before the request is handled.
func askAgain(t *testing.T, what string, send func() (*http.Response, error)) (int, []byte, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := send()
		if err != nil {
			return 0, nil, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" && time.Now().Before(deadline) {
			t.Logf("%s: 503 %s; asking again", what, bytes.TrimSpace(body))
			time.Sleep(200 * time.Millisecond) // the client's back-off, shorter than Retry-After's 1 s
			continue
		}
		return resp.StatusCode, body, nil
	}
}

// count runs a count query on the shared database. A query that failed
// for want of the database (a test restarting it) is asked again for up
// to 30 s.
func (e *env) count(q string, args ...any) int {
	var n int
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := e.pool.QueryRow(context.Background(), q, args...).Scan(&n)
		switch {
		case err == nil:
			return n
		case strings.Contains(err.Error(), "does not exist"):
			return 0 // the first instance has not created its tables yet
		case time.Now().Before(deadline) && (pgconn.SafeToRetry(err) || errors.Is(err, io.ErrUnexpectedEOF) ||
			strings.Contains(err.Error(), "connect") || strings.Contains(err.Error(), "SQLSTATE 57P") ||
			strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "EOF")):
			time.Sleep(100 * time.Millisecond) // the database restarts: nothing to wait for here
		default:
			e.t.Fatal(err)
		}
	}
}

// childrenDone counts the finished child runs of the fan.
func (e *env) childrenDone(tag string) int {
	return e.count(`SELECT count(*) FROM agent_tool_child_runs WHERE run_id LIKE $1 AND completed_at IS NOT NULL`, tag+"-%")
}

// parentTerminal counts the parent's registry rows in a terminal state.
func (e *env) parentTerminal(tag string) int {
	return e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id LIKE $1 AND status IN ('completed', 'error', 'aborted', 'interrupted')`, tag+"-%")
}

// check asserts the invariants after a fan-out of n runs under tag on
// the fan name, asked through host: every run completed, each finish hook
// fired once, and no child ran a second turn.
func (e *env) check(host, name, tag string, n int) { e.checkHooks(host, name, tag, n, true) }

// checkHooks is check; exact false accepts finish hooks that have not
// fired (yet), never a hook twice.
func (e *env) checkHooks(host, name, tag string, n int, exact bool) {
	e.t.Helper()
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.dump(tag)
		}
	})
	e.until(90*time.Second, "every run terminal", func() bool { return e.parentTerminal(tag) == n })
	var fin map[string]int
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("finish ledger: %v", fin)
		}
	})
	e.until(30*time.Second, "the finish ledger", func() bool {
		fin = nil
		return get(e.t, host, "/agents/fan/"+name+"/finishes", &fin) == nil && (fin["runs"] == n || !exact)
	})
	if fin["repeated"] != 0 || exact && fin["status:completed"] != n || fin["runs"] != fin["status:completed"] {
		e.t.Errorf("finish ledger: %v (want %d runs, each completed once)", fin, n)
	}
	e.t.Logf("finish ledger: %v", fin)
	if got := e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id LIKE $1 AND status = 'completed'`, tag+"-%"); got != n {
		e.t.Errorf("%d of %d runs completed", got, n)
	}
	// A finished child never runs again: one turn per child.
	if twice := e.count(`SELECT count(*) FROM (SELECT s.instance_id FROM chat_streams s JOIN instances i ON i.id = s.instance_id
		WHERE i.class = 'Worker' AND i.name LIKE $1 GROUP BY s.instance_id HAVING count(*) > 1) x`, tag+"-%"); twice != 0 {
		e.t.Errorf("%d children ran more than one turn", twice)
	}
}

// spread asserts that each node owns at least 20 % of the children.
func (e *env) spread(name, tag string, n int, ids ...string) {
	e.t.Helper()
	own := e.owners()
	count := map[string]int{}
	parent := agent.Path{{Class: "Fan", Name: name}}
	for i := range n {
		count[own[cluster.ShardOf(parent.Child("Worker", fmt.Sprintf("%s-%d", tag, i)), cluster.DefaultShards)]]++
	}
	for _, id := range ids {
		if count[id]*5 < n {
			e.t.Errorf("node %s owns %d of %d children: %v", id, count[id], n, count)
		}
	}
}

func TestFanOutOverThreeNodes(t *testing.T) {
	e := newEnv(t)
	a, b, _ := e.start("a"), e.start("b"), e.start("c")
	e.balanced("a", "b", "c")
	n := fanOut()
	name := e.fanName("a")
	e.spread(name, "f", n, "a", "b", "c")
	// Asked through b, which does not own the parent: forwarded to a.
	var st map[string]int
	t0 := time.Now()
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=f", name, n), &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("fan-out of %d over 3 nodes: %v in %v", n, st, time.Since(t0))
	if st["completed"] != n {
		t.Fatalf("statuses %v, want %d completed", st, n)
	}
	e.check(a.Host, name, "f", n)
}

// killDuring runs a fan-out whose parent is on node "a" and kills victim
// once a quarter of the children finished.
func killDuring(t *testing.T, victim string) {
	e := newEnv(t)
	e.start("a")
	b := e.start("b")
	e.start("c")
	e.balanced("a", "b", "c")
	n := fanOut()
	name := e.fanName("a")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var st map[string]int
		// Through b; the request is cut if a dies.
		err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=k", name, n), &st)
		t.Logf("fan-out request (cut when a dies): %v %v", st, err)
	}()
	e.until(60*time.Second, "a quarter of the children done", func() bool { return e.childrenDone("k") >= n/4 })
	_ = e.nodes[victim].Kill() // its exit status is "killed"
	delete(e.nodes, victim)
	t.Logf("killed %s with %d of %d children done", victim, e.childrenDone("k"), n)
	// The client repeats its request (same run ids) until a live node
	// answers it: the runs that finished return their stored results, the
	// ones in flight are awaited, those never recorded start now.
	var st map[string]int
	e.until(120*time.Second, "the repeated fan-out answered", func() bool {
		st = nil
		return get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=k", name, n), &st) == nil
	})
	if st["completed"] != n {
		t.Errorf("repeated fan-out: %v, want %d completed", st, n)
	}
	e.check(b.Host, name, "k", n)
	wg.Wait()
}

func TestKillParentNode(t *testing.T) { killDuring(t, "a") }

func TestKillChildNode(t *testing.T) { killDuring(t, "c") }

func TestOneNodeTakesEveryShard(t *testing.T) {
	e := newEnv(t)
	a := e.start("a")
	e.balanced("a")
	name := e.fanName("a")
	var st map[string]int
	if err := get(t, a.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=10&tag=one", name), &st); err != nil {
		t.Fatal(err)
	}
	if st["completed"] != 10 {
		t.Fatalf("statuses %v", st)
	}
	e.check(a.Host, name, "one", 10)
}

// dump logs the state of a fan-out's runs, for a failed test.
func (e *env) dump(tag string) {
	for _, q := range []string{
		`SELECT 'parent ' || status, count(*) FROM agent_tool_runs WHERE run_id LIKE $1 GROUP BY status`,
		`SELECT 'child ' || status || ' done=' || (completed_at IS NOT NULL)::text, count(*) FROM agent_tool_child_runs WHERE run_id LIKE $1 GROUP BY 1`,
		`SELECT 'parent error ' || COALESCE(error_message, ''), count(*) FROM agent_tool_runs WHERE run_id LIKE $1 AND status = 'error' GROUP BY 1`,
		`SELECT 'stream ' || s.status, count(*) FROM chat_streams s JOIN instances i ON i.id = s.instance_id WHERE i.name LIKE $1 GROUP BY 1`,
	} {
		rows, err := e.pool.Query(context.Background(), q, tag+"-%")
		if err != nil {
			e.t.Log(err)
			continue
		}
		for rows.Next() {
			var k string
			var n int
			_ = rows.Scan(&k, &n)
			e.t.Logf("%s: %d", k, n)
		}
		rows.Close()
	}
}

// TestPausedOwnerWritesNothingAfterLosingItsLease stops a child's node
// (SIGSTOP) mid fan-out for longer than its leases, until the other nodes
// took all its shards, and then lets it go on (SIGCONT). Triggers record
// every lease change and every chunk or child-run write with the writing
// node (application_name); each write of the paused node must fall while
// it held the shard's lease.
func TestPausedOwnerWritesNothingAfterLosingItsLease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.start("a")
	b := e.start("b")
	c := testenv.StartProcess(t, 60*time.Second, bin.Path(t), "-postgres", e.url+"&application_name=node-c", "-node-id", "c", "-lease", lease(), "-delay", "10ms")
	e.nodes["c"] = c
	e.balanced("a", "b", "c")
	name, warm := e.fanName("a"), e.fanNameFrom("a", 100000)
	var st map[string]int
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=30&tag=w", warm), &st); err != nil || st["completed"] != 30 {
		t.Fatalf("warm-up: %v %v", st, err)
	}
	for _, q := range []string{
		`CREATE TABLE lease_log (shard INT, owner TEXT, epoch BIGINT, at TIMESTAMPTZ)`,
		`CREATE TABLE write_log (app TEXT, instance_id BIGINT, at TIMESTAMPTZ)`,
		`CREATE FUNCTION log_lease() RETURNS trigger AS $$ BEGIN
			IF NEW.owner IS DISTINCT FROM OLD.owner OR NEW.epoch <> OLD.epoch THEN
				INSERT INTO lease_log VALUES (NEW.shard, NEW.owner, NEW.epoch, clock_timestamp());
			END IF; RETURN NEW; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER lease_log AFTER UPDATE ON cluster_shards FOR EACH ROW EXECUTE FUNCTION log_lease()`,
		`CREATE FUNCTION log_write() RETURNS trigger AS $$ BEGIN
			INSERT INTO write_log VALUES (current_setting('application_name'), NEW.instance_id, clock_timestamp());
			RETURN NEW; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER write_log AFTER INSERT ON chat_chunks FOR EACH ROW EXECUTE FUNCTION log_write()`,
		`CREATE TRIGGER write_log AFTER INSERT OR UPDATE ON agent_tool_child_runs FOR EACH ROW EXECUTE FUNCTION log_write()`,
	} {
		if _, err := e.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	const n = 300
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var st map[string]int
		err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=p", name, n), &st)
		t.Logf("fan-out across the pause: %v %v", st, err)
	}()
	e.until(60*time.Second, "a quarter of the children done", func() bool { return e.childrenDone("p") >= n/4 })
	if err := c.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	e.until(60*time.Second, "c's shards taken over", func() bool {
		return e.count(`SELECT count(*) FROM cluster_shards WHERE owner = 'c'`) == 0
	})
	if err := c.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// Runs whose child start met the pause may have failed (a dispatch
	// that no owner answered in time is recorded as an error, as on one
	// node); a client repeats the request, and the runs that completed
	// return their stored results.
	e.until(120*time.Second, "the repeated fan-out answered", func() bool {
		st = nil
		return get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=p", name, n), &st) == nil
	})
	t.Logf("repeated fan-out: %v", st)
	e.until(90*time.Second, "every run terminal", func() bool { return e.parentTerminal("p") == n })
	if fin := e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id LIKE 'p-%' AND status NOT IN ('completed', 'error')`); fin != 0 {
		t.Errorf("%d runs neither completed nor failed", fin)
	}
	if twice := e.count(`SELECT count(*) FROM (SELECT s.instance_id FROM chat_streams s JOIN instances i ON i.id = s.instance_id
		WHERE i.class = 'Worker' AND i.name LIKE 'p-%' GROUP BY s.instance_id HAVING count(*) > 1) x`); twice != 0 {
		t.Errorf("%d children ran more than one turn", twice)
	}

	// Every write of c fell inside a lease of c on the instance's shard.
	type change struct {
		owner string
		at    time.Time
	}
	history := map[int][]change{}
	rows, err := e.pool.Query(ctx, `SELECT shard, COALESCE(owner, ''), at FROM lease_log ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s int
		var ch change
		if err := rows.Scan(&s, &ch.owner, &ch.at); err != nil {
			t.Fatal(err)
		}
		history[s] = append(history[s], ch)
	}
	rows.Close()
	rows, err = e.pool.Query(ctx, `SELECT i.path, w.at FROM write_log w JOIN instances i ON i.id = w.instance_id WHERE w.app = 'node-c'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	checked, late := 0, 0
	for rows.Next() {
		var key string
		var at time.Time
		if err := rows.Scan(&key, &at); err != nil {
			t.Fatal(err)
		}
		p, err := agent.ParsePath(key)
		if err != nil {
			t.Fatal(err)
		}
		s := cluster.ShardOf(p, cluster.DefaultShards)
		owner := "c" // no change logged before the write: c held it since before the triggers
		for _, ch := range history[s] {
			if ch.at.After(at) {
				break
			}
			owner = ch.owner
		}
		checked++
		if owner != "c" {
			late++
			t.Errorf("c wrote %s at %v while shard %d belonged to %q", key, at, s, owner)
		}
	}
	t.Logf("checked %d writes of the paused node, %d after it lost the lease", checked, late)
}

// TestNPMChatThroughNonOwner runs the real npm chat clients
// (test/npm/chat.mjs: a streamed answer, a tool turn, a reload mid-stream
// that resumes every chunk once, cancel, get-messages, clear) against a
// node that does not own the chat: every socket and request is forwarded
// to the owner.
func TestNPMChatThroughNonOwner(t *testing.T) {
	testenv.RequireNode(t)
	e := newEnv(t)
	e.start("a")
	b := e.start("b")
	e.balanced("a", "b")
	own := e.owners()
	room := ""
	for i := range 100000 {
		r := fmt.Sprint("room", i)
		if own[cluster.ShardOf(agent.Path{{Class: "EchoChat", Name: r}}, cluster.DefaultShards)] == "a" {
			room = r
			break
		}
	}
	out := testenv.Node(t, 120*time.Second, "chat.mjs", b.Host, room)
	if !strings.Contains(out, "PASS chat") {
		t.Fatalf("script did not pass:\n%s", out)
	}
}
