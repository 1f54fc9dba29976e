package agenttool_test

// Start-up recovery of agent-tool runs (spec §6; §9 groups G 83–102 and
// I 135–143, adapted to in-process chat children). Every test uses real
// parts (SQLite file, runtime, WebSocket on 127.0.0.1); the models are
// scripted and held on their own fake clocks, and the runtime runs on a
// second fake clock so that the re-attach budgets (no-progress, window,
// inspection timeout, recovery deadline) are driven exactly.
//
// Not applicable here, by design:
//   - 87 (a tail that closes after progress and is re-armed): a re-attached
//     parent keeps its child alive (KeepAlive) and follows its chat stream,
//     which does not close until the turn ends; there is nothing to re-arm.
//   - 89 with an infinite no-progress budget: a zero or negative
//     AgentToolReattachNoProgressTimeout means "collect only" in Go, so the
//     ceiling case is covered with a large budget (TestRecoverWindowExceeded).
//   - 90 (not-tailable): every child is an in-process chat agent whose
//     stream can be followed.
//   - 135–143 (request-id rebind): a recovered child keeps its stream id,
//     so there is nothing to rebind; TestRecoverChildFramesStayAttributed
//     asserts the property the rebind protects. A child instance is named by
//     its run id, so it never holds two runs (139, 143) and its settled row
//     is never touched by a later recovery (138, 142: asserted in
//     TestRecoverCollectsCompletedChild).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testctx"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
)

const (
	recWait = 20 * time.Second // bound of every wait; never a way to let time pass
	recTick = tick             // the models' delay between two events
	recText = "Durable children resume where they stopped, and parents follow them."
)

const (
	msgNoProgress     = "Agent tool run was still running but made no forward progress within the re-attach no-progress budget; the parent gave up."
	msgWindow         = "Agent tool run did not reach a terminal result within the maximum re-attach window; the parent gave up."
	msgInspectTimeout = "Agent tool run inspection timed out during parent recovery."
	msgInspectFailed  = "Agent tool run could not be inspected during parent recovery."
	msgDeadline       = "Agent tool run recovery deadline exceeded."
)

func recCtx(t *testing.T) context.Context { return testctx.Within(t, recWait) }

// ---------------------------------------------------------------------------
// Classes.

// recKit configures the classes of one test; it outlives restarts.
type recKit struct {
	mclock *clockwork.FakeClock // RecChild and RecStepper models: pumped to stream
	sclock *clockwork.FakeClock // RecStuck model: advanced only when a test says so
	child  *scripted.Model
	stuck  *scripted.Model
	steps  *scripted.Model

	noProgress time.Duration // 0: the default
	maxWindow  time.Duration // 0: none
	policy     *chat.Recovery
	block      chan struct{}                                 // RecBlocking's OnStart waits for it
	parentGate chan struct{}                                 // RecParent's OnStart waits for it when set
	onStart    func(ctx context.Context, p *recParent) error // RecParent's OnStart

	mu        sync.Mutex
	finishes  []recFinish
	stepRuns  map[string]int // RecStepper tool executions per "run:n"
	stepTotal int
}

type recFinish struct {
	Run    agenttool.Run
	Result agenttool.Result
}

const recStepCount = 6

func newRecKit() *recKit {
	k := &recKit{
		mclock:   clockwork.NewFakeClock(),
		sclock:   clockwork.NewFakeClock(),
		block:    make(chan struct{}),
		stepRuns: map[string]int{},
	}
	k.child = scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text(recText)})),
		scripted.WithChunkSize(6), scripted.WithDelay(recTick), scripted.WithClock(k.mclock))
	k.stuck = scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("stuck for a while, then done")})),
		scripted.WithChunkSize(6), scripted.WithDelay(recTick), scripted.WithClock(k.sclock))
	// RecStepper: one "step" tool call per model call until recStepCount
	// tools ran, then a closing text.
	k.steps = scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
		n := 0
		for _, m := range req.Messages {
			for _, c := range m.Content {
				if c.Kind == model.ContentToolResult {
					n++
				}
			}
		}
		if n < recStepCount {
			return scripted.Reply{scripted.Text(fmt.Sprintf("step %d. ", n+1)), scripted.ToolCall("step", recStepIn{N: n + 1})}
		}
		return scripted.Reply{scripted.Text("All steps done.")}
	}), scripted.WithChunkSize(4), scripted.WithDelay(recTick), scripted.WithClock(k.mclock))
	return k
}

