package agenttool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
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
	"github.com/agentry/agentry/wire"
)

// Detached runs (spec §5, groups E and F), adapted to our deliberate
// differences 3 and 7. Every test runs on a fake clock: the reconcile
// cadence, the delivery lease and the budgets are reached with
// clock.Advance, never by waiting.

// ---------------------------------------------------------------------------
// Test agents.

// detEpoch is the fake clocks' start, on a whole millisecond (the registry
// stores milliseconds).
var detEpoch = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

const detWait = 30 * time.Second

func detCtx(t *testing.T) context.Context { return testctx.Within(t, detWait) }

// detCall is one call of a parent hook.
type detCall struct {
	Hook   string // "global" (OnAgentToolFinish), "done" (OnDone), "done-failed"
	Run    agenttool.Run
	Result agenttool.Result
}

func (c detCall) String() string {
	s := c.Hook + ":" + string(c.Result.Status)
	if c.Result.Reason != "" {
		s += "/" + string(c.Result.Reason)
	}
	return s
}

// detCmd is a step a worker executes inside its turn; a nil fn ends the
// turn (completed).
type detCmd struct {
	fn   func(ctx context.Context) error
	done chan error
}

// detKit configures the classes of one test runtime.
type detKit struct {
	clock       *clockwork.FakeClock
	parentModel *scripted.Model

	// work is the worker's turn; nil means detCommanded.
	work func(ctx context.Context, w *detWorker, t *chat.Turn) error
	// output, when set, is the worker's AgentToolOutput hook.
	output func(ctx context.Context, runID string) (any, error)
	cmds   chan detCmd

	// onDone decides the result of the nth (1-based) OnDone call.
	onDone func(n int, run agenttool.Run, res agenttool.Result) error
	// formatCompletion and formatMilestone back the DetFmtParent hooks.
	formatCompletion func(agenttool.Run, agenttool.Result) string
	formatMilestone  func(agenttool.Run, agenttool.Milestone) string

	mu       sync.Mutex
	calls    []detCall
	doneN    int
	callCh   chan detCall
	progress chan detProgress
}

type detProgress struct {
	Run agenttool.Run
	Ev  agenttool.ProgressEvent
}

func newDetKit() *detKit {
	return &detKit{
		clock:       clockwork.NewFakeClockAt(detEpoch),
		parentModel: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("Noted.")}))),
		cmds:        make(chan detCmd),
		callCh:      make(chan detCall, 100),
		progress:    make(chan detProgress, 1000),
	}
}

func (k *detKit) record(c detCall) {
	k.mu.Lock()
	k.calls = append(k.calls, c)
	k.mu.Unlock()
	k.callCh <- c
}

// log returns the hook calls of a run, as "hook:status[/reason]".
func (k *detKit) log(runID string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, c := range k.calls {
		if c.Run.RunID == runID {
			out = append(out, c.String())
		}
	}
	return out
}

// waitCall waits for the next hook call matching hook (and returns it).
func (k *detKit) waitCall(t *testing.T, ctx context.Context, hook string) detCall {
	t.Helper()
	for {
		select {
		case c := <-k.callCh:
			if c.Hook == hook {
				return c
			}
		case <-ctx.Done():
			t.Fatalf("timed out waiting for hook %s; calls so far: %v", hook, k.allCalls())
		}
	}
}

func (k *detKit) allCalls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, c := range k.calls {
		out = append(out, c.Run.RunID+"="+c.String())
	}
	return out
}

// do runs fn inside the commanded worker's turn and returns its error.
func (k *detKit) do(t *testing.T, ctx context.Context, fn func(ctx context.Context) error) error {
	t.Helper()
	c := detCmd{fn: fn, done: make(chan error, 1)}
	select {
	case k.cmds <- c:
	case <-ctx.Done():
		t.Fatal("timed out handing a step to the worker")
	}
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		t.Fatal("timed out waiting for the worker's step")
	}
	return nil
}

// finishWorker ends the commanded worker's turn (completed).
func (k *detKit) finishWorker(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case k.cmds <- detCmd{}:
	case <-ctx.Done():
		t.Fatal("timed out ending the worker's turn")
	}
}

