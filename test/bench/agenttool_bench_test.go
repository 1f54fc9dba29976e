package bench

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/proccpu"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store/postgres"
	"github.com/agentry/agentry/store/sqlite"
	"github.com/agentry/agentry/wire"
)

// The agent-tool benchmarks mirror /work/shared/bench/cf-reference: the
// parent "Assistant" is a chat agent; the child "Researcher" is a
// declarative chat agent whose scripted model streams 20 text deltas of
// "abcde" with no delay and no tools. One run is therefore 28 agent-tool
// events on the wire, as in the reference: started, 26 chunks (start,
// start-step, text-start, 20 text-delta, text-end, finish-step, finish) and
// finished.

const (
	researcherDeltas = 20
	framesPerRun     = researcherDeltas + 8
)

// researcherModel streams 20 × "abcde".
func researcherModel() model.Model {
	return scripted.New(scripted.WithChunkSize(5), scripted.WithDelay(0),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text(strings.Repeat("abcde", researcherDeltas))})))
}

// toolKit is shared by the classes of one benchmark server.
type toolKit struct {
	researcher model.Model

	// progressFor is how long the Prog child reports progress; progress
	// receives the number of signals it reported.
	progressFor time.Duration
	progress    chan int

	// detached completion times, by run id: when the child's handler
	// returned, and when the parent's OnDone ran.
	mu        sync.Mutex
	completed map[string]time.Time
	finished  map[string]chan time.Time
}

func newToolKit() *toolKit {
	return &toolKit{researcher: researcherModel(), progress: make(chan int, 16),
		completed: map[string]time.Time{}, finished: map[string]chan time.Time{}}
}

// toolParent is the parent: a chat agent with a callable that runs one
// awaited child (the reference's runOnce) and a detached OnFinish.
type toolParent struct {
	chat.Base
	k *toolKit
}

func (p *toolParent) ChatModel() model.Model { return p.k.researcher }

// RunOnce runs one awaited Researcher and returns its result.
func (p *toolParent) RunOnce(ctx context.Context) (agenttool.Result, error) {
	return agenttool.RunAgentTool(ctx, p, "Researcher", agenttool.RunOptions{Input: map[string]string{"query": "q"}})
}

// researchInput is the input of the parent's research tool.
type researchInput struct {
	Query string `json:"query"`
}

// Tools returns the parent's agent tool, research, which the MCP endpoint
// serves (the parent's own turns never call it: its model only writes
// text).
func (p *toolParent) Tools() []chat.Tool {
	return []chat.Tool{agenttool.AgentTool[researchInput]("Researcher", agenttool.ToolOptions{Name: "research"})}
}

// OnDone is the OnFinish of detached runs.
func (p *toolParent) OnDone(ctx context.Context, run agenttool.Run, res agenttool.Result) error {
	now := time.Now()
	p.k.mu.Lock()
	ch := p.k.finished[run.RunID]
	p.k.mu.Unlock()
	if ch != nil {
		ch <- now
	}
	return nil
}

// toolResearcher is the trivial streaming child.
type toolResearcher struct {
	chat.Base
	k *toolKit
}

func (r *toolResearcher) ChatModel() model.Model { return r.k.researcher }

// progChild calls its tool "work", which reports progress in a tight loop
// for k.progressFor, then answers "done".
type progChild struct {
	chat.Base
	k *toolKit
	m model.Model
}

func (c *progChild) ChatModel() model.Model { return c.m }

type workInput struct{}

func (c *progChild) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("work", "Work and report progress.", func(ctx context.Context, in workInput) (string, error) {
		n := 0
		start := time.Now()
		for time.Since(start) < c.k.progressFor {
			if err := agenttool.ReportProgress(ctx, agenttool.Progress{Fraction: agenttool.Fraction(0.5), Message: "working"}); err != nil {
				return "", err
			}
			n++
		}
		c.k.progress <- n
		return "ok", nil
	})}
}

func progModel() model.Model {
	return scripted.New(scripted.WithDelay(0),
		scripted.WithRules(scripted.Rule{Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("done")})}),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.ToolCall("work", workInput{})})))
}

// detChild is a handler child: it writes one text part and returns; the
// time it returns is the run's completion.
type detChild struct {
	chat.Base
	k *toolKit
}