func (k *recKit) finishesOf(runID string) []recFinish {
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

// recParent is the parent; its re-attach budgets come from the kit.
type recParent struct {
	agent.Base
	k *recKit
}

func (p *recParent) OnStart(ctx context.Context) error {
	if g := p.k.parentGate; g != nil {
		select {
		case <-g:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if p.k.onStart != nil {
		return p.k.onStart(ctx, p)
	}
	return nil
}

func (p *recParent) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	p.k.mu.Lock()
	p.k.finishes = append(p.k.finishes, recFinish{run, res})
	p.k.mu.Unlock()
}

func (p *recParent) AgentToolReattachNoProgressTimeout() time.Duration {
	if p.k.noProgress == 0 {
		return agenttool.DefaultReattachNoProgressTimeout
	}
	return p.k.noProgress
}

func (p *recParent) AgentToolReattachMaxWindow() time.Duration { return p.k.maxWindow }

// recPlainParent has no budget overrides (101).
type recPlainParent struct{ agent.Base }

// recChild streams recText on the kit's model clock.
type recChild struct {
	chat.Base
	k *recKit
}

func (c *recChild) ChatModel() model.Model { return c.k.child }

// recStuck streams on a clock that only the test moves.
type recStuck struct {
	chat.Base
	k *recKit
}

func (c *recStuck) ChatModel() model.Model { return c.k.stuck }

// recBlocking's hydration blocks until the test closes k.block.
type recBlocking struct {
	chat.Base
	k *recKit
}

func (c *recBlocking) OnStart(ctx context.Context) error {
	select {
	case <-c.k.block:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (c *recBlocking) ChatModel() model.Model { return c.k.child }

// recBroken fails its hydration.
type recBroken struct{ chat.Base }

func (c *recBroken) OnStart(ctx context.Context) error { return errors.New("broken child") }

// recStepper runs recStepCount tool steps; each execution is counted.
type recStepper struct {
	chat.Base
	k *recKit
}

type recStepIn struct {
	N int `json:"n"`
}

func (c *recStepper) ChatModel() model.Model { return c.k.steps }
func (c *recStepper) MaxSteps() int          { return recStepCount + 2 }
func (c *recStepper) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("step", "Do one step.", func(ctx context.Context, in recStepIn) (string, error) {
		c.k.mu.Lock()
		c.k.stepRuns[fmt.Sprintf("%s:%d", c.Name(), in.N)]++
		c.k.stepTotal++
		c.k.mu.Unlock()
		return fmt.Sprintf("did %d", in.N), nil
	})}
}
func (c *recStepper) RecoverTurn(ctx context.Context, partial message.Message) chat.Recovery {
	if c.k.policy != nil {
		return *c.k.policy
	}
	return chat.RecoverContinue
}

// recEnv is one runtime of a test.
type recEnv struct {
	*testenv.Env
	clock *clockwork.FakeClock // the runtime's clock (budgets)
	ev    *recEvents
}

// recStart starts a runtime on dir ("" for a new folder).
func recStart(t *testing.T, k *recKit, dir string) *recEnv {
	t.Helper()
	return recStartWith(t, k, dir, newRecEvents(), nil)
}

// recStartWith is recStart with the event recorder given and a hook that
// sees the runtime before it starts.
func recStartWith(t *testing.T, k *recKit, dir string, ev *recEvents, setup func(rt *agent.Runtime)) *recEnv {
	t.Helper()
	clock := clockwork.NewFakeClockAt(time.Now())
	env := startEnv(t, testenv.Options{
		Postgres: &pg,
		Dir:      dir,
		Clock:    clock,
		Classes: []agent.Class{
			{Name: "RecParent", New: func() agent.Agent { return &recParent{k: k} }, Public: true},
			{Name: "RecPlainParent", New: func() agent.Agent { return &recPlainParent{} }, Public: true},
			{Name: "RecChild", New: func() agent.Agent { return &recChild{k: k} }},
			{Name: "RecStuck", New: func() agent.Agent { return &recStuck{k: k} }},
			{Name: "RecBlocking", New: func() agent.Agent { return &recBlocking{k: k} }},
			{Name: "RecBroken", New: func() agent.Agent { return &recBroken{} }},
			{Name: "RecStepper", New: func() agent.Agent { return &recStepper{k: k} }},
		},
	},
		// Every chunk is persisted as it is written: no flush timers on
		// the runtime's clock, which only the budgets use.
		chat.Config{FlushChunks: 1}, agenttool.Options{},
		func(rt *agent.Runtime) {
			rt.Diag().Subscribe(diag.ChannelAgentTool, ev.add)
			rt.Diag().Subscribe(diag.ChannelChat, ev.add)
			rt.Diag().Subscribe(diag.ChannelAgent, ev.add)
			if setup != nil {
				setup(rt)
			}
		})
	return &recEnv{Env: env, clock: clock, ev: ev}
}

func (e *recEnv) parent(t *testing.T, class, name string) agent.Agent {
	t.Helper()
	p, err := e.RT.Get(recCtx(t), agent.Root(class, name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ---------------------------------------------------------------------------
// Observability events.

// recEvents is the event log of a recovery test's runtimes.
type recEvents struct{ events }

func newRecEvents() *recEvents { return &recEvents{events: events{changed: make(chan struct{})}} }

// wait returns the first event of type typ whose attrs match (runId when
// run is not "").
func (r *recEvents) wait(t *testing.T, typ, run string) diag.Event {
	t.Helper()
	return r.waitWhere(t, recCtx(t), func() string {
		return "event " + typ + " " + run + "; events:\n" + recDumpEvents(r.all())
	}, recMatch(typ, run))
}

// waitN waits until n events of type typ (for run) were seen.
func (r *recEvents) waitN(t *testing.T, typ, run string, n int) {
	t.Helper()
	r.waitCount(t, recCtx(t), func() string {
		return fmt.Sprintf("%d events %s %s; events:\n%s", n, typ, run, recDumpEvents(r.all()))
	}, n, recMatch(typ, run))
}

func (r *recEvents) count(typ, run string) int { return r.countWhere(recMatch(typ, run)) }

func recMatch(typ, run string) func(diag.Event) bool {
	return func(e diag.Event) bool { return e.Type == typ && (run == "" || e.Attrs["runId"] == run) }
}

// waitTurn waits for the chat turn event of the instance at path.
func (r *recEvents) waitTurn(t *testing.T, path agent.Path) diag.Event {
	t.Helper()
	return r.waitWhere(t, recCtx(t), func() string { return "the turn of " + path.String() }, func(e diag.Event) bool {
		return e.Channel == diag.ChannelChat && e.Type == "turn" && e.Agent == path.String()
	})
}

func recDumpEvents(es []diag.Event) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "%s %s %s %v\n", e.Channel, e.Type, e.Agent, e.Attrs)
	}
	return b.String()
}

// ---------------------------------------------------------------------------
// Driving the models and the budgets.

// recHold waits until a model stream waits on clock (it has written its
// latest event, which is then persisted since every chunk flushes).
func recHold(t *testing.T, clock *clockwork.FakeClock) {
	t.Helper()
	if err := clock.BlockUntilContext(recCtx(t), 1); err != nil {
		t.Fatalf("no model stream waits on the clock: %v", err)
	}
}

// recStep lets a held stream write n more events.
func recStep(t *testing.T, clock *clockwork.FakeClock, n int) {
	t.Helper()
	for range n {
		recHold(t, clock)
		clock.Advance(recTick)
	}
	recHold(t, clock)
}

// recBudget waits until n timers wait on the runtime's clock, then moves it
// by d.
func (e *recEnv) recBudget(t *testing.T, n int, d time.Duration) {
	t.Helper()
	if err := e.clock.BlockUntilContext(recCtx(t), n); err != nil {
		t.Fatalf("waiting for %d budget timers: %v", n, err)
	}
	e.clock.Advance(d)
}

// ---------------------------------------------------------------------------
// Dispatch, restart and registry helpers.

type recOutcome struct {
	res agenttool.Result
	err error
}

// recDispatch runs RunAgentTool in the background, with the runtime's
// context as a chat turn has it (a context that outlives the runtime would
// keep the call waiting after Close: see the report).
func recDispatch(parent agent.Agent, class, runID string, input any) <-chan recOutcome {
	out := make(chan recOutcome, 1)
	ctx := agent.WithAgent(agent.BaseOf(parent).Runtime().Context(), parent)
	go func() {
		res, err := agenttool.RunAgentTool(ctx, parent, class,
			agenttool.RunOptions{RunID: runID, Input: input, ParentToolCallID: "call-" + runID})
		out <- recOutcome{res, err}
	}()
	return out
}

func recResult(t *testing.T, ch <-chan recOutcome) recOutcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-recCtx(t).Done():
		t.Fatal("timed out waiting for RunAgentTool")
	}
	return recOutcome{}
}

// recCrash closes the runtime in the middle of a run whose dispatch then
// returns agent.ErrClosed (what a killed process leaves behind: rows and
// streams exactly as persisted).
func recCrash(t *testing.T, e *recEnv, pending ...<-chan recOutcome) {
	t.Helper()
	e.Close()
	for _, p := range pending {
		if o := recResult(t, p); !errors.Is(o.err, agent.ErrClosed) {
			t.Fatalf("dispatch during the close returned %+v, %v; want agent.ErrClosed", o.res, o.err)
		}
	}
}

// recSeed inserts a registry row as a crash leaves it (status running).
func recSeed(t *testing.T, db store.DB, parent agent.Agent, runID, class string, started time.Time) {
	t.Helper()
	ctx := recCtx(t)
	err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO agent_tool_runs (instance_id, run_id, parent_tool_call_id, agent_type, input_preview,
			status, display_order, started_at) VALUES (?, ?, ?, ?, '"seeded"', 'running', 0, ?)`,
			agent.BaseOf(parent).InstanceID(), runID, "call-"+runID, class, started.UnixMilli())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// recRehydrate evicts an idle parent and hydrates it again (its start-up
// recovery runs).
func recRehydrate(t *testing.T, e *recEnv, parent agent.Agent) agent.Agent {
	t.Helper()
	path := agent.BaseOf(parent).Path()
	if !e.RT.Evict(path) {
		t.Fatalf("could not evict %s", path)
	}
	p, err := e.RT.Get(recCtx(t), path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func recChildAgent(t *testing.T, e *recEnv, parent agent.Agent, class, runID string) agent.Agent {
	t.Helper()
	c, err := e.RT.Get(recCtx(t), agent.BaseOf(parent).Path().Child(class, runID))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// recFinalText is the text of the child's last assistant message.
func recFinalText(t *testing.T, child agent.Agent) string {
	t.Helper()
	cb, ok := agent.LayerOf[*chat.Base](child)
	if !ok {
		t.Fatal("child is not a chat agent")
	}
	msgs := cb.Messages()
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == message.RoleAssistant {
			return chat.MessageText(msgs[i])
		}
	}
	return ""
}

func recCheckInterrupted(t *testing.T, r agenttool.Run, reason agenttool.Reason, msg string, still *bool) {
	t.Helper()
	if r.Status != agenttool.StatusInterrupted || r.Reason != reason || r.Error != msg {
		t.Fatalf("run %s: %s %q %q; want interrupted %q %q", r.RunID, r.Status, r.Reason, r.Error, reason, msg)
	}
	switch {
	case still == nil && r.ChildStillRunning != nil:
		t.Fatalf("run %s: childStillRunning %v, want absent", r.RunID, *r.ChildStillRunning)
	case still != nil && (r.ChildStillRunning == nil || *r.ChildStillRunning != *still):
		t.Fatalf("run %s: childStillRunning %v, want %v", r.RunID, r.ChildStillRunning, *still)
	}
}

// recChildRowSettled waits until the child's run row at path is terminal.
// The child records it right after its turn, with no event to wait for, so
// this yields between reads (bounded by the test's deadline).
func recChildRowSettled(t *testing.T, rt *agent.Runtime, path agent.Path) {
	t.Helper()
	ctx := recCtx(t)
	for {
		var status string
		err := rt.DB().View(ctx, func(tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT c.status FROM agent_tool_child_runs c JOIN instances i ON i.id = c.instance_id
				WHERE i.path = ?`, path.String()).Scan(&status)
		})
		if err != nil {
			t.Fatal(err)
		}
		if status != "running" {
			return
		}
		runtime.Gosched()
	}
}