// detCommanded is the default worker turn: it writes "detached summary" and
// then runs the test's steps until told to finish or canceled.
func detCommanded(k *detKit) func(ctx context.Context, w *detWorker, t *chat.Turn) error {
	return func(ctx context.Context, w *detWorker, t *chat.Turn) error {
		if err := t.WriteText("detached summary"); err != nil {
			return err
		}
		for {
			select {
			case c := <-k.cmds:
				if c.fn == nil {
					return nil
				}
				c.done <- c.fn(ctx)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// detParent is the parent: a chat agent with the detached hooks.
type detParent struct {
	chat.Base
	k *detKit
}

func (p *detParent) ChatModel() model.Model { return p.k.parentModel }

func (p *detParent) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	p.k.record(detCall{Hook: "global", Run: run, Result: res})
}

// OnDone is the OnFinish method of the tests' detached runs.
func (p *detParent) OnDone(ctx context.Context, run agenttool.Run, res agenttool.Result) error {
	k := p.k
	k.mu.Lock()
	k.doneN++
	n := k.doneN
	k.mu.Unlock()
	var err error
	if k.onDone != nil {
		// The kit's callback may block (scenarios 49 and 50): that is an
		// await point, where the parent takes its other inputs (a
		// reconcile tick).
		err = agent.Await(ctx, func() error { return k.onDone(n, run, res) })
	}
	if err != nil {
		k.record(detCall{Hook: "done-failed", Run: run, Result: res})
		return err
	}
	k.record(detCall{Hook: "done", Run: run, Result: res})
	return nil
}

// WrongSignature is not usable as OnFinish.
func (p *detParent) WrongSignature(ctx context.Context, runID string) error { return nil }

func (p *detParent) OnProgress(ctx context.Context, run agenttool.Run, ev agenttool.ProgressEvent) {
	select {
	case p.k.progress <- detProgress{run, ev}:
	default:
	}
}

// detFmtParent is detParent with the notification formatters.
type detFmtParent struct{ detParent }

func (p *detFmtParent) FormatDetachedCompletion(run agenttool.Run, res agenttool.Result) string {
	return p.k.formatCompletion(run, res)
}

func (p *detFmtParent) FormatDetachedMilestone(run agenttool.Run, m agenttool.Milestone) string {
	return p.k.formatMilestone(run, m)
}

// detWorker is the child.
type detWorker struct {
	chat.Base
	k *detKit
}

func (w *detWorker) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	if w.k.work != nil {
		return w.k.work(ctx, w, t)
	}
	return detCommanded(w.k)(ctx, w, t)
}

// detOutputWorker is a child with an output hook.
type detOutputWorker struct{ detWorker }

func (w *detOutputWorker) AgentToolOutput(ctx context.Context, runID string) (any, error) {
	return w.k.output(ctx, runID)
}

func detStart(t *testing.T, k *detKit, dir string) *testenv.Env {
	t.Helper()
	return startEnv(t, testenv.Options{
		Postgres: &pg,
		Dir:      dir,
		Clock:    k.clock,
		Classes: []agent.Class{
			{Name: "DetParent", New: func() agent.Agent { return &detParent{k: k} }, Public: true},
			{Name: "DetFmtParent", New: func() agent.Agent { return &detFmtParent{detParent{k: k}} }, Public: true},
			{Name: "DetWorker", New: func() agent.Agent { return &detWorker{k: k} }},
			{Name: "DetOutputWorker", New: func() agent.Agent { return &detOutputWorker{detWorker{k: k}} }},
		},
	}, chat.Config{}, agenttool.Options{}, nil)
}

func detGet[T agent.Agent](t *testing.T, env *testenv.Env, path agent.Path) T {
	t.Helper()
	a, err := env.RT.Get(detCtx(t), path)
	if err != nil {
		t.Fatal(err)
	}
	return a.(T)
}

func detParentOf(t *testing.T, env *testenv.Env, name string) *detParent {
	return detGet[*detParent](t, env, agent.Root("DetParent", name))
}

// detDispatch starts a detached run and checks the handle.
func detDispatch(t *testing.T, ctx context.Context, parent agent.Agent, class, runID string, o agenttool.DetachedOptions) {
	t.Helper()
	res, err := agenttool.RunAgentTool(ctx, parent, class, agenttool.RunOptions{Input: "work on " + runID, RunID: runID, Detached: &o})
	if err != nil {
		t.Fatalf("dispatch %s: %v", runID, err)
	}
	want := agenttool.Result{RunID: runID, AgentType: class, Status: agenttool.StatusRunning}
	if res.RunID != want.RunID || res.AgentType != want.AgentType || res.Status != want.Status || res.Error != "" || res.Summary != "" {
		t.Fatalf("handle = %+v, want %+v", res, want)
	}
}

func detInspect(t *testing.T, parent agent.Agent, runID string) *agenttool.Inspection {
	t.Helper()
	in, err := agenttool.InspectAgentToolRun(detCtx(t), parent, runID)
	if err != nil || in == nil {
		t.Fatalf("inspect %s: %v, %v", runID, in, err)
	}
	return in
}

// ---------------------------------------------------------------------------
// Observability and the reconcile schedule.

// detDiag records events of the schedule and agentTool channels.
type detDiag struct{ events }

func detWatch(t *testing.T, env *testenv.Env) *detDiag {
	d := &detDiag{events{changed: make(chan struct{})}}
	fn := func(e diag.Event) {
		if e.Channel == diag.ChannelSchedule && e.Type == "fire" {
			detFired.Store(fmt.Sprint(e.Attrs["id"]), true)
		}
		d.add(e)
	}
	u1 := env.RT.Diag().Subscribe(diag.ChannelSchedule, fn)
	u2 := env.RT.Diag().Subscribe(diag.ChannelAgentTool, fn)
	t.Cleanup(func() { u1(); u2() })
	return d
}

func (d *detDiag) count(channel, typ string, match func(diag.Event) bool) int {
	return d.countWhere(detMatch(channel, typ, match))
}

// wait waits until an event matches.
func (d *detDiag) wait(t *testing.T, ctx context.Context, what, channel, typ string, match func(diag.Event) bool) {
	t.Helper()
	d.waitWhere(t, ctx, func() string { return what }, detMatch(channel, typ, match))
}

func detMatch(channel, typ string, match func(diag.Event) bool) func(diag.Event) bool {
	return func(e diag.Event) bool {
		return e.Channel == channel && e.Type == typ && (match == nil || match(e))
	}
}

func detAttr(key, val string) func(diag.Event) bool {
	return func(e diag.Event) bool { return fmt.Sprint(e.Attrs[key]) == val }
}

// detDelivered waits until the delivery slot kind ("finish", "give_up") of
// run is recorded delivered.
func detDelivered(t *testing.T, ctx context.Context, d *detDiag, runID, kind string) {
	t.Helper()
	d.wait(t, ctx, kind+" delivery of "+runID, diag.ChannelAgentTool, "detached:delivered", func(e diag.Event) bool {
		return fmt.Sprint(e.Attrs["runId"]) == runID && fmt.Sprint(e.Attrs["kind"]) == kind
	})
}

const detReconcile = "@agenttool/reconcile"

// detFired holds the ids of one-shot schedules that fired: the scheduler
// publishes "fire" before it deletes the row, so a fired schedule may still
// be listed for a moment; it never fires again.
var detFired sync.Map

// detReconciles returns the parent's pending reconcile schedules.
func detReconciles(t *testing.T, parent agent.Agent) []agent.Schedule {
	t.Helper()
	all, err := agent.BaseOf(parent).Schedules(detCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []agent.Schedule
	for _, s := range all {
		if _, fired := detFired.Load(s.ID); s.Method == detReconcile && !fired {
			out = append(out, s)
		}
	}
	return out
}

func detCadenceIndex(s agent.Schedule) int {
	var p struct {
		CadenceIndex int `json:"cadenceIndex"`
	}
	_ = json.Unmarshal(s.Payload, &p)
	return p.CadenceIndex
}

// detOneReconcile returns the parent's only reconcile schedule and checks
// it is due delay from now with cadence index idx.
func detOneReconcile(t *testing.T, k *detKit, parent agent.Agent, delay time.Duration, idx int) agent.Schedule {
	t.Helper()
	rs := detReconciles(t, parent)
	if len(rs) != 1 {
		t.Fatalf("%d reconcile schedules, want exactly one: %+v", len(rs), rs)
	}
	s := rs[0]
	if got := s.DueAt.Sub(k.clock.Now()); got != delay || detCadenceIndex(s) != idx {
		t.Fatalf("reconcile due in %v with cadence index %d, want %v and %d", got, detCadenceIndex(s), delay, idx)
	}
	return s
}

// detTick moves the clock to the reconcile schedule s and waits until it
// has fired.
func detTick(t *testing.T, ctx context.Context, k *detKit, d *detDiag, s agent.Schedule) {
	t.Helper()
	if wait := s.DueAt.Sub(k.clock.Now()); wait > 0 {
		k.clock.Advance(wait)
	}
	d.wait(t, ctx, "reconcile tick "+s.ID, diag.ChannelSchedule, "fire", detAttr("id", s.ID))
}

// detTickNext fires the parent's only reconcile schedule.
func detTickNext(t *testing.T, ctx context.Context, k *detKit, d *detDiag, parent agent.Agent) {
	t.Helper()
	rs := detReconciles(t, parent)
	if len(rs) != 1 {
		t.Fatalf("%d reconcile schedules, want exactly one: %+v", len(rs), rs)
	}
	detTick(t, ctx, k, d, rs[0])
}

// ---------------------------------------------------------------------------
// A WebSocket client recording every frame.

// detWS is a WebSocket connection (testenv.WSClient) whose tests read
// its agent-tool-event frames and transcripts.
type detWS struct {
	t  *testing.T
	ws *testenv.WSClient[agenttool.Frame]
}

func detDial(t *testing.T, env *testenv.Env, path string) *detWS {
	t.Helper()
	w := &detWS{t: t, ws: testenv.DialWS[agenttool.Frame](t, detWait, env.URL("/agents/"+path))}
	t.Cleanup(w.close)
	return w
}

func (w *detWS) close() { w.ws.CloseNormally() }

// frames returns the agent-tool frames received so far.
func (w *detWS) frames() []agenttool.Frame { return toolFrames(w.ws.Frames()) }

// waitFrames waits until pred holds for the agent-tool frames.
func (w *detWS) waitFrames(ctx context.Context, what string, pred func([]agenttool.Frame) bool) []agenttool.Frame {
	w.t.Helper()
	all, err := w.ws.Wait(ctx, func(all []testenv.Frame[agenttool.Frame]) bool { return pred(toolFrames(all)) })
	fs := toolFrames(all)
	if err != nil {
		var b strings.Builder
		for _, f := range fs {
			data, _ := json.Marshal(f)
			b.Write(data)
			b.WriteByte('\n')
		}
		w.t.Fatalf("timed out waiting for %s; frames:\n%s", what, b.String())
	}
	return fs
}

// waitTranscript waits until a transcript frame (cf_agent_chat_messages)
// satisfies pred and returns that transcript.
func (w *detWS) waitTranscript(ctx context.Context, what string, pred func([]message.Message) bool) []message.Message {
	w.t.Helper()
	seen := 0
	var got []message.Message
	_, err := w.ws.Wait(ctx, func(all []testenv.Frame[agenttool.Frame]) bool {
		for _, fr := range all[seen:] {
			var f struct {
				Type     string            `json:"type"`
				Messages []message.Message `json:"messages"`
			}
			if json.Unmarshal(fr.Raw, &f) == nil && f.Type == wire.ChatMessages && pred(f.Messages) {
				got = f.Messages
				return true
			}
		}
		seen = len(all)
		return false
	})
	if err != nil {
		w.t.Fatalf("timed out waiting for %s", what)
	}
	return got
}

func detTerminals(fs []agenttool.Frame, runID string) []agenttool.Frame {
	var out []agenttool.Frame
	for _, f := range fs {
		if f.Event.RunID != runID {
			continue
		}
		switch f.Event.Kind {
		case "finished", "error", "aborted", "interrupted":
			out = append(out, f)
		}
	}
	return out
}

func detHasTerminal(runID string) func([]agenttool.Frame) bool {
	return func(fs []agenttool.Frame) bool { return len(detTerminals(fs, runID)) > 0 }
}

func detEq(t *testing.T, what string, got, want any) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Fatalf("%s = %s, want %s", what, g, w)
	}
}

// detMessages returns the messages of a transcript whose id has prefix.
func detMessages(msgs []message.Message, prefix string) []message.Message {
	var out []message.Message
	for _, m := range msgs {
		if strings.HasPrefix(m.ID, prefix) {
			out = append(out, m)
		}
	}
	return out
}

func detHasID(id string) func([]message.Message) bool {
	return func(msgs []message.Message) bool { return len(detMessages(msgs, id)) > 0 }
}

// detHasReplyAfter reports whether an assistant message follows the message
// with id.
func detHasReplyAfter(id string) func([]message.Message) bool {
	return func(msgs []message.Message) bool {
		for i, m := range msgs {
			if m.ID == id {
				return i+1 < len(msgs) && msgs[i+1].Role == message.RoleAssistant && chat.MessageText(msgs[i+1]) != ""
			}
		}
		return false
	}
}

// ---------------------------------------------------------------------------
// Dispatch.

// TestDetachedDispatch: the handle {runId, agentType, running} comes back
// while the child still works; the run does not inherit the dispatching
// context's cancellation; on completion the funnel delivers exactly once
// (global hook, then OnFinish); the next reconcile tick finds nothing
// outstanding and schedules nothing more; a re-dispatch of the finished run
// returns its stored result without delivering again (difference 6).
func TestDetachedDispatch(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "p1")
	ws := detDial(t, env, "det-parent/p1")

	dctx, cancel := context.WithCancel(ctx)
	detDispatch(t, dctx, p, "DetWorker", "d1", agenttool.DetachedOptions{OnFinish: "OnDone"})
	cancel() // the turn that dispatched it ends
	if err := k.do(t, ctx, func(ctx context.Context) error { return ctx.Err() }); err != nil {
		t.Fatalf("the child's turn saw the dispatch context's cancellation: %v", err)
	}
	if r := getRun(t, p, "d1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("row = %s, want running", r.Status)
	}
	detOneReconcile(t, k, p, 5*time.Second, 0)
	if d.count(diag.ChannelAgentTool, "start", detAttr("runId", "d1")) != 1 {
		t.Fatal("no agentTool start event")
	}

	k.finishWorker(t, ctx)
	done := k.waitCall(t, ctx, "done")
	if done.Result.Status != agenttool.StatusCompleted || done.Result.Summary != "detached summary" || done.Run.Status != agenttool.StatusCompleted {
		t.Fatalf("OnDone got %+v / %+v", done.Run, done.Result)
	}
	detEq(t, "hooks", k.log("d1"), []string{"global:completed", "done:completed"})
	d.wait(t, ctx, "finish event", diag.ChannelAgentTool, "finish", detAttr("runId", "d1"))
	fs := ws.waitFrames(ctx, "d1 finished", detHasTerminal("d1"))
	if tf := detTerminals(fs, "d1"); len(tf) != 1 || tf[0].Event.Kind != "finished" || *tf[0].Event.Summary != "detached summary" {
		t.Fatalf("terminal frames = %+v", tf)
	}

	// The tick finds nothing outstanding: the backbone goes quiet. (The
	// delivered mark commits after OnDone returned: wait for it, or the
	// tick may still see the delivery outstanding.)
	d.wait(t, ctx, "delivered mark", diag.ChannelAgentTool, "detached:delivered", detAttr("runId", "d1"))
	detTickNext(t, ctx, k, d, p)
	if rs := detReconciles(t, p); len(rs) != 0 {
		t.Fatalf("reconcile still scheduled after everything was delivered: %+v", rs)
	}
	res, err := agenttool.RunAgentTool(ctx, p, "DetWorker", agenttool.RunOptions{RunID: "d1", Detached: &agenttool.DetachedOptions{OnFinish: "OnDone"}})
	if err != nil || res.Status != agenttool.StatusCompleted || res.Summary != "detached summary" {
		t.Fatalf("re-dispatch = %+v, %v; want the stored result", res, err)
	}
	detEq(t, "hooks after the tick and a re-dispatch", k.log("d1"), []string{"global:completed", "done:completed"})
	if n := d.count(diag.ChannelAgentTool, "detached:delivery_failed", nil); n != 0 {
		t.Fatalf("%d delivery failures", n)
	}
}