func (c *detChild) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	if err := t.WriteText("done"); err != nil {
		return err
	}
	c.k.mu.Lock()
	c.k.completed[c.Name()] = time.Now()
	c.k.mu.Unlock()
	return nil
}

func startToolEnv(b *testing.B, k *toolKit, sendQueue ...int) *benchEnv {
	b.Helper()
	return startBenchEnv(b, []agent.Class{
		{Name: "Assistant", New: func() agent.Agent { return &toolParent{k: k} }, Callable: []string{"runOnce"}, Public: true},
		{Name: "Researcher", New: func() agent.Agent { return &toolResearcher{k: k} }},
		{Name: "Prog", New: func() agent.Agent { return &progChild{k: k, m: progModel()} }},
		{Name: "DetChild", New: func() agent.Agent { return &detChild{k: k} }},
	}, true, sendQueue...)
}

func getParent(b *testing.B, e *benchEnv, name string) *toolParent {
	b.Helper()
	a, err := e.rt.Get(context.Background(), agent.Root("Assistant", name))
	if err != nil {
		b.Fatal(err)
	}
	return a.(*toolParent)
}

func checkResearch(res agenttool.Result, err error) error {
	if err != nil {
		return err
	}
	if res.Status != agenttool.StatusCompleted || len(res.Summary) != 5*researcherDeltas {
		return fmt.Errorf("run %s: status %s, summary %q, error %q", res.RunID, res.Status, res.Summary, res.Error)
	}
	return nil
}

// ---------------------------------------------------------------------------
// 2a. Awaited runs.

// BenchmarkAgentToolAwaited measures awaited RunAgentTool calls of the
// trivial streaming child. One op is one run: a new run id, so a new child
// instance (a sub-agent row, its chat tables, its turn), and the result
// recorded in the parent's registry.
//
//   - direct/workers=N: N goroutines call RunAgentTool in-process on one
//     parent (no client connected).
//   - direct/workers=1/retained=5000: one goroutine, on a parent that
//     already holds 5,000 finished runs in its registry: a dispatch costs
//     what it costs on a new parent (nothing scans the registry).
//   - ws-rpc: a WebSocket client calls the parent's callable runOnce over RPC,
//     one call at a time, like the reference's "single awaited run, WS RPC";
//     the client also receives the run's 28 live agent-tool-event frames.
//   - mcp: an MCP client (the official Go SDK, streamable HTTP) calls the
//     parent's research tool on /mcp/{name}, one call at a time, with a
//     progress token: the same run, through the MCP front door.
func BenchmarkAgentToolAwaited(b *testing.B) {
	for _, w := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("direct/workers=%d", w), func(b *testing.B) { benchAwaitedDirect(b, w, 0) })
	}
	b.Run("direct/workers=1/retained=5000", func(b *testing.B) { benchAwaitedDirect(b, 1, 5000) })
	b.Run("ws-rpc", benchAwaitedRPC)
	b.Run("mcp", benchAwaitedMCP)
}

func benchAwaitedMCP(b *testing.B) {
	e := startToolEnv(b, newToolKit())
	ctx := context.Background()
	c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.hs.URL + "/mcp/mcp"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	call := func() error {
		p := &mcp.CallToolParams{Name: "research", Arguments: map[string]any{"query": "q"}}
		p.SetProgressToken("p")
		res, err := cs.CallTool(ctx, p)
		if err != nil {
			return err
		}
		if res.IsError || len(res.Content) != 1 || len(res.Content[0].(*mcp.TextContent).Text) != 5*researcherDeltas {
			return fmt.Errorf("research: %+v", res)
		}
		return nil
	}
	if err := call(); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		t0 := time.Now()
		err := call()
		lat[i] = time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	reportPercentiles(b, lat, "run", "ms", 50, 95, 99)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "runs/s")
}