// ---------------------------------------------------------------------------
// WebSocket client of the parent.

// recWS is a WebSocket connection (testenv.WSClient) to the parent whose
// tests read its agent-tool-event frames.
type recWS struct {
	t  *testing.T
	ws *testenv.WSClient[agenttool.Frame]
}

func recDial(t *testing.T, e *recEnv, class, name string) *recWS {
	t.Helper()
	w := &recWS{t: t, ws: testenv.DialWS[agenttool.Frame](t, recWait, e.URL("/agents/"+agent.Kebab(class)+"/"+name))}
	t.Cleanup(w.close)
	return w
}

func (w *recWS) close() { w.ws.CloseNormally() }

// terminal waits for a terminal frame of run and returns the run's frames.
func (w *recWS) terminal(runID string) []agenttool.Frame {
	w.t.Helper()
	return w.until(runID, isTerminal)
}

// until waits until the last frame of run has a kind that done accepts and
// returns the run's frames.
func (w *recWS) until(runID string, done func(kind string) bool) []agenttool.Frame {
	w.t.Helper()
	ctx := recCtx(w.t)
	var fs []agenttool.Frame
	_, err := w.ws.Wait(ctx, func(all []testenv.Frame[agenttool.Frame]) bool {
		fs = framesOf(toolFrames(all), runID)
		n := len(fs)
		return n > 0 && done(fs[n-1].Event.Kind)
	})
	if err != nil {
		w.t.Fatalf("timed out waiting for the terminal frame of %s:\n%s", runID, dumpFrames(fs))
	}
	return fs
}

// recChunks returns how many chunks of run (distinct sequences, replayed
// or live) fs has.
func recChunks(fs []agenttool.Frame, runID string) int {
	seen := map[int64]bool{}
	for _, f := range fs {
		if f.Event.RunID == runID && f.Event.Kind == "chunk" {
			seen[f.Sequence] = true
		}
	}
	return len(seen)
}

// moreChunks waits until the client has more than n chunks of run: with n
// the number the child has committed, the parent has forwarded (and so
// seen) a chunk streamed after them.
func (w *recWS) moreChunks(runID string, n int) {
	w.t.Helper()
	ctx := recCtx(w.t)
	_, err := w.ws.Wait(ctx, func(all []testenv.Frame[agenttool.Frame]) bool {
		return recChunks(toolFrames(all), runID) > n
	})
	if err != nil {
		w.t.Fatalf("timed out waiting for a chunk of %s after %d", runID, n)
	}
}

// recTimeline checks one client's frames of a run: started once and first,
// sequences strictly increasing (none reused), one terminal frame, last.
// It returns the text the chunks rebuild.
func recTimeline(t *testing.T, fs []agenttool.Frame) string {
	t.Helper()
	return recTimelineOpts(t, fs, false)
}

// recTimelineOpts is recTimeline; with repaired, an interrupted frame may
// come before the end (a soft terminal that a re-attach repairs).
func recTimelineOpts(t *testing.T, fs []agenttool.Frame, repaired bool) string {
	t.Helper()
	if len(fs) == 0 || fs[0].Event.Kind != "started" {
		t.Fatalf("the timeline does not begin with started:\n%s", dumpFrames(fs))
	}
	b := message.NewBuilder("")
	last := int64(-1)
	for i, f := range fs {
		if f.Sequence <= last {
			t.Fatalf("frame %d has sequence %d after %d (reused or decreasing):\n%s", i, f.Sequence, last, dumpFrames(fs))
		}
		last = f.Sequence
		switch {
		case i > 0 && f.Event.Kind == "started":
			t.Fatalf("started twice:\n%s", dumpFrames(fs))
		case isTerminal(f.Event.Kind) && i != len(fs)-1 && !(repaired && f.Event.Kind == "interrupted"):
			t.Fatalf("terminal frame %d is not last:\n%s", i, dumpFrames(fs))
		case f.Event.Kind == "chunk":
			var ch message.Chunk
			if err := json.Unmarshal([]byte(f.Event.Body), &ch); err != nil {
				t.Fatalf("chunk %d: %v", f.Sequence, err)
			}
			if err := b.Apply(ch); err != nil {
				t.Fatalf("chunk %d does not apply: %v\n%s", f.Sequence, err, dumpFrames(fs))
			}
		}
	}
	return chat.MessageText(b.Message())
}

// ---------------------------------------------------------------------------
// G 83, 138: a child that finished while the parent was away is collected
// without running anything again.

func TestRecoverCollectsCompletedChild(t *testing.T) {
	t.Run("recorded", func(t *testing.T) { testRecoverCollects(t, false) })
	// The process died after the child's turn was submitted and before its
	// id was written to the child's run row: the child finds the turn by
	// the submission's key and still finishes the run by itself.
	t.Run("turn id not recorded", func(t *testing.T) { testRecoverCollects(t, true) })
}

func testRecoverCollects(t *testing.T, forgetTurnID bool) {
	k := newRecKit()
	e1 := recStart(t, k, "")
	p := e1.parent(t, "RecParent", "p")
	run := recDispatch(p, "RecChild", "r1", "collect me")
	recStep(t, k.mclock, 3)
	recCrash(t, e1, run)

	// Both wake on start. The parent's own start-up waits (in OnStart,
	// before its recovery) until the child finished its turn by itself.
	k.parentGate = make(chan struct{})
	ev := newRecEvents()
	rtc := make(chan *agent.Runtime, 1)
	started := make(chan *recEnv, 1)
	go func() {
		started <- recStartWith(t, k, e1.Dir, ev, func(rt *agent.Runtime) {
			if forgetTurnID {
				ctx := recCtx(t)
				err := rt.DB().Update(ctx, func(tx store.Tx) error {
					_, err := tx.Exec(ctx, `UPDATE agent_tool_child_runs SET request_id = NULL WHERE run_id = 'r1'`)
					return err
				})
				if err != nil {
					panic(err)
				}
			}
			rtc <- rt
		})
	}()
	rt2 := <-rtc
	stop := pump(k.mclock)
	childPath := agent.Root("RecParent", "p").Child("RecChild", "r1")
	ev.waitTurn(t, childPath)
	stop()
	recChildRowSettled(t, rt2, childPath)
	close(k.parentGate)
	e2 := <-started
	calls := len(k.child.Calls())
	if calls != 2 {
		t.Fatalf("model calls before the parent's recovery: %d, want 2 (the interrupted one and the recovered turn)", calls)
	}
	child := recChildAgent(t, e2, p, "RecChild", "r1")
	before, err := agenttool.InspectAgentToolRun(recCtx(t), e2.parent(t, "RecParent", "p"), "r1")
	if err != nil || before == nil || before.Status != agenttool.StatusCompleted {
		t.Fatalf("child inspection %+v %v, want completed", before, err)
	}

	w := recDial(t, e2, "RecParent", "p")
	fs := w.terminal("r1")
	e2.ev.wait(t, "recovery:complete", "")
	p2 := e2.parent(t, "RecParent", "p")
	r := getRun(t, p2, "r1")
	if r.Status != agenttool.StatusCompleted || r.Summary != recText || r.Error != "" || r.Reason != "" {
		t.Fatalf("row %+v, want completed with the child's text", r)
	}
	if got := len(k.child.Calls()); got != calls {
		t.Fatalf("the parent's recovery ran the child's model again: %d calls, want %d", got, calls)
	}
	fin := k.finishesOf("r1")
	if len(fin) != 1 || fin[0].Result.Status != agenttool.StatusCompleted || fin[0].Run.ParentToolCallID != "call-r1" ||
		string(fin[0].Run.InputPreview) != `"collect me"` {
		t.Fatalf("finish hooks %+v, want one completed with the run's tool call and preview", fin)
	}
	last := fs[len(fs)-1]
	if last.Event.Kind != "finished" || last.Event.Summary == nil || *last.Event.Summary != recText {
		t.Fatalf("last frame %+v, want finished with the summary", last)
	}
	if text := recTimeline(t, fs); text != recText || recFinalText(t, child) != recText {
		t.Fatalf("rebuilt %q, child %q; want %q", text, recFinalText(t, child), recText)
	}
	row := e2.ev.wait(t, "recovery:row", "r1")
	if row.Attrs["status"] != "completed" || row.Attrs["reason"] != "" {
		t.Fatalf("recovery:row %v", row.Attrs)
	}
	if e2.ev.count("recovery:reattach", "r1") != 0 {
		t.Fatal("the finished child was re-attached instead of collected")
	}
	// 138: the settled child row is left as it was.
	after, err := agenttool.InspectAgentToolRun(recCtx(t), p2, "r1")
	if err != nil || after == nil || after.RequestID != before.RequestID || after.Status != before.Status ||
		!after.CompletedAt.Equal(*before.CompletedAt) {
		t.Fatalf("settled child row changed: %+v -> %+v", before, after)
	}
}