// TestDetachedConcurrentArms covers scenario 61: several detached dispatches
// at once leave exactly one reconcile schedule, at the first cadence step.
func TestDetachedConcurrentArms(t *testing.T) {
	k := newDetKit()
	k.work = func(ctx context.Context, w *detWorker, t *chat.Turn) error { return t.WriteText("ok") }
	env := detStart(t, k, "")
	ctx := detCtx(t)
	p := detParentOf(t, env, "p61")
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 5 {
		wg.Go(func() {
			_, err := agenttool.RunAgentTool(ctx, p, "DetWorker", agenttool.RunOptions{RunID: fmt.Sprint("a", i), Detached: &agenttool.DetachedOptions{}})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	detOneReconcile(t, k, p, 5*time.Second, 0)
}

// TestDetachedOnFinishChecked: OnFinish is resolved by method name at
// dispatch; an unknown name or a method of the wrong shape is refused and
// nothing is recorded (no row, no child, no schedule, no events).
func TestDetachedOnFinishChecked(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "p2")
	for _, name := range []string{"NoSuchMethod", "WrongSignature", "onDone"} {
		_, err := agenttool.RunAgentTool(ctx, p, "DetWorker", agenttool.RunOptions{RunID: "bad-" + name, Detached: &agenttool.DetachedOptions{OnFinish: name}})
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("OnFinish %q: err = %v, want a refusal naming it", name, err)
		}
		if ok, err := env.RT.Exists(ctx, agent.Root("DetParent", "p2").Child("DetWorker", "bad-"+name)); err != nil || ok {
			t.Fatalf("a refused dispatch created its child (exists=%v, %v)", ok, err)
		}
	}
	runs, err := agenttool.ListAgentToolRuns(ctx, p)
	if err != nil || len(runs) != 0 {
		t.Fatalf("registry after refused dispatches: %+v, %v", runs, err)
	}
	if rs := detReconciles(t, p); len(rs) != 0 {
		t.Fatalf("a refused dispatch armed the reconcile: %+v", rs)
	}
	if n := d.count(diag.ChannelAgentTool, "start", nil); n != 0 {
		t.Fatalf("%d start events for refused dispatches", n)
	}
}

// ---------------------------------------------------------------------------
// The delivery funnel.

// TestDetachedConcurrentDelivery covers scenarios 49 and 50: while the fast
// path's delivery is inside OnFinish, a reconcile tick tries to deliver the
// same finished run; the claim makes it a no-op, so each hook fires once.
func TestDetachedConcurrentDelivery(t *testing.T) {
	k := newDetKit()
	entered, release := make(chan struct{}), make(chan struct{})
	k.onDone = func(n int, run agenttool.Run, res agenttool.Result) error {
		if n == 1 {
			close(entered)
			<-release
		}
		return nil
	}
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "p50")
	detDispatch(t, ctx, p, "DetWorker", "c1", agenttool.DetachedOptions{OnFinish: "OnDone"})
	k.finishWorker(t, ctx)
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("OnDone never called")
	}
	// The row is completed, its delivery not marked: the tick sees it
	// outstanding and tries to deliver it too.
	if r := getRun(t, p, "c1"); r.Status != agenttool.StatusCompleted {
		t.Fatalf("row = %s", r.Status)
	}
	detTickNext(t, ctx, k, d, p)
	close(release)
	k.waitCall(t, ctx, "done")
	// OnDone has returned once the delivery is recorded; a tick before
	// that still sees the run outstanding and arms the next one.
	detDelivered(t, ctx, d, "c1", "finish")
	// The next tick delivers nothing and the backbone goes quiet.
	detOneReconcile(t, k, p, 15*time.Second, 1)
	detTickNext(t, ctx, k, d, p)
	if rs := detReconciles(t, p); len(rs) != 0 {
		t.Fatalf("reconcile still scheduled: %+v", rs)
	}
	detEq(t, "hooks", k.log("c1"), []string{"global:completed", "done:completed"})
}