func benchAwaitedDirect(b *testing.B, workers, retained int) {
	e := startToolEnv(b, newToolKit())
	p := getParent(b, e, "awaited")
	ctx := context.Background()
	// Warm up: the first run creates the tables' first rows.
	if err := checkResearch(p.RunOnce(ctx)); err != nil {
		b.Fatal(err)
	}
	// The retained runs, made 16 at a time.
	var made atomic.Int64
	var fill sync.WaitGroup
	for range min(retained, 16) {
		fill.Add(1)
		go func() {
			defer fill.Done()
			for made.Add(1) <= int64(retained) {
				if err := checkResearch(p.RunOnce(ctx)); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	fill.Wait()
	lat := make([]time.Duration, b.N)
	u0, v0 := e.db.updates.Load(), e.db.views.Load()
	s0 := e.storeStats()
	cpu0, cpuErr := proccpu.Process(os.Getpid(), false)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				res, err := p.RunOnce(ctx)
				lat[i] = time.Since(t0)
				if err := checkResearch(res, err); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	waitStable(&e.db.updates)
	if cpu1, err := proccpu.Process(os.Getpid(), false); err == nil && cpuErr == nil {
		// The process's CPU (all its threads) per run, the writes that
		// follow the last result included.
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "cpu-µs/run")
	}
	reportPercentiles(b, lat, "run", "ms", 50, 95, 99)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "runs/s")
	b.ReportMetric(float64(e.db.updates.Load()-u0)/float64(b.N), "tx/run")
	b.ReportMetric(float64(e.db.views.Load()-v0)/float64(b.N), "readtx/run")
	reportStoreStats(b, e, s0, b.N)
}

// storeStats is what the store counted so far: SQLite's or PostgreSQL's.
type storeStats struct {
	sq sqlite.Stats
	pq postgres.Stats
}

func (e *benchEnv) storeStats() storeStats {
	if e.pq != nil {
		return storeStats{pq: e.pq.Stats()}
	}
	return storeStats{sq: e.sq.Stats()}
}

// reportStoreStats reports the store's counters since s0 per run. SQLite:
// read transactions, commits (one per group of write transactions),
// statements run and statements prepared. PostgreSQL: read transactions, commits (one per
// write transaction), statements, round trips to the server (statements,
// BEGIN, COMMIT, ROLLBACK) and transactions retried.
func reportStoreStats(b *testing.B, e *benchEnv, s0 storeStats, runs int) {
	s := e.storeStats()
	per := func(n int64) float64 { return float64(n) / float64(runs) }
	if e.pq != nil {
		b.ReportMetric(per(s.pq.Views-s0.pq.Views), "views/run")
		b.ReportMetric(per(s.pq.Committed-s0.pq.Committed), "commits/run")
		b.ReportMetric(per(s.pq.Statements-s0.pq.Statements), "stmts/run")
		b.ReportMetric(per(s.pq.RoundTrips-s0.pq.RoundTrips), "roundtrips/run")
		b.ReportMetric(per(s.pq.Retries-s0.pq.Retries), "retries/run")
		return
	}
	b.ReportMetric(per(s.sq.Views-s0.sq.Views), "views/run")
	b.ReportMetric(per(s.sq.Commits-s0.sq.Commits), "commits/run")
	b.ReportMetric(per(s.sq.Statements-s0.sq.Statements), "stmts/run")
	b.ReportMetric(per(s.sq.Prepares-s0.sq.Prepares), "prepares/run")
}

func benchAwaitedRPC(b *testing.B) {
	e := startToolEnv(b, newToolKit())
	ctx := context.Background()
	c, err := dialRPC(ctx, e.url("/agents/assistant/rpc"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.c.CloseNow()
	if _, err := c.call(ctx, "runOnce", nil); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		t0 := time.Now()
		res, err := c.call(ctx, "runOnce", nil)
		lat[i] = time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if !bytes.Contains(res, []byte(`"status":"completed"`)) {
			b.Fatalf("runOnce: %s", res)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	reportPercentiles(b, lat, "run", "ms", 50, 95, 99)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "runs/s")
}

// ---------------------------------------------------------------------------
// 2b. Fan-out.

// BenchmarkAgentToolFanOut dispatches n awaited runs of the trivial child
// concurrently from one parent under one ParentToolCallID (one goroutine per
// run) and times until all have completed. Each op uses a new parent. No
// client is connected (the reference's fan-out is an HTTP call).
func BenchmarkAgentToolFanOut(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { benchFanOut(b, n) })
	}
}

// fanOut runs n children of p concurrently and returns the first error.
func fanOut(ctx context.Context, p *toolParent, n int, toolCall string) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := agenttool.RunAgentTool(ctx, p, "Researcher", agenttool.RunOptions{
				Input: map[string]string{"query": "q"}, ParentToolCallID: toolCall, DisplayOrder: i})
			if err := checkResearch(res, err); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func benchFanOut(b *testing.B, n int) {
	e := startToolEnv(b, newToolKit())
	ctx := context.Background()
	if err := checkResearch(getParent(b, e, "warm").RunOnce(ctx)); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, b.N)
	u0, s0 := e.db.updates.Load(), e.storeStats()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		p := getParent(b, e, fmt.Sprintf("fan-%d", i))
		b.StartTimer()
		t0 := time.Now()
		if err := fanOut(ctx, p, n, "call-fan"); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	b.StopTimer()
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	reportPercentiles(b, lat, "all-done", "ms", 50, 95)
	b.ReportMetric(float64(n*b.N)/sum.Seconds(), "runs/s")
	b.ReportMetric(float64(e.db.updates.Load()-u0)/float64(n*b.N), "tx/run")
	reportStoreStats(b, e, s0, n*b.N)
}

