package agenttool_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// The bound on runs executing at once per parent (RunningLimiter): runs
// past it are recorded, announced and wait for a slot, first come first
// served; they are never refused. Every child blocks on a channel of the
// test, so what executes at once is exactly what the test lets through.

// slotKit configures the classes of one test; it outlives restarts.
type slotKit struct {
	limit int // SlotParent's MaxRunningAgentTools
	cap   int // SlotParent's MaxConcurrentAgentTools

	started chan string // a child's turn began (its run id)
	done    chan string // a detached run's OnFinish ran (its run id)

	mu       sync.Mutex
	gates    map[string]chan struct{} // per run id: closed to let its child end
	running  int                      // child turns executing now
	peak     int                      // most child turns executing at once
	starts   []string                 // child turns begun, in order
	finishes []recFinish              // OnAgentToolFinish and OnDone calls
}

func newSlotKit(limit int) *slotKit {
	return &slotKit{limit: limit, started: make(chan string, 64), done: make(chan string, 64), gates: map[string]chan struct{}{}}
}

func (k *slotKit) gate(runID string) chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	g, ok := k.gates[runID]
	if !ok {
		g = make(chan struct{})
		k.gates[runID] = g
	}
	return g
}

// let lets the child of runID end its turn.
func (k *slotKit) let(runID string) { close(k.gate(runID)) }

func (k *slotKit) startsOf(runID string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, s := range k.starts {
		if s == runID {
			n++
		}
	}
	return n
}

func (k *slotKit) peakNow() (running, peak int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.running, k.peak
}

func (k *slotKit) finishesOf(runID string) []recFinish {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []recFinish
	for _, f := range k.finishes {
		if f.Run.RunID == runID {
			out = append(out, f)
		}
	}
	return out
}

// slotParent dispatches the runs; its bound and cap come from the kit.
type slotParent struct {
	agent.Base
	k *slotKit
}

func (p *slotParent) MaxRunningAgentTools() int    { return p.k.limit }
func (p *slotParent) MaxConcurrentAgentTools() int { return p.k.cap }
func (p *slotParent) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	p.k.mu.Lock()
	p.k.finishes = append(p.k.finishes, recFinish{run, res})
	p.k.mu.Unlock()
}

// OnDone is the OnFinish method of the detached runs.
func (p *slotParent) OnDone(ctx context.Context, run agenttool.Run, res agenttool.Result) error {
	p.k.done <- run.RunID
	return nil
}

// slotChild's turn counts itself executing, waits for its gate, and
// answers "done <run id>".
type slotChild struct {
	chat.Base
	k *slotKit
}

func (c *slotChild) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	k, id := c.k, c.Name()
	g := k.gate(id)
	k.mu.Lock()
	k.running++
	k.peak = max(k.peak, k.running)
	k.starts = append(k.starts, id)
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.running--
		k.mu.Unlock()
	}()
	k.started <- id
	select {
	case <-g:
	case <-ctx.Done():
		return ctx.Err()
	}
	return t.WriteText("done " + id)
}

type slotEnv struct {
	*testenv.Env
	ev *events
}

// slotStart starts a runtime on dir ("" for a new folder).
func slotStart(t *testing.T, k *slotKit, dir string, opts agenttool.Options) *slotEnv {
	t.Helper()
	ev := &events{changed: make(chan struct{})}
	env := startEnv(t, testenv.Options{Postgres: &pg, Dir: dir, Classes: []agent.Class{
		{Name: "SlotParent", New: func() agent.Agent { return &slotParent{k: k} }, Public: true},
		{Name: "SlotChild", New: func() agent.Agent { return &slotChild{k: k} }},
	}}, chat.Config{}, opts, func(rt *agent.Runtime) {
		rt.Diag().Subscribe(diag.ChannelAgentTool, ev.add)
	})
	return &slotEnv{Env: env, ev: ev}
}