// TestDetachedRetryAfterLease covers scenarios 55 and 56 and the cadence: a
// failing OnFinish is reported (detached:delivery_failed) and left to the
// reconcile; ticks inside the 60 s lease deliver nothing; the ticks come
// 5 s, 15 s, 30 s, then 2 min apart; the first tick after the lease
// delivers both hooks again; then the backbone goes quiet.
func TestDetachedRetryAfterLease(t *testing.T) {
	k := newDetKit()
	k.onDone = func(n int, run agenttool.Run, res agenttool.Result) error {
		if n == 1 {
			return errors.New("callback exploded")
		}
		return nil
	}
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "p55")
	detDispatch(t, ctx, p, "DetWorker", "r1", agenttool.DetachedOptions{OnFinish: "OnDone"})
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done-failed")
	d.wait(t, ctx, "delivery_failed", diag.ChannelAgentTool, "detached:delivery_failed", detAttr("runId", "r1"))
	detEq(t, "hooks after the failure", k.log("r1"), []string{"global:completed", "done-failed:completed"})
	failedAt := k.clock.Now()

	// 5 s, 15 s, 30 s: inside the lease, nothing is delivered.
	for i, delay := range []time.Duration{5 * time.Second, 15 * time.Second, 30 * time.Second} {
		s := detOneReconcile(t, k, p, delay, i)
		detTick(t, ctx, k, d, s)
		detEq(t, fmt.Sprintf("hooks after tick %d", i), k.log("r1"), []string{"global:completed", "done-failed:completed"})
	}
	if k.clock.Since(failedAt) >= time.Minute {
		t.Fatal("test arithmetic: the lease expired already")
	}
	// The 2 min tick comes after the lease: both hooks run again.
	s := detOneReconcile(t, k, p, 2*time.Minute, 3)
	detTick(t, ctx, k, d, s)
	detEq(t, "hooks after the lease", k.log("r1"), []string{"global:completed", "done-failed:completed", "global:completed", "done:completed"})
	if rs := detReconciles(t, p); len(rs) != 0 {
		t.Fatalf("reconcile still scheduled after delivery: %+v", rs)
	}
}

// TestReconcileCadenceWhileRunning: with a child that keeps working, the
// reconcile ticks 5 s, 15 s, 30 s, 2 min, 2 min … apart; when the run ends
// (delivered by the fast path) the next tick schedules nothing.
func TestReconcileCadenceWhileRunning(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "pc")
	detDispatch(t, ctx, p, "DetWorker", "w1", agenttool.DetachedOptions{OnFinish: "OnDone"})
	for i, delay := range []time.Duration{5 * time.Second, 15 * time.Second, 30 * time.Second, 2 * time.Minute, 2 * time.Minute} {
		s := detOneReconcile(t, k, p, delay, min(i, 3))
		detTick(t, ctx, k, d, s)
	}
	if r := getRun(t, p, "w1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("row = %s, want running", r.Status)
	}
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")
	detDelivered(t, ctx, d, "w1", "finish") // recorded after OnDone returned
	detTickNext(t, ctx, k, d, p)
	if rs := detReconciles(t, p); len(rs) != 0 {
		t.Fatalf("reconcile still scheduled: %+v", rs)
	}
	detEq(t, "hooks", k.log("w1"), []string{"global:completed", "done:completed"})
}