// ---------------------------------------------------------------------------
// 2c. Connect replay.

// BenchmarkAgentToolReplay measures the connect replay of a warm parent
// that retains n finished runs of the trivial child (28 frames each). The
// runs are created before the timer (fan-outs of 100 under one tool call).
// One op: dial a WebSocket to the parent and read until the n×28-th
// agent-tool-event frame; the time is from the dial to that last replay
// frame (replay-p50-ms), and to the first (first-frame-p50-ms: what a
// client that reads slower than the server sends waits for, on top of its
// own reading). bytes and frames count the agent-tool-event frames (every
// one must carry replay:true).
//
// The queue=default cases use the server's default send queue (64 MiB per
// client since the fix of BENCHMARKS.md finding 1); frames-before-close
// stays 0 unless the server cuts the replay off.
func BenchmarkAgentToolReplay(b *testing.B) {
	for _, q := range []int{0} {
		for _, n := range []int{100, 200, 1000} {
			qs := "default"
			if q > 0 {
				qs = fmt.Sprint(q)
			}
			b.Run(fmt.Sprintf("queue=%s/runs=%d", qs, n), func(b *testing.B) { benchReplay(b, n, q) })
		}
	}
}

func benchReplay(b *testing.B, n, queue int) {
	var qs []int
	if queue > 0 {
		qs = []int{queue}
	}
	e := startToolEnv(b, newToolKit(), qs...)
	ctx := context.Background()
	p := getParent(b, e, "replay")
	for done := 0; done < n; done += 100 {
		if err := fanOut(ctx, p, min(100, n-done), fmt.Sprintf("call-%d", done)); err != nil {
			b.Fatal(err)
		}
	}
	want := n * framesPerRun
	lat := make([]time.Duration, b.N)
	first := make([]time.Duration, b.N)
	var bytesN, framesN, otherN int
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		c, err := testenv.DialRawUntil(ctx, e.url("/agents/assistant/replay"), "")
		if err != nil {
			b.Fatal(err)
		}
		frames, size, other := 0, 0, 0
		var firstAt time.Duration
		for frames < want {
			_, data, err := c.Read(ctx)
			if err != nil {
				if queue == 0 && websocket.CloseStatus(err) == websocket.StatusTryAgainLater {
					b.StopTimer()
					b.ReportMetric(float64(frames), "frames-before-close")
					return
				}
				b.Fatalf("after %d of %d replay frames: %v", frames, want, err)
			}
			if testenv.FrameType(data) != wire.AgentToolEvent {
				other++
				continue
			}
			if !bytes.Contains(data, []byte(`"replay":true`)) {
				b.Fatalf("live frame during the replay: %s", data)
			}
			if frames == 0 {
				firstAt = time.Since(t0)
			}
			frames++
			size += len(data)
		}
		lat[i] = time.Since(t0)
		first[i] = firstAt
		b.StopTimer()
		c.Close(websocket.StatusNormalClosure, "")
		bytesN, framesN, otherN = size, frames, other
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, lat, "replay", "ms", 50, 95)
	reportPercentiles(b, first, "first-frame", "ms", 50, 95)
	b.ReportMetric(0, "frames-before-close")
	b.ReportMetric(float64(framesN), "frames")
	b.ReportMetric(float64(bytesN), "bytes")
	b.ReportMetric(float64(otherN), "connect-frames")
}