func (e *slotEnv) parent(t *testing.T) agent.Agent {
	t.Helper()
	p, err := e.RT.Get(testCtx(t), agent.Root("SlotParent", "p"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitQueued waits until run runID waits in line for a slot.
func (e *slotEnv) waitQueued(t *testing.T, ctx context.Context, runID string) {
	t.Helper()
	e.ev.waitWhere(t, ctx, func() string { return "run " + runID + " queued" }, func(ev diag.Event) bool {
		return ev.Type == "queued" && ev.Attrs["runId"] == runID
	})
}

// nextStart returns the run id of the next child turn that begins.
func (k *slotKit) nextStart(t *testing.T, ctx context.Context) string {
	t.Helper()
	select {
	case id := <-k.started:
		return id
	case <-ctx.Done():
		t.Fatal("timed out waiting for a child to start")
	}
	return ""
}

func slotCounts(t *testing.T, p agent.Agent) (running, waiting int) {
	t.Helper()
	running, waiting, err := agenttool.RunningAgentTools(p)
	if err != nil {
		t.Fatal(err)
	}
	return running, waiting
}

// TestRunningBoundQueuesFIFO: a fan-out of 8 runs with a bound of 3 runs
// 3 children at once; the other 5 are recorded as starting and announced
// while they wait, start first come first served as slots free, and all 8
// complete.
func TestRunningBoundQueuesFIFO(t *testing.T) {
	const limit, n = 3, 8
	k := newSlotKit(limit)
	e := slotStart(t, k, "", agenttool.Options{})
	ctx := testCtx(t)
	p := e.parent(t)
	ws := dial(t, e.Env, "slot-parent/p")
	outs := make([]chan runOut, n)
	for i := range n {
		id := fmt.Sprint("r", i)
		outs[i] = goRun(ctx, p, "SlotChild", agenttool.RunOptions{RunID: id, Input: "go"})
		if i < limit {
			if got := k.nextStart(t, ctx); got != id {
				t.Fatalf("started %s, want %s", got, id)
			}
		} else {
			e.waitQueued(t, ctx, id) // in line before the next one comes
		}
	}
	if running, waiting := slotCounts(t, p); running != limit || waiting != n-limit {
		t.Fatalf("RunningAgentTools = %d running, %d waiting; want %d, %d", running, waiting, limit, n-limit)
	}
	if r, _ := k.peakNow(); r != limit {
		t.Fatalf("%d children execute, want %d", r, limit)
	}
	// The waiting runs are in the registry, starting, and were announced.
	runs, err := agenttool.ListAgentToolRuns(ctx, p)
	if err != nil || len(runs) != n {
		t.Fatalf("registry: %d runs, %v", len(runs), err)
	}
	for _, r := range runs[limit:] {
		if r.Status != agenttool.StatusStarting {
			t.Fatalf("waiting run %s is %s, want starting", r.RunID, r.Status)
		}
	}
	e.ev.waitCount(t, ctx, func() string { return fmt.Sprintf("%d runs announced", n) }, n,
		func(ev diag.Event) bool { return ev.Type == "start" })
	// The clients see the waiting runs started (their timeline is there
	// before their child).
	ws.waitFrames(ctx, "started frames of every run", func(fs []agenttool.Frame) bool {
		seen := map[string]bool{}
		for _, f := range fs {
			if f.Event.Kind == "started" {
				seen[f.Event.RunID] = true
			}
		}
		return len(seen) == n
	})
	// Each end lets the first in line start.
	for i := range n {
		k.let(fmt.Sprint("r", i))
		if next := i + limit; next < n {
			if got, want := k.nextStart(t, ctx), fmt.Sprint("r", next); got != want {
				t.Fatalf("after r%d ended, %s started; want %s (first come first served)", i, got, want)
			}
		}
	}
	for i, o := range outs {
		res := recv(t, ctx, o)
		if res.Status != agenttool.StatusCompleted || res.Summary != fmt.Sprint("done r", i) {
			t.Fatalf("r%d: %+v", i, res)
		}
	}
	if _, peak := k.peakNow(); peak != limit {
		t.Fatalf("%d children executed at once, want at most (and at some point) %d", peak, limit)
	}
	if running, waiting := slotCounts(t, p); running != 0 || waiting != 0 {
		t.Fatalf("after the fan-out: %d running, %d waiting", running, waiting)
	}
}

// TestRunningBoundCancelQueued: a waiting run canceled by CancelAgentTool,
// and one whose dispatch's context ends, end aborted as a canceled running
// run does, without a child, and free nothing they did not hold: with a
// bound of 1 the next runs still go one at a time.
func TestRunningBoundCancelQueued(t *testing.T) {
	k := newSlotKit(1)
	e := slotStart(t, k, "", agenttool.Options{})
	ctx := testCtx(t)
	p := e.parent(t)
	r0 := goRun(ctx, p, "SlotChild", agenttool.RunOptions{RunID: "r0", Input: "go"})
	if got := k.nextStart(t, ctx); got != "r0" {
		t.Fatalf("started %s", got)
	}
	r1 := goRun(ctx, p, "SlotChild", agenttool.RunOptions{RunID: "r1", Input: "go"})
	e.waitQueued(t, ctx, "r1")
	cctx, cancel := context.WithCancelCause(ctx)
	r2 := goRun(cctx, p, "SlotChild", agenttool.RunOptions{RunID: "r2", Input: "go"})
	e.waitQueued(t, ctx, "r2")

	if err := agenttool.CancelAgentTool(ctx, p, "r1", "not needed"); err != nil {
		t.Fatal(err)
	}
	if res := recv(t, ctx, r1); res.Status != agenttool.StatusAborted || res.Error != "not needed" {
		t.Fatalf("canceled waiting run: %+v", res)
	}
	cancel(errors.New("turn stopped"))
	if res := recv(t, ctx, r2); res.Status != agenttool.StatusAborted || res.Error != "turn stopped" {
		t.Fatalf("waiting run whose context ended: %+v", res)
	}
	for _, id := range []string{"r1", "r2"} {
		if r := getRun(t, p, id); r.Status != agenttool.StatusAborted {
			t.Fatalf("%s: %+v", id, r)
		}
		if f := k.finishesOf(id); len(f) != 1 || f[0].Result.Status != agenttool.StatusAborted {
			t.Fatalf("%s finish hooks: %+v", id, f)
		}
		if ok, err := e.RT.Exists(ctx, agent.BaseOf(p).Path().Child("SlotChild", id)); err != nil || ok {
			t.Fatalf("%s has a child (%v, %v)", id, ok, err)
		}
	}
	if running, waiting := slotCounts(t, p); running != 1 || waiting != 0 {
		t.Fatalf("after the cancels: %d running, %d waiting; want 1, 0", running, waiting)
	}
	k.let("r0")
	if res := recv(t, ctx, r0); res.Status != agenttool.StatusCompleted {
		t.Fatalf("r0: %+v", res)
	}
	// The bound still holds: one runs, the next waits.
	r3 := goRun(ctx, p, "SlotChild", agenttool.RunOptions{RunID: "r3", Input: "go"})
	if got := k.nextStart(t, ctx); got != "r3" {
		t.Fatalf("started %s", got)
	}
	r4 := goRun(ctx, p, "SlotChild", agenttool.RunOptions{RunID: "r4", Input: "go"})
	e.waitQueued(t, ctx, "r4")
	k.let("r3")
	if got := k.nextStart(t, ctx); got != "r4" {
		t.Fatalf("started %s", got)
	}
	k.let("r4")
	for _, o := range []chan runOut{r3, r4} {
		if res := recv(t, ctx, o); res.Status != agenttool.StatusCompleted {
			t.Fatalf("%+v", res)
		}
	}
	if _, peak := k.peakNow(); peak != 1 {
		t.Fatalf("%d children executed at once, want 1", peak)
	}
	if k.startsOf("r1") != 0 || k.startsOf("r2") != 0 {
		t.Fatal("a canceled waiting run started its child")
	}
}

// TestRunningBoundDetachedQueued: detached runs past the bound answer
// with a starting handle and wait in line; a canceled one never starts,
// the other starts when the awaited run ends and is delivered to OnFinish.
func TestRunningBoundDetachedQueued(t *testing.T) {
	k := newSlotKit(1)
	e := slotStart(t, k, "", agenttool.Options{})
	ctx := testCtx(t)
	p := e.parent(t)
	r0 := goRun(ctx, p, "SlotChild", agenttool.RunOptions{RunID: "r0", Input: "go"})
	if got := k.nextStart(t, ctx); got != "r0" {
		t.Fatalf("started %s", got)
	}
	for _, id := range []string{"d1", "d2"} {
		h, err := agenttool.RunAgentTool(ctx, p, "SlotChild", agenttool.RunOptions{RunID: id, Input: "go",
			Detached: &agenttool.DetachedOptions{OnFinish: "OnDone"}})
		if err != nil || h.Status != agenttool.StatusStarting || h.RunID != id {
			t.Fatalf("detached dispatch %s past the bound: %+v, %v", id, h, err)
		}
		e.waitQueued(t, ctx, id)
	}
	if r := getRun(t, p, "d1"); r.Status != agenttool.StatusStarting {
		t.Fatalf("d1: %+v", r)
	}
	if err := agenttool.CancelAgentTool(ctx, p, "d2", "dropped"); err != nil {
		t.Fatal(err)
	}
	if r := getRun(t, p, "d2"); r.Status != agenttool.StatusAborted || r.Error != "dropped" {
		t.Fatalf("d2: %+v", r)
	}
	select {
	case id := <-k.done:
		if id != "d2" {
			t.Fatalf("OnDone for %s, want d2", id)
		}
	case <-ctx.Done():
		t.Fatal("d2's end was not delivered")
	}
	k.let("r0")
	if res := recv(t, ctx, r0); res.Status != agenttool.StatusCompleted {
		t.Fatalf("r0: %+v", res)
	}
	if got := k.nextStart(t, ctx); got != "d1" {
		t.Fatalf("started %s, want d1", got)
	}
	k.let("d1")
	select {
	case id := <-k.done:
		if id != "d1" {
			t.Fatalf("OnDone for %s, want d1", id)
		}
	case <-ctx.Done():
		t.Fatal("d1's end was not delivered")
	}
	if r := getRun(t, p, "d1"); r.Status != agenttool.StatusCompleted || r.Summary != "done d1" {
		t.Fatalf("d1: %+v", r)
	}
	if k.startsOf("d2") != 0 {
		t.Fatal("the canceled detached run started its child")
	}
	if _, peak := k.peakNow(); peak != 1 {
		t.Fatalf("%d children executed at once, want 1", peak)
	}
}

// TestRunningBoundBesideCap: MaxConcurrentAgentTools still refuses past
// its cap, and counts the waiting runs (they are in flight).
func TestRunningBoundBesideCap(t *testing.T) {
	k := newSlotKit(1)
	k.cap = 2
	e := slotStart(t, k, "", agenttool.Options{})
	ctx := testCtx(t)
	p := e.parent(t)
	r0 := goRun(ctx, p, "SlotChild", agenttool.RunOptions{RunID: "r0", Input: "go"})
	if got := k.nextStart(t, ctx); got != "r0" {
		t.Fatalf("started %s", got)
	}
	r1 := goRun(ctx, p, "SlotChild", agenttool.RunOptions{RunID: "r1", Input: "go"})
	e.waitQueued(t, ctx, "r1")
	_, err := agenttool.RunAgentTool(ctx, p, "SlotChild", agenttool.RunOptions{RunID: "r2", Input: "go"})
	var ce *agenttool.CapError
	if !errors.As(err, &ce) || ce.Max != 2 {
		t.Fatalf("third dispatch: %v, want *CapError", err)
	}
	if _, ok, _ := agenttool.GetAgentToolRun(ctx, p, "r2"); ok {
		t.Fatal("the refused run is in the registry")
	}
	k.let("r0")
	if got := k.nextStart(t, ctx); got != "r1" {
		t.Fatalf("started %s", got)
	}
	k.let("r1")
	for _, o := range []chan runOut{r0, r1} {
		if res := recv(t, ctx, o); res.Status != agenttool.StatusCompleted {
			t.Fatalf("%+v", res)
		}
	}
}

// TestRunningBoundUnlimited: a negative bound (here the runtime's) lets
// every run execute at once.
func TestRunningBoundUnlimited(t *testing.T) {
	k := newSlotKit(0) // the runtime's bound
	e := slotStart(t, k, "", agenttool.Options{MaxRunningAgentTools: -1})
	ctx := testCtx(t)
	p := e.parent(t)
	const n = agenttool.DefaultMaxRunningAgentTools + 2
	outs := make([]chan runOut, n)
	for i := range n {
		outs[i] = goRun(ctx, p, "SlotChild", agenttool.RunOptions{RunID: fmt.Sprint("u", i), Input: "go"})
	}
	for range n {
		k.nextStart(t, ctx) // all n execute at once
	}
	for i := range n {
		k.let(fmt.Sprint("u", i))
	}
	for _, o := range outs {
		if res := recv(t, ctx, o); res.Status != agenttool.StatusCompleted {
			t.Fatalf("%+v", res)
		}
	}
	if _, peak := k.peakNow(); peak != n {
		t.Fatalf("peak %d, want %d", peak, n)
	}
}

// TestRunningBoundRestart: runs waiting for their slot when the process
// stops are started after the restart with the input of their dispatch,
// each once, in line behind the run that was executing, and within the
// bound.
func TestRunningBoundRestart(t *testing.T) {
	k := newSlotKit(1)
	dir := t.TempDir()
	e := slotStart(t, k, dir, agenttool.Options{})
	ctx := testCtx(t)
	p := e.parent(t)
	rctx := agent.WithAgent(e.RT.Context(), p) // as a chat turn has it: it ends with the runtime
	r0 := goRun(rctx, p, "SlotChild", agenttool.RunOptions{RunID: "r0", Input: "go"})
	if got := k.nextStart(t, ctx); got != "r0" {
		t.Fatalf("started %s", got)
	}
	var pending []chan runOut
	for _, id := range []string{"r1", "r2"} {
		pending = append(pending, goRun(rctx, p, "SlotChild", agenttool.RunOptions{RunID: id, Input: "go"}))
		e.waitQueued(t, ctx, id)
	}
	e.Close()
	for _, o := range append(pending, r0) {
		select {
		case out := <-o:
			if !errors.Is(out.err, agent.ErrClosed) {
				t.Fatalf("dispatch during the close: %+v, %v; want agent.ErrClosed", out.res, out.err)
			}
		case <-ctx.Done():
			t.Fatal("a dispatch did not return at the close")
		}
	}
	k.mu.Lock()
	k.peak, k.starts = 0, nil
	k.mu.Unlock()
	for len(k.started) > 0 {
		<-k.started
	}

	e = slotStart(t, k, dir, agenttool.Options{})
	p = e.parent(t) // its recovery re-attaches r0 and resumes r1 and r2
	// r0's child goes on with its turn (the chat's recovery), and its run,
	// re-attached, holds the one slot: r1 and r2 wait in line behind it.
	if got := k.nextStart(t, ctx); got != "r0" {
		t.Fatalf("started %s, want r0's turn going on", got)
	}
	e.waitQueued(t, ctx, "r1")
	e.waitQueued(t, ctx, "r2")
	if running, waiting := slotCounts(t, p); running != 1 || waiting != 2 {
		t.Fatalf("after the restart: %d running, %d waiting; want 1, 2", running, waiting)
	}
	if r := getRun(t, p, "r1"); r.Status != agenttool.StatusStarting {
		t.Fatalf("r1 after the restart: %+v", r)
	}
	k.let("r0")
	for _, id := range []string{"r1", "r2"} {
		if got := k.nextStart(t, ctx); got != id {
			t.Fatalf("started %s, want %s", got, id)
		}
		k.let(id)
	}
	for _, id := range []string{"r1", "r2"} {
		e.ev.waitWhere(t, ctx, func() string { return id + " finished" }, func(ev diag.Event) bool {
			return ev.Type == "finish" && ev.Attrs["runId"] == id
		})
		if r := getRun(t, p, id); r.Status != agenttool.StatusCompleted || r.Summary != "done "+id {
			t.Fatalf("%s after the restart: %+v", id, r)
		}
		if n := k.startsOf(id); n != 1 {
			t.Fatalf("%s's child started %d times, want once", id, n)
		}
	}
	if _, peak := k.peakNow(); peak != 1 {
		t.Fatalf("%d children executed at once after the restart, want 1", peak)
	}
	if f := k.finishesOf("r1"); len(f) != 1 || f[0].Result.Status != agenttool.StatusCompleted {
		t.Fatalf("r1 finish hooks: %+v", f)
	}
	if !slices.ContainsFunc(e.ev.all(), func(ev diag.Event) bool { return ev.Type == "queued" && ev.Attrs["runId"] == "r2" }) {
		t.Fatal("r2 did not wait in line after the restart")
	}
}