// TestReconcileAfterEviction: a run whose delivery failed keeps the
// reconcile going after the parent is evicted; the tick rehydrates the
// parent and leaves exactly one schedule; a parent that starts with an
// outstanding run and no schedule re-arms it (5 s); the run is delivered
// once the callback works.
func TestReconcileAfterEviction(t *testing.T) {
	k := newDetKit()
	var mu sync.Mutex
	failing := true
	k.onDone = func(n int, run agenttool.Run, res agenttool.Result) error {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return errors.New("not yet")
		}
		return nil
	}
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	path := agent.Root("DetParent", "pe")
	p := detParentOf(t, env, "pe")
	detDispatch(t, ctx, p, "DetWorker", "e1", agenttool.DetachedOptions{OnFinish: "OnDone"})
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done-failed")

	d.wait(t, ctx, "the fast path's finish", diag.ChannelAgentTool, "finish", detAttr("runId", "e1"))
	s := detOneReconcile(t, k, p, 5*time.Second, 0)
	detEvict(t, ctx, env, path)
	detTick(t, ctx, k, d, s) // rehydrates the parent
	p = detParentOf(t, env, "pe")
	detOneReconcile(t, k, p, 15*time.Second, 1)

	// Lose the schedule, evict, start again: the start re-arms it.
	for _, s := range detReconciles(t, p) {
		if _, err := p.CancelSchedule(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
	}
	detEvict(t, ctx, env, path)
	p = detParentOf(t, env, "pe")
	detOneReconcile(t, k, p, 5*time.Second, 0)

	mu.Lock()
	failing = false
	mu.Unlock()
	for range 10 {
		if len(detReconciles(t, p)) == 0 {
			break
		}
		detTickNext(t, ctx, k, d, p)
	}
	if rs := detReconciles(t, p); len(rs) != 0 {
		t.Fatalf("reconcile still scheduled: %+v", rs)
	}
	log := k.log("e1")
	if log[len(log)-1] != "done:completed" || strings.Count(strings.Join(log, ","), "done:completed") != 1 {
		t.Fatalf("hooks = %v, want one successful OnDone at the end", log)
	}
}

// detEvict evicts the instance at path. The goroutine that followed the
// run releases its hold on the parent right after the delivery, with no
// event to wait for, so this yields until the parent is idle.
func detEvict(t *testing.T, ctx context.Context, env *testenv.Env, path agent.Path) {
	t.Helper()
	for !env.RT.Evict(path) {
		if ctx.Err() != nil {
			t.Fatal("the parent could not be evicted")
		}
		runtime.Gosched()
	}
}

// TestReconcileAfterRestart: a runtime restart on the same database, with a
// detached run in flight: the child resumes its turn, the parent (started
// again) has exactly one reconcile schedule and follows the run, and the
// end is delivered once.
func TestReconcileAfterRestart(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	ctx := detCtx(t)
	p := detParentOf(t, env, "pr")
	detDispatch(t, ctx, p, "DetWorker", "s1", agenttool.DetachedOptions{OnFinish: "OnDone"})
	if err := k.do(t, ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	env.Close()

	k.clock = clockwork.NewFakeClockAt(k.clock.Now().Add(time.Second))
	env2 := detStart(t, k, env.Dir)
	d := detWatch(t, env2)
	p = detParentOf(t, env2, "pr")
	// The schedule survived the restart (it was due in 5 s) and the start
	// did not add a second one.
	if rs := detReconciles(t, p); len(rs) != 1 {
		t.Fatalf("%d reconcile schedules after the restart, want 1: %+v", len(rs), rs)
	}
	// The child's turn resumed: it takes steps again.
	if err := k.do(t, ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	k.finishWorker(t, ctx)
	done := k.waitCall(t, ctx, "done")
	if done.Result.Status != agenttool.StatusCompleted {
		t.Fatalf("OnDone got %+v", done.Result)
	}
	detDelivered(t, ctx, d, "s1", "finish") // recorded after OnDone returned
	for range 5 {
		if len(detReconciles(t, p)) == 0 {
			break
		}
		detTickNext(t, ctx, k, d, p)
	}
	if rs := detReconciles(t, p); len(rs) != 0 {
		t.Fatalf("reconcile still scheduled: %+v", rs)
	}
	detEq(t, "hooks", k.log("s1"), []string{"global:completed", "done:completed"})
	if r := getRun(t, p, "s1"); r.Status != agenttool.StatusCompleted {
		t.Fatalf("row = %s", r.Status)
	}
}

// ---------------------------------------------------------------------------
// Budgets.

// TestDetachedMaxBudget (difference 7): past its absolute budget a run is
// given up at the next tick: interrupted (budget-exceeded), the child torn
// down (its turn aborted), the give-up delivered once, and the child's
// aborted end is not delivered a second time.
func TestDetachedMaxBudget(t *testing.T) {
	k := newDetKit()
	aborted := make(chan error, 1)
	running := make(chan struct{}, 1)
	k.work = func(ctx context.Context, w *detWorker, t *chat.Turn) error {
		running <- struct{}{}
		<-ctx.Done()
		aborted <- context.Cause(ctx)
		return ctx.Err()
	}
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "pb")
	ws := detDial(t, env, "det-parent/pb")
	detDispatch(t, ctx, p, "DetWorker", "b1", agenttool.DetachedOptions{OnFinish: "OnDone", MaxBudget: 30 * time.Second})
	// The child's turn runs (a give-up before it started would cancel it
	// while queued, and its handler would never see the abort).
	select {
	case <-running:
	case <-ctx.Done():
		t.Fatal("the child's turn never started")
	}

	detTickNext(t, ctx, k, d, p) // 5 s
	detTickNext(t, ctx, k, d, p) // 20 s
	if r := getRun(t, p, "b1"); r.Status != agenttool.StatusRunning || len(k.log("b1")) != 0 {
		t.Fatalf("within the budget: row %s, hooks %v", r.Status, k.log("b1"))
	}
	detTickNext(t, ctx, k, d, p) // 50 s: over
	call := k.waitCall(t, ctx, "done")
	if call.Result.Status != agenttool.StatusInterrupted || call.Result.Reason != agenttool.ReasonBudgetExceeded ||
		call.Result.ChildStillRunning == nil || *call.Result.ChildStillRunning {
		t.Fatalf("give-up delivered %+v", call.Result)
	}
	select {
	case <-aborted:
	case <-ctx.Done():
		t.Fatal("the child's turn was not aborted")
	}
	// The child's aborted end is recorded as delivered (the give-up was its
	// delivery) after the teardown; until then every tick re-arms.
	detDelivered(t, ctx, d, "b1", "finish")
	// Ticks until the backbone is quiet: no second (aborted) delivery.
	for range 5 {
		if len(detReconciles(t, p)) == 0 {
			break
		}
		detTickNext(t, ctx, k, d, p)
	}
	if rs := detReconciles(t, p); len(rs) != 0 {
		t.Fatalf("reconcile still scheduled: %+v", rs)
	}
	detEq(t, "hooks", k.log("b1"), []string{"global:interrupted/budget-exceeded", "done:interrupted/budget-exceeded"})
	r := getRun(t, p, "b1")
	if r.Status != agenttool.StatusInterrupted || r.Reason != agenttool.ReasonBudgetExceeded {
		t.Fatalf("row = %+v", r)
	}
	if in := detInspect(t, p, "b1"); in.Status != agenttool.StatusAborted {
		t.Fatalf("child = %s, want aborted", in.Status)
	}
	fs := ws.waitFrames(ctx, "terminal", detHasTerminal("b1"))
	if tf := detTerminals(fs, "b1"); len(tf) != 1 || tf[0].Event.Kind != "interrupted" || tf[0].Event.Reason != "budget-exceeded" {
		t.Fatalf("terminal frames = %+v", tf)
	}
}

// TestDetachedCompletesBeforeTeardown (scenario 51, the #1752 repair): the
// child's turn completed but its end is not recorded yet when the budget
// tick gives the run up; the give-up is delivered (interrupted), the
// child's real completion then repairs the row and OnFinish fires again
// with completed.
func TestDetachedCompletesBeforeTeardown(t *testing.T) {
	k := newDetKit()
	inOutput, releaseOutput := make(chan struct{}), make(chan struct{})
	k.work = func(ctx context.Context, w *detWorker, t *chat.Turn) error { return t.WriteText("late but done") }
	k.output = func(ctx context.Context, runID string) (any, error) {
		close(inOutput)
		<-releaseOutput
		return nil, nil
	}
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "pt")
	detDispatch(t, ctx, p, "DetOutputWorker", "t1", agenttool.DetachedOptions{OnFinish: "OnDone", MaxBudget: time.Second})
	select {
	case <-inOutput: // the turn is over; its end is being recorded
	case <-ctx.Done():
		t.Fatal("the output hook was never called")
	}
	detTickNext(t, ctx, k, d, p) // 5 s: past the budget
	k.waitCall(t, ctx, "done")
	close(releaseOutput)
	second := k.waitCall(t, ctx, "done")
	if second.Result.Status != agenttool.StatusCompleted || second.Result.Summary != "late but done" {
		t.Fatalf("second delivery = %+v", second.Result)
	}
	detEq(t, "OnDone calls", k.log("t1"), []string{"global:interrupted/budget-exceeded", "done:interrupted/budget-exceeded", "global:completed", "done:completed"})
	if r := getRun(t, p, "t1"); r.Status != agenttool.StatusCompleted || r.Reason != "" || r.ChildStillRunning != nil {
		t.Fatalf("row = %+v, want completed without interrupted fields", r)
	}
}