// ---------------------------------------------------------------------------
// G 84 (+ difference 1): a running child is re-attached and followed to its
// end, after a whole restart and after an eviction of the parent alone.

func TestRecoverReattachesRunningChild(t *testing.T) {
	t.Run("restart", func(t *testing.T) {
		k := newRecKit()
		e1 := recStart(t, k, "")
		p := e1.parent(t, "RecParent", "p")
		run := recDispatch(p, "RecChild", "r1", "follow me")
		recStep(t, k.mclock, 4)
		recCrash(t, e1, run)

		e2 := recStart(t, k, e1.Dir)
		// The child resumed its turn on start and waits on its model.
		recHold(t, k.mclock)
		w := recDial(t, e2, "RecParent", "p") // hydrates the parent
		e2.ev.wait(t, "recovery:reattach", "r1")
		stop := pump(k.mclock)
		defer stop()
		fs := w.terminal("r1")
		p2 := e2.parent(t, "RecParent", "p")
		recCheckReattached(t, e2, k, p2, fs)
	})
	t.Run("parent-pinned", func(t *testing.T) {
		// A parent that awaits a run is pinned: an idle sweep or an
		// eviction leaves it in memory, so its await never loses its
		// instance (and it is never hydrated a second time).
		k := newRecKit()
		e := recStart(t, k, "")
		p := e.parent(t, "RecParent", "p")
		run := recDispatch(p, "RecChild", "r1", "follow me")
		recStep(t, k.mclock, 4)
		path := agent.BaseOf(p).Path()
		e.clock.Advance(time.Hour) // far past the idle timeout
		if e.RT.Evict(path) || e.RT.EvictIdle() != 0 || !e.RT.Resident(path) {
			t.Fatal("the parent awaiting a run was evicted")
		}
		stop := pump(k.mclock)
		defer stop()
		if o := recResult(t, run); o.err != nil || o.res.Status != agenttool.StatusCompleted || o.res.Summary != recText {
			t.Fatalf("dispatch: %+v %v", o.res, o.err)
		}
		if a, ok := e.RT.Lookup(path); !ok || a != p {
			t.Fatal("the parent was hydrated a second time")
		}
	})
}

func recCheckReattached(t *testing.T, e *recEnv, k *recKit, p agent.Agent, fs []agenttool.Frame) {
	t.Helper()
	row := e.ev.wait(t, "recovery:row", "r1")
	if row.Attrs["status"] != "completed" {
		t.Fatalf("recovery:row %v", row.Attrs)
	}
	r := getRun(t, p, "r1")
	if r.Status != agenttool.StatusCompleted || r.Summary != recText {
		t.Fatalf("row %+v, want completed", r)
	}
	if fin := k.finishesOf("r1"); len(fin) != 1 || fin[0].Result.Status != agenttool.StatusCompleted {
		t.Fatalf("finish hooks %+v, want one completed", fin)
	}
	if last := fs[len(fs)-1]; last.Event.Kind != "finished" {
		t.Fatalf("last frame %+v", last)
	}
	child := recChildAgent(t, e, p, "RecChild", "r1")
	text := recTimeline(t, fs)
	if want := recFinalText(t, child); text != want || want != recText {
		t.Fatalf("the client rebuilt %q; the child's answer is %q; want %q", text, want, recText)
	}
	if ev := e.ev.wait(t, "recovery:reattach", "r1"); ev.Attrs["budgetMs"] != agenttool.DefaultReattachNoProgressTimeout.Milliseconds() {
		t.Fatalf("reattach budget %v", ev.Attrs)
	}
}

// ---------------------------------------------------------------------------
// G 85 + 93 (+ §6.7): a stuck child is given up after the no-progress
// budget (2 min by default) and stays repairable: a later dispatch of the
// same run id re-attaches and records completed.

func TestRecoverNoProgressThenRepair(t *testing.T) {
	k := newRecKit()
	e1 := recStart(t, k, "")
	p := e1.parent(t, "RecParent", "p")
	run := recDispatch(p, "RecStuck", "s1", "hang")
	recStep(t, k.sclock, 2)
	recCrash(t, e1, run)

	e2 := recStart(t, k, e1.Dir)
	recHold(t, k.sclock) // the child's recovered turn waits on its model
	w := recDial(t, e2, "RecParent", "p")
	e2.ev.wait(t, "recovery:reattach", "s1")
	e2.recBudget(t, 1, agenttool.DefaultReattachNoProgressTimeout-time.Millisecond)
	e2.recBudget(t, 1, time.Millisecond)
	ev := e2.ev.wait(t, "recovery:row", "s1")
	if ev.Attrs["status"] != "interrupted" || ev.Attrs["reason"] != "no-progress" || ev.Attrs["error"] != msgNoProgress {
		t.Fatalf("recovery:row %v", ev.Attrs)
	}
	if g := e2.ev.wait(t, "recovery:gave-up", "s1"); g.Attrs["reason"] != "no-progress" {
		t.Fatalf("gave-up %v", g.Attrs)
	}
	p2 := e2.parent(t, "RecParent", "p")
	recCheckInterrupted(t, getRun(t, p2, "s1"), agenttool.ReasonNoProgress, msgNoProgress, ptr(true))
	fin := k.finishesOf("s1")
	if len(fin) != 1 || fin[0].Result.Reason != agenttool.ReasonNoProgress || fin[0].Result.ChildStillRunning == nil ||
		!*fin[0].Result.ChildStillRunning || fin[0].Result.Error != msgNoProgress {
		t.Fatalf("finish hooks %+v", fin)
	}
	fs := w.terminal("s1")
	if last := fs[len(fs)-1]; last.Event.Kind != "interrupted" || last.Event.Reason != "no-progress" ||
		last.Event.ChildStillRunning == nil || !*last.Event.ChildStillRunning {
		t.Fatalf("last frame %+v", last)
	}
	// The child is still running: it was not torn down.
	if insp, err := agenttool.InspectAgentToolRun(recCtx(t), p2, "s1"); err != nil || insp == nil || insp.Status != "running" {
		t.Fatalf("child after no-progress: %+v %v", insp, err)
	}
	calls := len(k.stuck.Calls())

	// Repair: the same run id again re-attaches; the child makes progress.
	again := recDispatch(p2, "RecStuck", "s1", "ignored new input")
	e2.ev.waitN(t, "recovery:reattach", "s1", 2)
	stop := pump(k.sclock)
	defer stop()
	o := recResult(t, again)
	if o.err != nil || o.res.Status != agenttool.StatusCompleted || o.res.Summary != "stuck for a while, then done" {
		t.Fatalf("re-dispatch: %+v %v", o.res, o.err)
	}
	r := getRun(t, p2, "s1")
	if r.Status != agenttool.StatusCompleted || r.Reason != "" || r.ChildStillRunning != nil || r.Error != "" {
		t.Fatalf("repaired row %+v", r)
	}
	if got := len(k.stuck.Calls()); got != calls {
		t.Fatalf("the re-dispatch ran the child again: %d model calls, want %d", got, calls)
	}
	if n := e2.ev.count("recovery:reattach", "s1"); n != 2 {
		t.Fatalf("%d reattach events, want 2 (recovery, re-dispatch)", n)
	}
	// The interrupted frame is terminal too: wait for the repair's end, which
	// the re-dispatch broadcast before it returned but may not have arrived.
	fs = w.until("s1", func(kind string) bool { return kind == "finished" })
	// One timeline across the give-up and the repair: nothing sent twice.
	recTimelineOpts(t, fs, true)
	if last := fs[len(fs)-1]; last.Event.Kind != "finished" {
		t.Fatalf("last frame after the repair %+v", last)
	}
	if len(k.finishesOf("s1")) != 2 {
		t.Fatalf("finish hooks %+v, want interrupted then completed", k.finishesOf("s1"))
	}
}

