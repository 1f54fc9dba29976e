package clustercrash

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// balancer is the cluster's front in a test, as a TCP load balancer: each
// new connection goes to the next live node in turn, and a node that
// refuses the connection (stopped) is skipped. It does not know that a
// node is stopping: a node that got SIGTERM receives new connections until
// its port closes, the worst case of a real deployment.
type balancer struct {
	ln net.Listener

	mu    sync.Mutex
	hosts map[string]string // node id → host:port
	next  int
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startBalancer(t *testing.T) *balancer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &balancer{ln: ln, hosts: map[string]string{}, conns: map[net.Conn]struct{}{}}
	b.wg.Go(b.accept)
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *balancer) addr() string { return b.ln.Addr().String() }

func (b *balancer) set(id, host string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if host == "" {
		delete(b.hosts, id)
	} else {
		b.hosts[id] = host
	}
}

// targets returns the hosts in the order to try for the next connection.
func (b *balancer) targets() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := make([]string, 0, len(b.hosts))
	for id := range b.hosts {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make([]string, 0, len(ids))
	for i := range ids {
		out = append(out, b.hosts[ids[(b.next+i)%len(ids)]])
	}
	b.next++
	return out
}

// track adds c to the open connections, or removes it.
func (b *balancer) track(c net.Conn, add bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if add {
		b.conns[c] = struct{}{}
	} else {
		delete(b.conns, c)
	}
}

func (b *balancer) accept() {
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.track(in, true)
		b.wg.Go(func() {
			defer b.track(in, false)
			defer in.Close()
			var out net.Conn
			for _, h := range b.targets() {
				if c, err := net.DialTimeout("tcp", h, 2*time.Second); err == nil {
					out = c
					break
				}
			}
			if out == nil {
				return
			}
			b.track(out, true)
			defer b.track(out, false)
			defer out.Close()
			done := make(chan struct{}, 2)
			cp := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go cp(out, in)
			go cp(in, out)
			<-done
			<-done
		})
	}
}

// rollingReport is what test/npm/rolling.mjs prints.
type rollingReport struct {
	Failed        []string         `json:"failed"`
	FanRounds     map[string]int   `json:"fanRounds"`
	FanRuns       map[string]int   `json:"fanRuns"`
	ChatRounds    map[string]int   `json:"chatRounds"`
	CutCalls      int              `json:"cutCalls"`
	Resent        int              `json:"resent"`
	Closes        map[string]int   `json:"closes"`
	UnavailableMs map[string]int64 `json:"unavailableMs"`
	ProbeMs       map[string]int64 `json:"probeMs"`
}