// TestDetachedNoProgressBudget covers scenarios 53 and 54: the no-progress
// budget counts only after the first signal and every signal resets it.
func TestDetachedNoProgressBudget(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "pn")

	// Never signalling: not given up (ticks at 5, 20, 50, 170 s).
	detDispatch(t, ctx, p, "DetWorker", "n1", agenttool.DetachedOptions{OnFinish: "OnDone", NoProgressBudget: 40 * time.Second})
	for range 4 {
		detTickNext(t, ctx, k, d, p)
	}
	if r := getRun(t, p, "n1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("a silent child was given up before its first signal: %s", r.Status)
	}
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")

	// Signalling: a signal at 0 s and one at 20 s keep the run alive at
	// the 50 s tick (30 s of silence < 40 s); at 170 s it is given up.
	detDispatch(t, ctx, p, "DetWorker", "n2", agenttool.DetachedOptions{OnFinish: "OnDone", NoProgressBudget: 40 * time.Second})
	report := func(msg string) {
		if err := k.do(t, ctx, func(ctx context.Context) error {
			return agenttool.ReportProgress(ctx, agenttool.Progress{Fraction: agenttool.Fraction(0.5), Message: msg})
		}); err != nil {
			t.Fatal(err)
		}
	}
	report("first")
	detTickNext(t, ctx, k, d, p) // 5 s
	detTickNext(t, ctx, k, d, p) // 20 s
	if err := k.do(t, ctx, func(ctx context.Context) error {
		return agenttool.ReportProgress(ctx, agenttool.Progress{Milestone: "halfway"})
	}); err != nil {
		t.Fatal(err)
	}
	detTickNext(t, ctx, k, d, p) // 50 s
	if r := getRun(t, p, "n2"); r.Status != agenttool.StatusRunning {
		t.Fatalf("a signal did not reset the no-progress budget: %s", r.Status)
	}
	detTickNext(t, ctx, k, d, p) // 170 s
	call := k.waitCall(t, ctx, "done")
	if call.Run.RunID != "n2" || call.Result.Status != agenttool.StatusInterrupted || call.Result.Reason != agenttool.ReasonNoProgress {
		t.Fatalf("give-up = %+v", call)
	}
	detEq(t, "n2 hooks", k.log("n2"), []string{"global:interrupted/no-progress", "done:interrupted/no-progress"})
}