// ---------------------------------------------------------------------------
// G 88 (+ the seed's "reset by every chunk"): the no-progress budget counts
// silence, not time: a child that keeps streaming is followed past the
// budget, and one that falls silent is given up one full budget after its
// last chunk.

func TestRecoverNoProgressResetByChunks(t *testing.T) {
	k := newRecKit()
	e1 := recStart(t, k, "")
	p := e1.parent(t, "RecParent", "p")
	run := recDispatch(p, "RecChild", "r1", "slow")
	recStep(t, k.mclock, 2)
	recCrash(t, e1, run)

	e := recStart(t, k, e1.Dir)
	recHold(t, k.mclock)                 // the child resumed its turn and waits on its model
	w := recDial(t, e, "RecParent", "p") // hydrates the parent
	p = e.parent(t, "RecParent", "p")
	e.ev.wait(t, "recovery:reattach", "r1")
	budget := agenttool.DefaultReattachNoProgressTimeout
	e.recBudget(t, 1, budget*3/4)
	// A chunk (seen by the parent once a client has it): the budget
	// starts again.
	committed := func() int {
		child := recChildAgent(t, e, p, "RecChild", "r1")
		cb, _ := agent.LayerOf[*chat.Base](child)
		insp, err := agenttool.InspectAgentToolRun(recCtx(t), p, "r1")
		if err != nil || insp == nil {
			t.Fatal(err)
		}
		chunks, err := cb.StreamChunks(recCtx(t), insp.RequestID, -1)
		if err != nil {
			t.Fatal(err)
		}
		return len(chunks)
	}
	n := committed()
	w.moreChunks("r1", n-1) // the client has every chunk so far
	recStep(t, k.mclock, 1)
	w.moreChunks("r1", n)
	e.recBudget(t, 1, budget*3/4)
	n = committed()
	w.moreChunks("r1", n-1)
	recStep(t, k.mclock, 1) // another one, past the first budget's end
	w.moreChunks("r1", n)
	if r := getRun(t, p, "r1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("given up while the child streams: %+v", r)
	}
	// Now silence for one whole budget.
	e.recBudget(t, 1, budget)
	ev := e.ev.wait(t, "recovery:row", "r1")
	if ev.Attrs["reason"] != "no-progress" {
		t.Fatalf("recovery:row %v", ev.Attrs)
	}
	recCheckInterrupted(t, getRun(t, p, "r1"), agenttool.ReasonNoProgress, msgNoProgress, ptr(true))
	// A dispatch of the same run id follows the child, which never
	// stopped, to its end and repairs the run.
	stop := pump(k.mclock)
	defer stop()
	if o := recResult(t, recDispatch(p, "RecChild", "r1", "slow")); o.err != nil || o.res.Status != agenttool.StatusCompleted {
		t.Fatalf("repairing dispatch %+v %v", o.res, o.err)
	}
}

// ---------------------------------------------------------------------------
// G 86 (and 89 with a finite budget): past the maximum re-attach window the
// child is torn down and the run interrupted with window-exceeded.

func TestRecoverWindowExceeded(t *testing.T) {
	k := newRecKit()
	k.noProgress = time.Hour
	k.maxWindow = 10 * time.Minute
	e1 := recStart(t, k, "")
	p := e1.parent(t, "RecParent", "p")
	run := recDispatch(p, "RecStuck", "s1", "hang")
	recStep(t, k.sclock, 2)
	recCrash(t, e1, run)

	e2 := recStart(t, k, e1.Dir)
	recHold(t, k.sclock)
	p2 := e2.parent(t, "RecParent", "p")
	ev := e2.ev.wait(t, "recovery:reattach", "s1")
	if ev.Attrs["budgetMs"] != time.Hour.Milliseconds() { // 91: the override is used
		t.Fatalf("reattach %v", ev.Attrs)
	}
	e2.recBudget(t, 2, k.maxWindow)
	row := e2.ev.wait(t, "recovery:row", "s1")
	if row.Attrs["reason"] != "window-exceeded" || row.Attrs["error"] != msgWindow {
		t.Fatalf("recovery:row %v", row.Attrs)
	}
	recCheckInterrupted(t, getRun(t, p2, "s1"), agenttool.ReasonWindowExceeded, msgWindow, ptr(false))
	insp, err := agenttool.InspectAgentToolRun(recCtx(t), p2, "s1")
	if err != nil || insp == nil || insp.Status != agenttool.StatusAborted ||
		insp.Error != "agent tool run given up by parent recovery: window-exceeded" {
		t.Fatalf("child after window-exceeded: %+v %v", insp, err)
	}
	if fin := k.finishesOf("s1"); len(fin) != 1 || fin[0].Result.Reason != agenttool.ReasonWindowExceeded {
		t.Fatalf("finish hooks %+v", fin)
	}
}

// ---------------------------------------------------------------------------
// G 92: re-attaches run in parallel: a stuck child does not hold up a fast
// sibling.

func TestRecoverParallelReattach(t *testing.T) {
	k := newRecKit()
	e1 := recStart(t, k, "")
	p := e1.parent(t, "RecParent", "p")
	stuck := recDispatch(p, "RecStuck", "a-stuck", "hang")
	recStep(t, k.sclock, 1)
	fast := recDispatch(p, "RecChild", "b-fast", "go")
	recStep(t, k.mclock, 1)
	recCrash(t, e1, stuck, fast)

	e2 := recStart(t, k, e1.Dir)
	recHold(t, k.sclock)
	recHold(t, k.mclock)
	p2 := e2.parent(t, "RecParent", "p")
	e2.ev.wait(t, "recovery:reattach", "a-stuck")
	e2.ev.wait(t, "recovery:reattach", "b-fast")
	stop := pump(k.mclock)
	defer stop()
	if ev := e2.ev.wait(t, "recovery:row", "b-fast"); ev.Attrs["status"] != "completed" {
		t.Fatalf("fast: %v", ev.Attrs)
	}
	if r := getRun(t, p2, "a-stuck"); r.Status != agenttool.StatusRunning {
		t.Fatalf("stuck row %+v while the fast one completed, want running", r)
	}
	if e2.ev.count("recovery:complete", "") != 0 {
		t.Fatal("recovery completed before the stuck run ended")
	}
	e2.recBudget(t, 1, agenttool.DefaultReattachNoProgressTimeout)
	if ev := e2.ev.wait(t, "recovery:row", "a-stuck"); ev.Attrs["reason"] != "no-progress" {
		t.Fatalf("stuck: %v", ev.Attrs)
	}
	done := e2.ev.wait(t, "recovery:complete", "")
	if done.Attrs["runCount"] != 2 {
		t.Fatalf("recovery:complete %v", done.Attrs)
	}
	if begin := e2.ev.wait(t, "recovery:begin", ""); begin.Attrs["runCount"] != 2 || begin.Attrs["totalTimeoutMs"] != int64(5000) {
		t.Fatalf("recovery:begin %v", begin.Attrs)
	}
}

// ---------------------------------------------------------------------------
// G 94, 95, 96, 97: an inspection that hangs (the child's hydration blocks)
// is cut at 2 s; the start-up does not wait for the recovery; concurrent
// hydrations recover once.