// ---------------------------------------------------------------------------
// 3a. Progress signals.

// BenchmarkAgentToolProgress runs one awaited child whose tool calls
// ReportProgress in a tight loop for 1 s (fraction 0.5, so every signal is
// subject to the 200 ms coalescing), with one WebSocket client connected to
// the parent. It reports the signals the child emitted per second and the
// progress frames (agent-tool-event chunks carrying data-agent-progress)
// that reached the client.
func BenchmarkAgentToolProgress(b *testing.B) {
	k := newToolKit()
	k.progressFor = time.Second
	e := startToolEnv(b, k)
	ctx := context.Background()
	p := getParent(b, e, "progress")
	c, err := testenv.DialRawUntil(ctx, e.url("/agents/assistant/progress"), wire.MCPServers)
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseNow()
	var signals, frames int
	var loop time.Duration
	b.ResetTimer()
	for i := range b.N {
		runID := fmt.Sprintf("prog-%d", i)
		res, err := agenttool.RunAgentTool(ctx, p, "Prog", agenttool.RunOptions{RunID: runID, Input: "go"})
		if err != nil || res.Status != agenttool.StatusCompleted {
			b.Fatalf("run: %+v %v", res, err)
		}
		signals += <-k.progress
		loop += k.progressFor
		// Read this run's frames up to its terminal event.
		runKey := []byte(`"runId":"` + runID + `"`)
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if testenv.FrameType(data) != wire.AgentToolEvent || !bytes.Contains(data, runKey) {
				continue
			}
			if bytes.Contains(data, []byte(`data-agent-progress`)) {
				frames++
			}
			if bytes.Contains(data, []byte(`"kind":"finished"`)) {
				break
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(signals)/loop.Seconds(), "signals/s")
	b.ReportMetric(float64(frames)/float64(b.N), "progress-frames/run")
	b.ReportMetric(float64(frames)/loop.Seconds(), "progress-frames/s")
}

// ---------------------------------------------------------------------------
// 3b. Detached completion to OnFinish.

// BenchmarkAgentToolDetachedFinish dispatches detached runs one at a time
// (OnFinish "OnDone") of a handler child that writes one text part and
// returns, and measures the fast path: from the moment the child's handler
// returned (its completion) to the parent's OnDone call, and from the
// dispatch to OnDone.
func BenchmarkAgentToolDetachedFinish(b *testing.B) {
	k := newToolKit()
	e := startToolEnv(b, k)
	ctx := context.Background()
	p := getParent(b, e, "detached")
	toFinish := make([]time.Duration, b.N)
	total := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		runID := fmt.Sprintf("det-%d", i)
		ch := make(chan time.Time, 1)
		k.mu.Lock()
		k.finished[runID] = ch
		k.mu.Unlock()
		t0 := time.Now()
		res, err := agenttool.RunAgentTool(ctx, p, "DetChild", agenttool.RunOptions{RunID: runID, Input: "go",
			Detached: &agenttool.DetachedOptions{OnFinish: "OnDone"}})
		if err != nil || res.Status != agenttool.StatusRunning {
			b.Fatalf("dispatch: %+v %v", res, err)
		}
		var at time.Time
		select {
		case at = <-ch:
		case <-time.After(time.Minute):
			b.Fatal("OnDone was not called")
		}
		k.mu.Lock()
		done, ok := k.completed[runID]
		k.mu.Unlock()
		if !ok {
			b.Fatal("the child did not record its completion")
		}
		toFinish[i] = at.Sub(done)
		total[i] = at.Sub(t0)
	}
	b.StopTimer()
	reportPercentiles(b, toFinish, "complete-to-onfinish", "µs", 50, 99)
	reportPercentiles(b, total, "dispatch-to-onfinish", "µs", 50, 99)
}