// TestDetachedNoProgressDefaults: zero means the default one hour; a
// negative budget disables it (the absolute budget still applies).
func TestDetachedNoProgressDefaults(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       agenttool.DetachedOptions
		reason     agenttool.Reason
		notBefore  time.Duration
		notAfter   time.Duration
		stillAlive time.Duration
	}{
		{"default", agenttool.DetachedOptions{OnFinish: "OnDone"}, agenttool.ReasonNoProgress, time.Hour, time.Hour + 2*time.Minute, 59 * time.Minute},
		{"disabled", agenttool.DetachedOptions{OnFinish: "OnDone", NoProgressBudget: -1, MaxBudget: 2 * time.Hour}, agenttool.ReasonBudgetExceeded, 2 * time.Hour, 2*time.Hour + 2*time.Minute, 119 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newDetKit()
			env := detStart(t, k, "")
			d := detWatch(t, env)
			ctx := detCtx(t)
			p := detParentOf(t, env, "pd")
			start := k.clock.Now()
			detDispatch(t, ctx, p, "DetWorker", "x", tc.opts)
			if err := k.do(t, ctx, func(ctx context.Context) error {
				return agenttool.ReportProgress(ctx, agenttool.Progress{Message: "started"})
			}); err != nil {
				t.Fatal(err)
			}
			for len(k.log("x")) == 0 {
				if k.clock.Since(start) > tc.notAfter {
					t.Fatalf("not given up %v after the last signal", k.clock.Since(start))
				}
				detTickNext(t, ctx, k, d, p)
				if k.clock.Since(start) <= tc.stillAlive && len(k.log("x")) != 0 {
					t.Fatalf("given up after %v: %v", k.clock.Since(start), k.log("x"))
				}
			}
			call := k.waitCall(t, ctx, "done")
			if call.Result.Reason != tc.reason || k.clock.Since(start) < tc.notBefore {
				t.Fatalf("given up after %v with %+v", k.clock.Since(start), call.Result)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Cancel.

// TestCancelDetachedIdempotent covers scenario 59: concurrent and repeated
// cancels of a detached run abort it once: one aborted terminal frame,
// OnFinish once with aborted, the child's turn aborted; a late cancel is a
// no-op.
func TestCancelDetachedIdempotent(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "pk")
	ws := detDial(t, env, "det-parent/pk")
	detDispatch(t, ctx, p, "DetWorker", "k1", agenttool.DetachedOptions{OnFinish: "OnDone"})
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if err := agenttool.CancelAgentTool(ctx, p, "k1", "user changed their mind"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	call := k.waitCall(t, ctx, "done")
	if call.Result.Status != agenttool.StatusAborted || call.Result.Error != "user changed their mind" {
		t.Fatalf("OnDone got %+v", call.Result)
	}
	if err := agenttool.CancelAgentTool(ctx, p, "k1", "again"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if len(detReconciles(t, p)) == 0 {
			break
		}
		detTickNext(t, ctx, k, d, p)
	}
	detEq(t, "hooks", k.log("k1"), []string{"global:aborted", "done:aborted"})
	ws.waitFrames(ctx, "aborted frame", detHasTerminal("k1"))
	if tf := detTerminals(ws.frames(), "k1"); len(tf) != 1 || tf[0].Event.Kind != "aborted" || tf[0].Event.Reason != "user changed their mind" {
		t.Fatalf("terminal frames = %+v", tf)
	}
	if r := getRun(t, p, "k1"); r.Status != agenttool.StatusAborted || r.Error != "user changed their mind" {
		t.Fatalf("row = %+v", r)
	}
	if in := detInspect(t, p, "k1"); in.Status != agenttool.StatusAborted {
		t.Fatalf("child = %s", in.Status)
	}
}

// ---------------------------------------------------------------------------
// Notify (chat parents).

// TestDetachedNotify covers scenarios 62, 65 and 67: the run's end becomes a
// user-role message in the parent's chat (id detached-finish:<run>:<status>,
// metadata source/runId/agentType/status) and the parent's model answers it
// in exactly one turn; the default source is "detached-agent-tool".
func TestDetachedNotify(t *testing.T) {
	for _, tc := range []struct{ source, want string }{{"research-background", "research-background"}, {"", "detached-agent-tool"}} {
		t.Run(tc.want, func(t *testing.T) {
			k := newDetKit()
			env := detStart(t, k, "")
			d := detWatch(t, env)
			ctx := detCtx(t)
			p := detParentOf(t, env, "pn")
			ws := detDial(t, env, "det-parent/pn")
			detDispatch(t, ctx, p, "DetWorker", "notify-run", agenttool.DetachedOptions{Notify: true, NotifySource: tc.source})
			k.finishWorker(t, ctx)
			id := "detached-finish:notify-run:completed"
			msgs := ws.waitTranscript(ctx, "the model's answer", detHasReplyAfter(id))
			got := detMessages(msgs, "detached-finish:")
			if len(got) != 1 || got[0].Role != message.RoleUser || got[0].ID != id {
				t.Fatalf("notify messages = %+v", got)
			}
			if txt := chat.MessageText(got[0]); txt != "Background task \"DetWorker\" (run notify-run) finished:\n\ndetached summary" {
				t.Fatalf("text = %q", txt)
			}
			var meta map[string]any
			_ = json.Unmarshal(got[0].Metadata, &meta)
			detEq(t, "metadata", meta, map[string]any{"source": tc.want, "runId": "notify-run", "agentType": "DetWorker", "status": "completed"})
			k.waitCall(t, ctx, "global")
			for range 3 {
				if len(detReconciles(t, p)) == 0 {
					break
				}
				detTickNext(t, ctx, k, d, p)
			}
			if n := len(k.parentModel.Calls()); n != 1 {
				t.Fatalf("%d parent model calls, want 1", n)
			}
			if n := len(detMessages(p.Messages(), "detached-finish:")); n != 1 {
				t.Fatalf("%d notify messages after the ticks", n)
			}
		})
	}
}

// TestDetachedNotifyFormat covers FormatDetachedCompletion: its text is
// used, and an empty string suppresses the message (no model turn, and the
// delivery still counts as done).
func TestDetachedNotifyFormat(t *testing.T) {
	k := newDetKit()
	k.formatCompletion = func(run agenttool.Run, res agenttool.Result) string {
		if run.RunID == "quiet" {
			return ""
		}
		return "custom: " + run.RunID + " " + string(res.Status) + " " + res.Summary
	}
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detGet[*detFmtParent](t, env, agent.Root("DetFmtParent", "pf"))
	ws := detDial(t, env, "det-fmt-parent/pf")

	detDispatch(t, ctx, p, "DetWorker", "quiet", agenttool.DetachedOptions{Notify: true})
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "global")
	detDispatch(t, ctx, p, "DetWorker", "loud", agenttool.DetachedOptions{Notify: true})
	k.finishWorker(t, ctx)
	msgs := ws.waitTranscript(ctx, "the model's answer", detHasReplyAfter("detached-finish:loud:completed"))
	// A delivery is recorded after its callback returns: a reconcile tick
	// in between finds the slot claimed, not delivered, and ticks again.
	// On PostgreSQL the record can come after the notification's whole
	// turn (the write queues behind the turn's own).
	detDelivered(t, ctx, d, "quiet", "finish")
	detDelivered(t, ctx, d, "loud", "finish")
	got := detMessages(msgs, "detached-finish:")
	if len(got) != 1 || chat.MessageText(got[0]) != "custom: loud completed detached summary" {
		t.Fatalf("notify messages = %+v", got)
	}
	for range 3 {
		if len(detReconciles(t, p)) == 0 {
			break
		}
		detTickNext(t, ctx, k, d, p)
	}
	if rs := detReconciles(t, p); len(rs) != 0 {
		t.Fatalf("a suppressed notification stays outstanding: %+v", rs)
	}
	if n := len(k.parentModel.Calls()); n != 1 {
		t.Fatalf("%d parent model calls, want 1 (the suppressed one takes none)", n)
	}
}

// TestOnFinishWinsOverNotify: with both OnFinish and Notify, OnFinish is
// called and no chat message is added.
func TestOnFinishWinsOverNotify(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	ctx := detCtx(t)
	p := detParentOf(t, env, "pw")
	detDispatch(t, ctx, p, "DetWorker", "both", agenttool.DetachedOptions{OnFinish: "OnDone", Notify: true})
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")
	if msgs := p.Messages(); len(msgs) != 0 {
		t.Fatalf("notify message added despite OnFinish: %+v", msgs)
	}
	if n := len(k.parentModel.Calls()); n != 0 {
		t.Fatalf("%d parent model calls", n)
	}
}

// TestDetachedNotifyGiveUp: a give-up notifies once with its own status
// (detached-finish:<run>:interrupted), and the torn-down child's aborted
// end adds no second message (difference 7).
func TestDetachedNotifyGiveUp(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "pg")
	ws := detDial(t, env, "det-parent/pg")
	detDispatch(t, ctx, p, "DetWorker", "g1", agenttool.DetachedOptions{Notify: true, MaxBudget: time.Second})
	detTickNext(t, ctx, k, d, p)
	msgs := ws.waitTranscript(ctx, "the model's answer", detHasReplyAfter("detached-finish:g1:interrupted"))
	got := detMessages(msgs, "detached-finish:")
	if len(got) != 1 || !strings.Contains(chat.MessageText(got[0]), `Background task "DetWorker" (run g1)`) {
		t.Fatalf("notify messages = %+v", got)
	}
	for range 3 {
		if len(detReconciles(t, p)) == 0 {
			break
		}
		detTickNext(t, ctx, k, d, p)
	}
	if n := len(detMessages(p.Messages(), "detached-finish:")); n != 1 {
		t.Fatalf("%d notify messages, want 1: %+v", n, p.Messages())
	}
}

// ---------------------------------------------------------------------------
// Milestone notices (difference 3).

// TestMilestoneNarrate covers scenarios 64 and 68: a configured milestone
// adds an assistant line to the parent's chat as soon as it lands, with no
// model call; the same name again (and the reconcile) adds nothing more;
// unconfigured names add nothing.
func TestMilestoneNarrate(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "pm")
	ws := detDial(t, env, "det-parent/pm")
	detDispatch(t, ctx, p, "DetWorker", "ms-narrate", agenttool.DetachedOptions{OnFinish: "OnDone", NotifySource: "research-background",
		OnMilestones: &agenttool.MilestoneNotices{Names: []string{"sources-gathered"}}})
	milestone := func(name string) {
		if err := k.do(t, ctx, func(ctx context.Context) error {
			return agenttool.ReportProgress(ctx, agenttool.Progress{Milestone: name})
		}); err != nil {
			t.Fatal(err)
		}
	}
	milestone("sources-gathered")
	id := "detached-ms:ms-narrate:sources-gathered"
	msgs := ws.waitTranscript(ctx, "the milestone line", detHasID(id))
	got := detMessages(msgs, "detached-ms:")
	if len(got) != 1 || got[0].Role != message.RoleAssistant || !strings.Contains(chat.MessageText(got[0]), `reached milestone "sources-gathered"`) {
		t.Fatalf("milestone messages = %+v", got)
	}
	var meta map[string]any
	_ = json.Unmarshal(got[0].Metadata, &meta)
	detEq(t, "metadata", meta, map[string]any{"milestone": "sources-gathered", "runId": "ms-narrate", "source": "research-background"})

	milestone("sources-gathered")
	milestone("other")
	detTickNext(t, ctx, k, d, p)
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")
	if n := len(detMessages(p.Messages(), "detached-ms:")); n != 1 {
		t.Fatalf("%d milestone messages, want 1: %+v", n, p.Messages())
	}
	if n := len(k.parentModel.Calls()); n != 0 {
		t.Fatalf("narrate made %d model calls", n)
	}
	if in := detInspect(t, p, "ms-narrate"); len(in.Milestones) != 3 {
		t.Fatalf("milestones = %+v", in.Milestones)
	}
}