func TestRecoverInspectTimeoutInBackground(t *testing.T) {
	k := newRecKit()
	defer func() {
		select {
		case <-k.block:
		default:
			close(k.block)
		}
	}()
	e := recStart(t, k, "")
	p := e.parent(t, "RecParent", "p")
	recSeed(t, e.RT.DB(), p, "b1", "RecBlocking", e.clock.Now())
	path := agent.BaseOf(p).Path()
	if !e.RT.Evict(path) {
		t.Fatal("could not evict the parent")
	}
	// Three concurrent hydrations: the runtime hydrates once, so one
	// recovery runs.
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.RT.Get(recCtx(t), path); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait() // start-up returned while the inspection hangs
	p = e.parent(t, "RecParent", "p")
	if r := getRun(t, p, "b1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("row right after start-up %+v, want running", r)
	}
	w := recDial(t, e, "RecParent", "p")
	e.ev.wait(t, "recovery:begin", "")
	e.recBudget(t, 1, 2*time.Second-time.Millisecond)
	if r := getRun(t, p, "b1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("row before 2 s %+v, want running", r)
	}
	e.recBudget(t, 1, time.Millisecond)
	// Cut at 2 s, the inspection is still waited for: the run is not
	// ended for a slow inspection, only for one that does not answer
	// within the no-progress budget.
	e.recBudget(t, 1, agenttool.DefaultReattachNoProgressTimeout-time.Millisecond)
	if r := getRun(t, p, "b1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("row before the no-progress budget %+v, want running", r)
	}
	if fin := k.finishesOf("b1"); len(fin) != 0 {
		t.Fatalf("finish hooks %+v before the run ended", fin)
	}
	e.clock.Advance(time.Millisecond)
	ev := e.ev.wait(t, "recovery:row", "b1")
	if ev.Attrs["status"] != "interrupted" || ev.Attrs["reason"] != "inspect-timeout" || ev.Attrs["error"] != msgInspectTimeout {
		t.Fatalf("recovery:row %v", ev.Attrs)
	}
	recCheckInterrupted(t, getRun(t, p, "b1"), agenttool.ReasonInspectTimeout, msgInspectTimeout, nil)
	// The connect replay of w reads the child's live stream, so it waits
	// for the hung hydration: let it end.
	close(k.block)
	fs := w.terminal("b1")
	if last := fs[len(fs)-1]; last.Event.Kind != "interrupted" || last.Event.Error != msgInspectTimeout || last.Event.Reason != "inspect-timeout" {
		t.Fatalf("last frame %+v", last)
	}
	e.ev.wait(t, "recovery:complete", "")
	if fin := k.finishesOf("b1"); len(fin) != 1 {
		t.Fatalf("finish hooks %+v, want one", fin)
	}
	if n := e.ev.count("recovery:begin", ""); n != 1 {
		t.Fatalf("%d recoveries, want 1", n)
	}
}

// ---------------------------------------------------------------------------
// G 111 / spec 6.5 inspect-failed: an unregistered class and a child whose
// hydration fails.

func TestRecoverInspectFailed(t *testing.T) {
	k := newRecKit()
	e := recStart(t, k, "")
	p := e.parent(t, "RecParent", "p")
	now := e.clock.Now()
	recSeed(t, e.RT.DB(), p, "m1", "RecMissing", now)
	recSeed(t, e.RT.DB(), p, "m2", "RecBroken", now.Add(time.Millisecond))
	p = recRehydrate(t, e, p)
	e.ev.wait(t, "recovery:complete", "")
	for _, id := range []string{"m1", "m2"} {
		ev := e.ev.wait(t, "recovery:row", id)
		if ev.Attrs["reason"] != "inspect-failed" || ev.Attrs["error"] != msgInspectFailed {
			t.Fatalf("%s: recovery:row %v", id, ev.Attrs)
		}
		recCheckInterrupted(t, getRun(t, p, id), agenttool.ReasonInspectFailed, msgInspectFailed, nil)
		if len(k.finishesOf(id)) != 1 {
			t.Fatalf("%s: finish hooks %+v", id, k.finishesOf(id))
		}
	}
}

// ---------------------------------------------------------------------------
// Spec 6.2/6.5 recovery-deadline: inspections that hang use up the 5 s of
// the classification pass; the rows after it are sealed without inspection.

func TestRecoverDeadline(t *testing.T) {
	k := newRecKit()
	defer close(k.block)
	e := recStart(t, k, "")
	p := e.parent(t, "RecParent", "p")
	now := e.clock.Now()
	for i := range 4 {
		recSeed(t, e.RT.DB(), p, fmt.Sprintf("d%d", i+1), "RecBlocking", now.Add(time.Duration(i)*time.Millisecond))
	}
	p = recRehydrate(t, e, p)
	e.recBudget(t, 1, 2*time.Second) // d1
	e.recBudget(t, 1, 2*time.Second) // d2
	e.recBudget(t, 1, time.Second)   // d3: only 1 s was left
	// d4 is past the deadline. None of them is ended yet: their
	// inspections are waited for up to the no-progress budget.
	e.ev.wait(t, "recovery:deadline", "d4")
	for _, id := range []string{"d1", "d2", "d3", "d4"} {
		if r := getRun(t, p, id); r.Status != agenttool.StatusRunning {
			t.Fatalf("%s after the classification pass %+v, want running", id, r)
		}
	}
	e.recBudget(t, 4, agenttool.DefaultReattachNoProgressTimeout)
	e.ev.wait(t, "recovery:complete", "")
	for _, id := range []string{"d1", "d2", "d3"} {
		recCheckInterrupted(t, getRun(t, p, id), agenttool.ReasonInspectTimeout, msgInspectTimeout, nil)
	}
	recCheckInterrupted(t, getRun(t, p, "d4"), agenttool.ReasonRecoveryDeadline, msgDeadline, nil)
	if ev := e.ev.wait(t, "recovery:deadline", "d4"); ev.Attrs["elapsedMs"] != int64(5000) {
		t.Fatalf("recovery:deadline %v", ev.Attrs)
	}
	if e.ev.count("recovery:deadline", "") != 1 {
		t.Fatal("more than one deadline event")
	}
	if ev := e.ev.wait(t, "recovery:row", "d4"); ev.Attrs["reason"] != "recovery-deadline" {
		t.Fatalf("recovery:row %v", ev.Attrs)
	}
}

// ---------------------------------------------------------------------------
// G 98: rows recorded during the parent's own OnStart are not recovered.

func TestRecoverSkipsRowsFromOnStart(t *testing.T) {
	k := newRecKit()
	e := recStart(t, k, "")
	p := e.parent(t, "RecParent", "p")
	recSeed(t, e.RT.DB(), p, "stale", "RecMissing", e.clock.Now())
	k.onStart = func(ctx context.Context, self *recParent) error {
		recSeed(t, e.RT.DB(), self, "fresh", "RecMissing", e.clock.Now().Add(time.Second))
		return nil
	}
	p = recRehydrate(t, e, p)
	e.ev.wait(t, "recovery:complete", "")
	if begin := e.ev.wait(t, "recovery:begin", ""); begin.Attrs["runCount"] != 1 {
		t.Fatalf("recovery:begin %v", begin.Attrs)
	}
	recCheckInterrupted(t, getRun(t, p, "stale"), agenttool.ReasonInspectFailed, msgInspectFailed, nil)
	if r := getRun(t, p, "fresh"); r.Status != agenttool.StatusRunning {
		t.Fatalf("row from OnStart %+v, want running", r)
	}
	if e.ev.count("recovery:row", "fresh") != 0 || len(k.finishesOf("fresh")) != 0 {
		t.Fatal("the row recorded by OnStart was recovered")
	}
}

// ---------------------------------------------------------------------------
// G 101: a parent without overrides re-attaches with 2 minutes and no
// window.

func TestRecoverDefaults(t *testing.T) {
	k := newRecKit()
	e1 := recStart(t, k, "")
	p := e1.parent(t, "RecPlainParent", "p")
	run := recDispatch(p, "RecStuck", "s1", "hang")
	recStep(t, k.sclock, 1)
	recCrash(t, e1, run)
	e2 := recStart(t, k, e1.Dir)
	recHold(t, k.sclock)
	p2 := e2.parent(t, "RecPlainParent", "p")
	ev := e2.ev.wait(t, "recovery:reattach", "s1")
	if ev.Attrs["budgetMs"] != int64(120000) {
		t.Fatalf("reattach %v", ev.Attrs)
	}
	// One timer only (no window): a day later the idle timer has fired,
	// nothing tore the child down.
	e2.recBudget(t, 1, 24*time.Hour)
	e2.ev.wait(t, "recovery:row", "s1")
	recCheckInterrupted(t, getRun(t, p2, "s1"), agenttool.ReasonNoProgress, msgNoProgress, ptr(true))
}

// ---------------------------------------------------------------------------
// G 102: canceling a run that the recovery re-attached aborts the child.

func TestRecoverCancelDuringReattach(t *testing.T) {
	k := newRecKit()
	e1 := recStart(t, k, "")
	p := e1.parent(t, "RecParent", "p")
	run := recDispatch(p, "RecStuck", "s1", "hang")
	recStep(t, k.sclock, 1)
	recCrash(t, e1, run)
	e2 := recStart(t, k, e1.Dir)
	recHold(t, k.sclock)
	p2 := e2.parent(t, "RecParent", "p")
	e2.ev.wait(t, "recovery:reattach", "s1")
	if err := agenttool.CancelAgentTool(recCtx(t), p2, "s1", "stop"); err != nil {
		t.Fatal(err)
	}
	r := getRun(t, p2, "s1")
	if r.Status != agenttool.StatusAborted || r.Error != "stop" {
		t.Fatalf("row %+v, want aborted stop", r)
	}
	e2.ev.wait(t, "recovery:complete", "")
	insp, err := agenttool.InspectAgentToolRun(recCtx(t), p2, "s1")
	if err != nil || insp == nil || insp.Status != agenttool.StatusAborted {
		t.Fatalf("child %+v %v, want aborted", insp, err)
	}
	if fin := k.finishesOf("s1"); len(fin) != 1 || fin[0].Result.Status != agenttool.StatusAborted {
		t.Fatalf("finish hooks %+v", fin)
	}
}