// BenchmarkAgentToolTxCensus runs awaited runs of the trivial child one at
// a time and logs, per run, the write and read transactions by caller (the
// first agentry function on the stack outside the store), so that the
// transactions of the critical path can be told apart. On SQLite it also
// reports the pages written to the write-ahead log per run (walframes/run:
// one frame per page per commit, each its own write) and the store's
// commits and statements per run:
//
//	go test -run '^$' -bench AgentToolTxCensus -benchtime 20x -v ./test/bench/
func BenchmarkAgentToolTxCensus(b *testing.B) {
	e := startToolEnv(b, newToolKit())
	p := getParent(b, e, "census")
	ctx := context.Background()
	if err := checkResearch(p.RunOnce(ctx)); err != nil {
		b.Fatal(err)
	}
	waitStable(&e.db.updates)
	var mu sync.Mutex
	counts := map[string]int{}
	trace := func(write bool) {
		kind := "read "
		if write {
			kind = "write"
		}
		site := txCaller()
		mu.Lock()
		counts[kind+" "+site]++
		mu.Unlock()
	}
	e.db.trace.Store(&trace)
	// The write-ahead log is read after each run: a restart of the log
	// (after a background checkpoint copied all of it) loses at most the
	// frames of the run before it. The child's end commits after the
	// parent's result, so the last reading waits for the writes to stop.
	frames, walOK := 0, e.path != ""
	var wal walLog
	var pages []uint32 // of the frames written, in order
	if walOK {
		var err error
		if wal, err = readWAL(e.path); err != nil {
			b.Fatal(err)
		}
	}
	s0 := e.storeStats()
	b.ResetTimer()
	for i := range b.N {
		if err := checkResearch(p.RunOnce(ctx)); err != nil {
			b.Fatal(err)
		}
		if !walOK {
			continue
		}
		if i == b.N-1 {
			waitStable(&e.db.updates)
		}
		next, err := readWALPages(e.path, true)
		if err != nil {
			b.Fatal(err)
		}
		frames += walFrames(wal, next)
		pages = append(pages, newFrames(wal, next)...)
		wal = next
	}
	b.StopTimer()
	waitStable(&e.db.updates)
	e.db.trace.Store(nil)
	if walOK {
		b.ReportMetric(float64(frames)/float64(b.N), "walframes/run")
		logFramesByBtree(b, e.path, pages)
	}
	reportStoreStats(b, e, s0, b.N)
	mu.Lock()
	defer mu.Unlock()
	keys := make([]string, 0, len(counts))
	var w, r int
	for k, n := range counts {
		keys = append(keys, k)
		if strings.HasPrefix(k, "write") {
			w += n
		} else {
			r += n
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.Logf("%6.2f  %s", float64(counts[k])/float64(b.N), k)
	}
	b.ReportMetric(float64(w)/float64(b.N), "tx/run")
	b.ReportMetric(float64(r)/float64(b.N), "readtx/run")
}

// logFramesByBtree logs the frames written per run by the table or index
// whose pages they are ("?": a page no B-tree holds now, such as a freed
// one).
func logFramesByBtree(b *testing.B, path string, pages []uint32) {
	owner, err := btreeOfPage(path)
	if err != nil {
		b.Logf("pages by B-tree: %v", err)
		return
	}
	byName := map[string]int{}
	for _, p := range pages {
		name, ok := owner[p]
		if !ok {
			name = "?"
		}
		byName[name]++
	}
	names := slices.Collect(maps.Keys(byName))
	slices.SortFunc(names, func(x, y string) int { return byName[y] - byName[x] })
	for _, n := range names {
		b.Logf("%6.2f frames/run  %s", float64(byName[n])/float64(b.N), n)
	}
}

// txCaller names the chain of agentry functions that opened a transaction,
// innermost first, without the store and this file.
func txCaller() string {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var names []string
	for {
		f, more := frames.Next()
		fn := f.Function
		if strings.Contains(fn, "agentry/agentry/") && !strings.Contains(fn, "/store") && !strings.Contains(fn, "/test/bench") {
			names = append(names, fn[strings.LastIndex(fn, "/")+1:])
			if len(names) == 3 {
				break
			}
		}
		if !more {
			break
		}
	}
	return strings.Join(names, " < ")
}