// TestMilestoneReact covers scenarios 63 and 69: react mode adds a
// user-role message (id detached-ms:<run>:<name>) and the model answers it
// in exactly one call, however often the milestone is reached.
func TestMilestoneReact(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "pr")
	ws := detDial(t, env, "det-parent/pr")
	detDispatch(t, ctx, p, "DetWorker", "ms-react", agenttool.DetachedOptions{OnFinish: "OnDone",
		OnMilestones: &agenttool.MilestoneNotices{Names: []string{"preview-ready"}, Mode: agenttool.MilestoneReact}})
	for range 2 {
		if err := k.do(t, ctx, func(ctx context.Context) error {
			return agenttool.ReportProgress(ctx, agenttool.Progress{Milestone: "preview-ready", Data: map[string]int{"pages": 3}})
		}); err != nil {
			t.Fatal(err)
		}
	}
	id := "detached-ms:ms-react:preview-ready"
	msgs := ws.waitTranscript(ctx, "the model's answer", detHasReplyAfter(id))
	got := detMessages(msgs, "detached-ms:")
	if len(got) != 1 || got[0].Role != message.RoleUser {
		t.Fatalf("milestone messages = %+v", got)
	}
	var meta map[string]any
	_ = json.Unmarshal(got[0].Metadata, &meta)
	detEq(t, "metadata", meta, map[string]any{"milestone": "preview-ready", "runId": "ms-react", "source": "detached-agent-tool"})
	detTickNext(t, ctx, k, d, p)
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")
	if n := len(k.parentModel.Calls()); n != 1 {
		t.Fatalf("%d model calls, want 1", n)
	}
	if n := len(detMessages(p.Messages(), "detached-ms:")); n != 1 {
		t.Fatalf("%d milestone messages", n)
	}
}

// TestMilestoneNoticeAfterRestart (difference 3): a milestone reached by a
// child that resumed after a restart (with no client connected to the
// parent) is announced in the parent's chat once, by whichever of the
// restarted follower and the reconcile tick gets to it first.
func TestMilestoneNoticeAfterRestart(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	ctx := detCtx(t)
	p := detParentOf(t, env, "pa")
	detDispatch(t, ctx, p, "DetWorker", "ms-cold", agenttool.DetachedOptions{OnFinish: "OnDone",
		OnMilestones: &agenttool.MilestoneNotices{Names: []string{"sources-gathered"}}})
	if err := k.do(t, ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	env.Close()

	k.clock = clockwork.NewFakeClockAt(k.clock.Now().Add(time.Second))
	env2 := detStart(t, k, env.Dir)
	d := detWatch(t, env2)
	parent := agent.Root("DetParent", "pa")
	// The child resumes on its own.
	if err := k.do(t, ctx, func(ctx context.Context) error {
		return agenttool.ReportProgress(ctx, agenttool.Progress{Milestone: "sources-gathered"})
	}); err != nil {
		t.Fatal(err)
	}
	_ = parent
	k.clock.Advance(5 * time.Second)
	d.wait(t, ctx, "the reconcile tick", diag.ChannelSchedule, "fire", detAttr("method", detReconcile))
	ws := detDial(t, env2, "det-parent/pa")
	ws.waitTranscript(ctx, "the milestone line", detHasID("detached-ms:ms-cold:sources-gathered"))
	p = detParentOf(t, env2, "pa")
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")
	if n := len(detMessages(p.Messages(), "detached-ms:")); n != 1 {
		t.Fatalf("%d milestone messages, want 1", n)
	}
}