// ---------------------------------------------------------------------------
// G 99, 100, 132, 133 and I 135–141 (adapted): the child recovers its own
// turn (continue: completed steps are kept; retry: run again; abandon:
// error), its stream keeps its id, and the frames written after its
// recovery reach the re-attached parent attributed to the run.

func TestRecoverChildFramesStayAttributed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy chat.Recovery
	}{{"continue", chat.RecoverContinue}, {"retry", chat.RecoverRetry}, {"abandon", chat.RecoverAbandon}} {
		t.Run(tc.name, func(t *testing.T) {
			k := newRecKit()
			k.policy = &tc.policy
			e1 := recStart(t, k, "")
			p := e1.parent(t, "RecParent", "p")
			run := recDispatch(p, "RecStepper", "st", "work")
			// Run until two tools executed and the third step streams.
			for {
				recStep(t, k.mclock, 1)
				k.mu.Lock()
				n := k.stepTotal
				k.mu.Unlock()
				if n >= 2 {
					break
				}
			}
			recStep(t, k.mclock, 3)
			before, err := agenttool.InspectAgentToolRun(recCtx(t), p, "st")
			if err != nil || before == nil {
				t.Fatal(err)
			}
			child1 := recChildAgent(t, e1, p, "RecStepper", "st")
			cb1, _ := agent.LayerOf[*chat.Base](child1)
			// The output gate commits the streamed chunks in batches: wait
			// for the third step's start to be committed.
			third := make(chan struct{})
			var once sync.Once
			steps := 0
			stopFollow, err := cb1.FollowStream(recCtx(t), before.RequestID, -1, func(seq int, body string) {
				if strings.Contains(body, `"type":"start-step"`) {
					if steps++; steps == 3 {
						once.Do(func() { close(third) })
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-third:
			case <-recCtx(t).Done():
				t.Fatal("the third step was never committed")
			}
			stopFollow()
			pre, err := cb1.StreamChunks(recCtx(t), before.RequestID, -1)
			if err != nil || len(pre) == 0 {
				t.Fatalf("chunks before the crash: %d %v", len(pre), err)
			}
			callsBefore := len(k.steps.Calls())
			recCrash(t, e1, run)

			e2 := recStart(t, k, e1.Dir)
			w := recDial(t, e2, "RecParent", "p")
			stop := pump(k.mclock)
			defer stop()
			fs := w.terminal("st")
			p2 := e2.parent(t, "RecParent", "p")
			after, err := agenttool.InspectAgentToolRun(recCtx(t), p2, "st")
			if err != nil || after == nil {
				t.Fatal(err)
			}
			if after.RequestID != before.RequestID {
				t.Fatalf("the child's run moved from stream %s to %s", before.RequestID, after.RequestID)
			}
			r := getRun(t, p2, "st")
			last := fs[len(fs)-1]
			if tc.policy == chat.RecoverAbandon {
				if r.Status != agenttool.StatusError || r.Error != "the turn was interrupted by a restart" || last.Event.Kind != "error" {
					t.Fatalf("row %+v, last frame %+v; want error", r, last)
				}
				return
			}
			if r.Status != agenttool.StatusCompleted || !strings.HasSuffix(r.Summary, "All steps done.") {
				t.Fatalf("row %+v, want completed", r)
			}
			// The chunks after the child's recovery are numbered after every
			// chunk of the first attempt and reach the parent with the run id.
			maxPre := pre[len(pre)-1].Seq
			var post int
			for _, f := range fs {
				if f.Event.Kind == "chunk" && f.Sequence > int64(maxPre)+1 {
					post++
				}
			}
			if post == 0 {
				t.Fatalf("no chunk written after the child's recovery reached the parent:\n%s", dumpFrames(fs))
			}
			child := recChildAgent(t, e2, p2, "RecStepper", "st")
			if text := recTimeline(t, fs); text != recFinalText(t, child) {
				t.Fatalf("the client rebuilt %q, the child answered %q", text, recFinalText(t, child))
			}
			k.mu.Lock()
			total, runs := k.stepTotal, k.stepRuns
			k.mu.Unlock()
			calls := len(k.steps.Calls())
			switch tc.policy {
			case chat.RecoverContinue:
				// Completed steps are not asked again: the model calls are
				// the ones before the crash plus the rest of the turn.
				if calls != callsBefore+recStepCount+1-2 && calls != callsBefore+recStepCount+1-3 {
					t.Fatalf("continue: %d model calls (%d before the crash)", calls, callsBefore)
				}
				for n := 1; n <= 2; n++ {
					if runs[fmt.Sprintf("st:%d", n)] != 1 {
						t.Fatalf("continue: step %d ran %d times", n, runs[fmt.Sprintf("st:%d", n)])
					}
				}
				if total > recStepCount+1 {
					t.Fatalf("continue: %d tool executions for %d steps", total, recStepCount)
				}
			case chat.RecoverRetry:
				if calls != callsBefore+recStepCount+1 {
					t.Fatalf("retry: %d model calls (%d before the crash), want the whole turn again", calls, callsBefore)
				}
			}
		})
	}
}

// ---------------------------------------------------------------------------
// A recovery that gives a run up without inspecting its child (here the
// inspection times out) still numbers the terminal event after the chunks
// of the child's stream stored before it, and sends those first: a client
// may have seen them (a connect replay reads a run in flight from its
// child), and the reference's terminal = 1 would reuse their sequences.

func TestRecoverGiveUpNumbersAfterStoredChunks(t *testing.T) {
	k := newRecKit()
	defer close(k.block)
	e := recStart(t, k, "")
	p := e.parent(t, "RecParent", "p")
	now := e.clock.Now()
	recSeed(t, e.RT.DB(), p, "g1", "RecBlocking", now)
	bodies := []string{`{"type":"start","messageId":"m-g1"}`, `{"type":"start-step"}`,
		`{"type":"text-start","id":"t1"}`, `{"type":"text-delta","id":"t1","delta":"half"}`}
	ctx := recCtx(t)
	child := agent.BaseOf(p).Path().Child("RecBlocking", "g1").String()
	err := e.RT.DB().Update(ctx, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO instances (path, class, name, parent_id, created_at) VALUES (?, 'RecBlocking', 'g1', ?, ?)`,
			child, agent.BaseOf(p).InstanceID(), now.UnixMilli()); err != nil {
			return err
		}
		var cid int64
		if err := tx.QueryRow(ctx, `SELECT id FROM instances WHERE path = ?`, child).Scan(&cid); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO agent_tool_child_runs (instance_id, run_id, request_id, status, started_at) VALUES (?, 'g1', 'st-g1', 'running', ?)`,
			cid, now.UnixMilli()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO chat_streams (instance_id, id, message_id, status, created_at, retain, next_seq) VALUES (?, 'st-g1', 'm-g1', 'streaming', ?, 1, ?)`,
			cid, now.UnixMilli(), len(bodies)); err != nil {
			return err
		}
		for i, b := range bodies {
			if _, err := tx.Exec(ctx, `INSERT INTO chat_chunks (instance_id, stream_id, seq, body) VALUES (?, 'st-g1', ?, ?)`, cid, i, b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p = recRehydrate(t, e, p)
	e.recBudget(t, 1, 2*time.Second) // the child's hydration blocks: the inspection times out
	// Not classified, not ended: its inspection is waited for up to the
	// no-progress budget.
	e.recBudget(t, 1, agenttool.DefaultReattachNoProgressTimeout)
	e.ev.wait(t, "recovery:complete", "")
	recCheckInterrupted(t, getRun(t, p, "g1"), agenttool.ReasonInspectTimeout, msgInspectTimeout, nil)
	check := func(who string, fs []agenttool.Frame) {
		t.Helper()
		var got []string
		for _, f := range fs {
			got = append(got, fmt.Sprintf("%d %s %s", f.Sequence, f.Event.Kind, f.Event.Body))
		}
		want := []string{"0 started "}
		for i, b := range bodies {
			want = append(want, fmt.Sprintf("%d chunk %s", i+1, b))
		}
		want = append(want, fmt.Sprintf("%d interrupted ", len(bodies)+1))
		if !slices.Equal(got, want) {
			t.Fatalf("%s: frames\n%s\nwant\n%s", who, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	check("a connect replay", recDial(t, e, "RecParent", "p").terminal("g1"))
}

// TestRecoveryLeavesARedispatchedRunToItsDispatch: a parent's recovery
// whose inspection of a run times out leaves the run alone when a
// dispatch of the same run id (a client repeating its request) follows it
// meanwhile: the run ends once, completed by that dispatch, and its
// finish hook fires once. (Recorded interrupted by the recovery and then
// completed by the dispatch, it had two ends and two finish hooks: the
// hook that fired twice under a kill of the parent's node.)
func TestRecoveryLeavesARedispatchedRunToItsDispatch(t *testing.T) {
	k := newRecKit()
	defer func() {
		select {
		case <-k.block:
		default:
			close(k.block)
		}
	}()
	e := recStart(t, k, "")
	p := e.parent(t, "RecParent", "p")
	recSeed(t, e.RT.DB(), p, "b1", "RecBlocking", e.clock.Now())
	p = recRehydrate(t, e, p) // its recovery's inspection of b1 hangs
	e.ev.wait(t, "recovery:begin", "")
	// The recovery waits for the inspection (its timeout's timer is
	// armed): it passed the check that skips runs live already.
	if err := e.clock.BlockUntilContext(recCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	out := recDispatch(p, "RecBlocking", "b1", "again")
	e.ev.wait(t, "redispatch", "b1") // live: it waits for the child too
	e.clock.Advance(2 * time.Second) // the inspection times out
	if r := getRun(t, p, "b1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("row after the inspection timed out %+v, want running", r)
	}
	close(k.block)
	stop := pump(k.mclock)
	o := recResult(t, out)
	stop()
	if o.err != nil || o.res.Status != agenttool.StatusCompleted || o.res.Summary != recText {
		t.Fatalf("re-dispatch: %+v %v, want completed", o.res, o.err)
	}
	e.ev.wait(t, "recovery:complete", "")
	fin := k.finishesOf("b1")
	if len(fin) != 1 || fin[0].Result.Status != agenttool.StatusCompleted {
		t.Fatalf("finish hooks %+v, want one, completed", fin)
	}
}

// TestRecoveryEndsARunItCouldNotInspectInTimeOnce is the regression test
// of the gap "a recovery that gives up before a client repeats its
// request": the parent's recovery cannot inspect a run in time (the
// child's hydration hangs past the inspection's 2 s), and only then the
// same run id is dispatched again (a client repeating its request, a
// recovered chat turn repeating its tool call). The recovery does not end
// the run for a slow inspection, so the run has one end, the child's real
// result: one finish hook, completed, and one terminal frame for the
// clients. (It was recorded interrupted by the recovery, its hook told,
// and then repaired by the dispatch and the hook told again.) The child
// runs once.
func TestRecoveryEndsARunItCouldNotInspectInTimeOnce(t *testing.T) {
	k := newRecKit()
	defer func() {
		select {
		case <-k.block:
		default:
			close(k.block)
		}
	}()
	e := recStart(t, k, "")
	p := e.parent(t, "RecParent", "p")
	recSeed(t, e.RT.DB(), p, "b1", "RecBlocking", e.clock.Now())
	p = recRehydrate(t, e, p) // its recovery's inspection of b1 hangs
	w := recDial(t, e, "RecParent", "p")
	e.ev.wait(t, "recovery:begin", "")
	e.recBudget(t, 1, 2*time.Second) // the inspection times out
	// The recovery waits on for the inspection (its budget's timer).
	if err := e.clock.BlockUntilContext(recCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	if r := getRun(t, p, "b1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("row after the inspection timed out %+v, want running", r)
	}
	if fin := k.finishesOf("b1"); len(fin) != 0 {
		t.Fatalf("finish hooks %+v after the inspection timed out, want none", fin)
	}
	out := recDispatch(p, "RecBlocking", "b1", "again")
	e.ev.wait(t, "redispatch", "b1")
	close(k.block)
	stop := pump(k.mclock)
	o := recResult(t, out)
	stop()
	if o.err != nil || o.res.Status != agenttool.StatusCompleted || o.res.Summary != recText {
		t.Fatalf("re-dispatch: %+v %v, want completed", o.res, o.err)
	}
	e.ev.wait(t, "recovery:complete", "")
	fin := k.finishesOf("b1")
	if len(fin) != 1 || fin[0].Result.Status != agenttool.StatusCompleted {
		t.Fatalf("finish hooks %+v, want one, completed", fin)
	}
	if r := getRun(t, p, "b1"); r.Status != agenttool.StatusCompleted || r.Reason != "" {
		t.Fatalf("row %+v, want completed", r)
	}
	fs := w.terminal("b1")
	ends := 0
	for _, f := range fs {
		switch f.Event.Kind {
		case "finished", "error", "aborted", "interrupted":
			ends++
		}
	}
	if last := fs[len(fs)-1]; ends != 1 || last.Event.Kind != "finished" {
		t.Fatalf("frames %+v, want one terminal frame, finished", fs)
	}
	if n := e.ev.count("recovery:row", "b1"); n != 0 {
		t.Fatalf("the recovery recorded %d ends of b1, want none (the dispatch's)", n)
	}
}

// TestRecoveryCollectsARunPastItsDeadline: a run that the classification
// pass reaches only past its 5 s deadline (the inspections before it
// hung) is not ended for that: it is classified after the pass, and a
// child that finished is collected, its real result its one end. (It was
// recorded interrupted, recovery-deadline, and its hook told so, though
// its child had finished.)
func TestRecoveryCollectsARunPastItsDeadline(t *testing.T) {
	k := newRecKit()
	defer close(k.block)
	e := recStart(t, k, "")
	p := e.parent(t, "RecParent", "p")
	now := e.clock.Now()
	for i := range 3 {
		recSeed(t, e.RT.DB(), p, fmt.Sprintf("d%d", i+1), "RecBlocking", now.Add(time.Duration(i)*time.Millisecond))
	}
	recSeed(t, e.RT.DB(), p, "d4", "RecChild", now.Add(3*time.Millisecond))
	ctx := recCtx(t)
	child := agent.BaseOf(p).Path().Child("RecChild", "d4").String()
	err := e.RT.DB().Update(ctx, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO instances (path, class, name, parent_id, created_at) VALUES (?, 'RecChild', 'd4', ?, ?)`,
			child, agent.BaseOf(p).InstanceID(), now.UnixMilli()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO agent_tool_child_runs (instance_id, run_id, status, summary, started_at, completed_at)
			SELECT id, 'd4', 'completed', 'done early', ?, ? FROM instances WHERE path = ?`, now.UnixMilli(), now.UnixMilli(), child)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	p = recRehydrate(t, e, p)
	e.recBudget(t, 1, 2*time.Second) // d1
	e.recBudget(t, 1, 2*time.Second) // d2
	e.recBudget(t, 1, time.Second)   // d3: only 1 s was left
	e.ev.wait(t, "recovery:deadline", "d4")
	if ev := e.ev.wait(t, "recovery:row", "d4"); ev.Attrs["status"] != "completed" {
		t.Fatalf("recovery:row of d4 %v, want completed", ev.Attrs)
	}
	if r := getRun(t, p, "d4"); r.Status != agenttool.StatusCompleted || r.Summary != "done early" {
		t.Fatalf("d4 %+v, want completed", r)
	}
	e.recBudget(t, 3, agenttool.DefaultReattachNoProgressTimeout)
	e.ev.wait(t, "recovery:complete", "")
	if fin := k.finishesOf("d4"); len(fin) != 1 || fin[0].Result.Status != agenttool.StatusCompleted {
		t.Fatalf("finish hooks of d4 %+v, want one, completed", fin)
	}
	for _, id := range []string{"d1", "d2", "d3"} {
		recCheckInterrupted(t, getRun(t, p, id), agenttool.ReasonInspectTimeout, msgInspectTimeout, nil)
	}
}