// TestRollingRestart (issue 24, item 3): every node of a 3-node cluster
// (default lease) is restarted in turn, SIGTERM then a fresh start under
// the same node id, while the real npm clients load it through a TCP load
// balancer: an AgentClient per Fan instance calling fanOut over RPC (8
// awaited child runs a round) and a chat per EchoChat room on agents'
// WebSocketChatTransport and the AI SDK's AbstractChat
// (test/npm/rolling.mjs). One instance of each kind starts on each node.
// After the clients' own retries (a call cut by a close is made again with
// the same run ids; a cut chat turn is read back from the transcript):
// no request failed; every run completed once, each finish hook fired
// once, no child ran a second turn (the database and the Fan's finish
// ledger tell); every chat message is in its transcript once, answered
// once; every node exited 0 on SIGTERM; every close code the clients saw
// is one they reconnect after. The longest unavailability per instance
// is logged, not asserted (it depends on the machine's load;
// RELIABILITY.md has the figures): as a plain HTTP probe every 50 ms sees
// it (from a refused request's start to the next answer's end, or the
// longest answer), and as the WebSocket client sees it (a socket's close
// to its next open, which includes PartySocket's reconnect delay, 3 s by
// default).
func TestRollingRestart(t *testing.T) {
	testenv.RequireNode(t)
	e := newEnv(t)
	lb := startBalancer(t)
	var procs []*testenv.Process
	start := func(id string) {
		p := testenv.StartProcess(t, 60*time.Second, bin.Path(t), "-postgres", e.url, "-node-id", id,
			"-lease", cluster.DefaultLease.String(), "-delay", "10ms")
		e.nodes[id] = p
		procs = append(procs, p)
		lb.set(id, p.Host)
	}
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		start(id)
	}
	e.balanced(ids...)
	own := e.owners()
	var fans, rooms []string
	for _, id := range ids {
		fans = append(fans, e.fanName(id))
		for i := range 100000 {
			r := fmt.Sprint("room", i)
			if own[cluster.ShardOf(agent.Path{{Class: "EchoChat", Name: r}}, cluster.DefaultShards)] == id {
				rooms = append(rooms, r)
				break
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "rolling.mjs", lb.addr(), strings.Join(fans, ","), strings.Join(rooms, ","))
	cmd.Dir = testenv.NPMDir()
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out strings.Builder
	var report *rollingReport
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			l := sc.Text()
			mu.Lock()
			out.WriteString(l + "\n")
			if j, ok := strings.CutPrefix(l, "REPORT "); ok {
				report = &rollingReport{}
				if err := json.Unmarshal([]byte(j), report); err != nil {
					t.Errorf("report: %v", err)
				}
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if t.Failed() {
			cancel()
			<-read
			t.Logf("rolling.mjs printed:\n%s", out.String())
		}
	})
	done := func() int {
		return e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id LIKE 'r%x%' AND status = 'completed'`)
	}
	// Load before the first restart and after each one.
	progress := func(what string) {
		from := done()
		e.until(120*time.Second, what, func() bool { return done() >= from+2*len(fans)*8 })
	}
	progress("the load under way")
	for _, id := range ids {
		t0 := time.Now()
		e.nodes[id].Stop() // SIGTERM; fails the test unless it exits with status 0
		stopped := time.Since(t0)
		lb.set(id, "")
		start(id)
		e.balanced(ids...)
		t.Logf("node %s: stopped %v after SIGTERM, back and balanced %v after it", id,
			stopped.Round(10*time.Millisecond), time.Since(t0).Round(10*time.Millisecond))
		progress("the load going on after the restart of " + id)
	}
	if _, err := io.WriteString(stdin, "STOP\n"); err != nil {
		t.Fatal(err)
	}
	<-read
	werr := cmd.Wait()
	mu.Lock()
	defer mu.Unlock()
	if report == nil || werr != nil || !strings.Contains(out.String(), "PASS rolling") {
		t.Fatalf("rolling.mjs: %v\n%s", werr, out.String())
	}
	if len(report.Failed) != 0 {
		t.Errorf("%d requests failed after the clients' retries: %v", len(report.Failed), report.Failed)
	}
	total := 0
	for _, name := range fans {
		n := report.FanRuns[name]
		total += n
		var fin map[string]int
		if err := get(t, lb.addr(), "/agents/fan/"+name+"/finishes", &fin); err != nil {
			t.Fatal(err)
		}
		if fin["repeated"] != 0 || fin["runs"] != n || fin["status:completed"] != n {
			t.Errorf("fan %s: finish ledger %v, want %d runs, each completed once", name, fin, n)
		}
	}
	if got := done(); got != total {
		t.Errorf("%d runs completed in the database, the clients were answered for %d", got, total)
	}
	if bad := e.count(`SELECT count(*) FROM agent_tool_runs WHERE run_id LIKE 'r%x%' AND status <> 'completed'`); bad != 0 {
		t.Errorf("%d runs did not complete", bad)
	}
	if twice := e.count(`SELECT count(*) FROM (SELECT s.instance_id FROM chat_streams s JOIN instances i ON i.id = s.instance_id
		WHERE i.class = 'Worker' AND i.name LIKE 'r%x%' GROUP BY s.instance_id HAVING count(*) > 1) x`); twice != 0 {
		t.Errorf("%d children ran more than one turn", twice)
	}
	for code := range report.Closes {
		var c int
		fmt.Sscan(code, &c)
		if c == 1008 || c >= 4000 && c <= 4999 {
			t.Errorf("the clients saw close code %d, after which they do not reconnect", c)
		}
	}
	var longest []string
	for _, k := range append(prefixed("fan/", fans), prefixed("chat/", rooms)...) {
		longest = append(longest, fmt.Sprintf("%s %dms (socket %dms)", k, report.ProbeMs[k], report.UnavailableMs[k]))
	}
	t.Logf("rolling restart of %v: %d runs over %d fans, chat rounds %v; %d calls cut and made again, %d chat messages sent again; close codes %v",
		ids, total, len(fans), report.ChatRounds, report.CutCalls, report.Resent, report.Closes)
	t.Logf("longest unavailability per instance, HTTP probe (socket close to open, with the client's reconnect delay): %s", strings.Join(longest, ", "))
	// The hand-overs' own timeline (drain, release, offer to the next
	// owners), as the nodes logged it.
	var handed []string
	for _, p := range procs {
		for l := range strings.Lines(p.Log()) {
			if strings.Contains(l, "shards handed over") {
				handed = append(handed, strings.TrimSpace(l[strings.Index(l, "node="):]))
			}
		}
	}
	t.Logf("hand-overs: %s", strings.Join(handed, "; "))
}

func prefixed(p string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}
