package agenttool_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// Runs that wait for input, and usage, when the parent and the child are
// on different nodes: two runtimes of a pretend cluster on one PostgreSQL
// database, one owning the parents, the other the sub-agents, reaching
// each other in process (nodeRemote) as cluster.Peer does over HTTP
// (test/clustercrash runs the same over node processes).

// nodeRemote is the node-to-node calls of the two-node pretend cluster,
// in process, with in-process wake-up hints.
type nodeRemote struct {
	child   func() *agent.Runtime
	answers atomic.Int32

	mu      sync.Mutex
	watches map[string]map[chan struct{}]bool
}

var (
	_ agenttool.Remote = (*nodeRemote)(nil)
	_ agenttool.Hints  = (*nodeRemote)(nil)
)

func (r *nodeRemote) StartChild(ctx context.Context, req agenttool.RemoteStart) (string, error) {
	return agenttool.StartRemoteChild(ctx, r.child(), req)
}

func (r *nodeRemote) CancelChild(ctx context.Context, req agenttool.RemoteCancel) error {
	return agenttool.CancelRemoteChild(ctx, r.child(), req)
}

func (r *nodeRemote) DestroyChild(ctx context.Context, child agent.Path) error {
	return agenttool.DestroyRemoteChild(ctx, r.child(), child)
}

func (r *nodeRemote) AnswerChild(ctx context.Context, req agenttool.RemoteAnswer) error {
	r.answers.Add(1)
	return agenttool.AnswerRemoteChild(ctx, r.child(), req)
}

func (r *nodeRemote) Hint(child agent.Path) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ch := range r.watches[child.String()] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (r *nodeRemote) Watch(child agent.Path) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	key := child.String()
	r.mu.Lock()
	if r.watches == nil {
		r.watches = map[string]map[chan struct{}]bool{}
	}
	if r.watches[key] == nil {
		r.watches[key] = map[chan struct{}]bool{}
	}
	r.watches[key][ch] = true
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		delete(r.watches[key], ch)
		if len(r.watches[key]) == 0 {
			delete(r.watches, key)
		}
		r.mu.Unlock()
	}
}

// twoNodes is the pretend cluster: parents owns the root instances,
// children the sub-agents.
type twoNodes struct {
	parents, children *testenv.Env
	remote            *nodeRemote
}

func startTwoNodes(t *testing.T, k *kit, clock clockwork.Clock, classes []agent.Class) *twoNodes {
	t.Helper()
	t.Setenv("AGENTRY_TEST_STORE", "postgres")
	dir := t.TempDir()
	r := &nodeRemote{}
	start := func(place splitPlacement) *testenv.Env {
		return startEnv(t, testenv.Options{Postgres: &pg, Dir: dir, Clock: clock, Classes: classes, Placement: place, Logger: k.logs.Logger()},
			chat.Config{}, agenttool.Options{Remote: r, RemotePoll: 20 * time.Millisecond}, nil)
	}
	children := start(splitPlacement{children: true})
	r.child = func() *agent.Runtime { return children.RT }
	return &twoNodes{parents: start(splitPlacement{}), children: children, remote: r}
}

// startRemoteWaiting is startWaiting on two nodes: the Assistant's
// Publisher child is on the other node.
func startRemoteWaiting(t *testing.T, published *atomic.Int64) (*twoNodes, *kit) {
	k := newKit()
	k.parentModel = scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("parent got: " + string(scripted.ToolResults(req)[0].Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.ToolCall("research", researchInput{Query: "q"})})},
	))
	k.parentTools = []chat.Tool{agenttool.AgentTool[researchInput]("Publisher", agenttool.ToolOptions{Name: "research"})}
	return startTwoNodes(t, k, nil, []agent.Class{
		{Name: "Assistant", New: func() agent.Agent { return &assistant{k: k} }, Public: true},
		{Name: "Publisher", New: func() agent.Agent { return &publisher{published: published} }},
	}), k
}

// startedRun waits for the first run's start and returns its id.
func startedRun(t *testing.T, ctx context.Context, w *wsClient) string {
	t.Helper()
	var runID string
	w.waitFrames(ctx, "the run's start", func(fs []agenttool.Frame) bool {
		for _, f := range fs {
			if f.Event.Kind == "started" {
				runID = f.Event.RunID
				return true
			}
		}
		return false
	})
	return runID
}

// runTimeline returns the run's chunk bodies the client got, in order.
func runTimeline(fs []agenttool.Frame, runID string) []string {
	var out []string
	for _, f := range fs {
		if f.Event.RunID == runID && f.Event.Kind == "chunk" {
			out = append(out, f.Event.Body)
		}
	}
	return out
}

// indexOf returns the index of the first body containing s, or -1.
func indexOf(bodies []string, s string) int {
	for i, b := range bodies {
		if strings.Contains(b, s) {
			return i
		}
	}
	return -1
}

// checkOneSequence fails unless the run's stored chunks the client got
// (all but the unstored progress chunks) are one sequence.
func checkOneSequence(t *testing.T, fs []agenttool.Frame, runID string) {
	t.Helper()
	var seqs []int64
	for _, f := range fs {
		if f.Event.RunID == runID && f.Event.Kind == "chunk" && !strings.Contains(f.Event.Body, "data-agent-progress") {
			seqs = append(seqs, f.Sequence)
		}
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("run chunk sequences %v are not one sequence", seqs)
		}
	}
}

// TestRemoteChildApprovalFromParent: a child on another node asks for the
// approval of publish_findings; the parent's client sees the request and
// the run waiting for input under its run (also in a replay), and answers
// with agent_tool_approval on the parent's node. The answer reaches the
// child's owner (one node call), the child's continuation turn streams to
// the parent's clients in the run's one sequence, and the run and the
// parent's turn complete: the call ran once when approved, never when
// denied. A guessed run id is refused on the owner without waking an
// instance.
func TestRemoteChildApprovalFromParent(t *testing.T) {
	for _, tc := range []struct {
		name      string
		approved  bool
		published int64
		text      string
	}{
		{"Approve", true, 1, "published t"},
		{"Deny", false, 0, message.ResultDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var published atomic.Int64
			nodes, _ := startRemoteWaiting(t, &published)
			ctx := testCtx(t)
			a := getAssistant(t, nodes.parents, "p1")
			w := dial(t, nodes.parents, "assistant/p1")
			done := make(chan chat.TurnResult, 1)
			go func() {
				res, err := a.SaveMessages(context.Background(), []message.Message{userMsg("research and publish")})
				if err != nil {
					t.Error(err)
				}
				done <- res
			}()
			runID := startedRun(t, ctx, w)
			child := agent.Root("Assistant", "p1").Child("Publisher", runID)
			if _, ok := nodes.parents.RT.Lookup(child); ok {
				t.Fatal("the child is resident on the parent's node: the test's placement is wrong")
			}
			call := waitingCall(t, ctx, w, runID)
			w.waitRaw(ctx, "the waiting progress", func(s string) bool { return strings.Contains(s, `waiting-for-input`) })
			// A client connecting now replays the wait too.
			w2 := dial(t, nodes.parents, "assistant/p1")
			if indexOf(runTimeline(w2.waitFrames(ctx, "the replay", func([]agenttool.Frame) bool { return true }), runID), "waiting-for-input") < 0 {
				t.Error("a replay of the waiting run does not say it waits")
			}
			w2.close()
			if insp, err := agenttool.InspectAgentToolRun(ctx, a, runID); err != nil || insp == nil ||
				len(insp.Waiting) != 1 || insp.Waiting[0].ToolCallID != call || !insp.Waiting[0].Approval {
				t.Fatalf("inspection while waiting: %+v %v", insp, err)
			}
			select {
			case res := <-done:
				t.Fatalf("the parent's turn ended while its helper waited: %+v", res)
			default:
			}
			// Refused: an unknown run on the parent, a guessed one on the
			// child's owner (no instance wakes for it).
			w.send(map[string]any{"type": wire.AgentToolApproval, "runId": "nope", "toolCallId": call, "approved": true})
			w.waitRaw(ctx, "the refusal", func(s string) bool { return strings.Contains(s, "unknown_run") })
			guess := agent.Root("Assistant", "p1").Child("Publisher", "agent-tool:guess")
			err := agenttool.AnswerRemoteChild(ctx, nodes.children.RT, agenttool.RemoteAnswer{Child: guess, RunID: "agent-tool:guess",
				ToolCallID: call, Kind: agenttool.AnswerApproval, Approved: true})
			if !errors.Is(err, agenttool.ErrRunNotWaiting) {
				t.Errorf("answer for a guessed run: %v, want ErrRunNotWaiting", err)
			}
			if _, ok := nodes.children.RT.Lookup(guess); ok {
				t.Error("a guessed run id woke an instance")
			}
			// A node that does not own the child refuses (a node call then
			// asks the new owner).
			if err := agenttool.AnswerRemoteChild(ctx, nodes.parents.RT, agenttool.RemoteAnswer{Child: child, RunID: runID,
				ToolCallID: call, Kind: agenttool.AnswerApproval, Approved: true}); !errors.Is(err, agent.ErrNotOwner) {
				t.Errorf("answer on a node that does not own the child: %v, want agent.ErrNotOwner", err)
			}
			if err := agenttool.AnswerRemoteChild(ctx, nodes.children.RT, agenttool.RemoteAnswer{Child: child, RunID: "other", ToolCallID: call, Kind: agenttool.AnswerApproval}); !errors.Is(err, agenttool.ErrBadRemoteCall) {
				t.Errorf("answer whose run id does not name the child: %v, want ErrBadRemoteCall", err)
			}

			w.send(map[string]any{"type": wire.AgentToolApproval, "runId": runID, "toolCallId": call, "approved": tc.approved})
			res := <-done
			if res.Outcome != chat.OutcomeCompleted || !strings.Contains(res.Text(), tc.text) {
				t.Fatalf("parent turn %+v, want %q", res, tc.text)
			}
			if n := published.Load(); n != tc.published {
				t.Fatalf("published %d times, want %d", n, tc.published)
			}
			if n := nodes.remote.answers.Load(); n != 1 {
				t.Errorf("%d answers through the child's owner, want 1", n)
			}
			fs := w.waitFrames(ctx, "the run's end", terminated(runID))
			bodies := runTimeline(fs, runID)
			req, wait := indexOf(bodies, message.ChunkToolApprovalRequest), indexOf(bodies, "waiting-for-input")
			resumed, cont := indexOf(bodies, "Input received"), indexOf(bodies, `"type":"tool-output-`)
			if req < 0 || wait < req || resumed < wait || cont < resumed {
				t.Fatalf("the run's timeline: request %d, waiting %d, input received %d, continuation %d:\n%s",
					req, wait, resumed, cont, strings.Join(bodies, "\n"))
			}
			checkOneSequence(t, fs, runID)
			if got := getRun(t, a, runID); got.Status != agenttool.StatusCompleted {
				t.Fatalf("run %+v", got)
			}
		})
	}
}

// TestRemoteChildClientToolFromParent: a child on another node calls a
// client-side tool; the parent's client answers it with agent_tool_result
// (an approval is refused: the call does not wait for one), and the run
// completes with the child's answer.
func TestRemoteChildClientToolFromParent(t *testing.T) {
	k := newKit()
	k.parentModel = scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("parent got: " + string(scripted.ToolResults(req)[0].Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.ToolCall("clock", researchInput{Query: "now"})})},
	))
	k.parentTools = []chat.Tool{agenttool.AgentTool[researchInput]("Clocker", agenttool.ToolOptions{Name: "clock"})}
	nodes := startTwoNodes(t, k, nil, []agent.Class{
		{Name: "Assistant", New: func() agent.Agent { return &assistant{k: k} }, Public: true},
		{Name: "Clocker", New: func() agent.Agent { return &clocker{} }},
	})
	ctx := testCtx(t)
	a := getAssistant(t, nodes.parents, "c1")
	w := dial(t, nodes.parents, "assistant/c1")
	done := make(chan chat.TurnResult, 1)
	go func() {
		res, _ := a.SaveMessages(context.Background(), []message.Message{userMsg("what time is it")})
		done <- res
	}()
	var runID, call string
	w.waitFrames(ctx, "the client tool's call", func(fs []agenttool.Frame) bool {
		for _, f := range fs {
			var ch message.Chunk
			if f.Event.Kind == "chunk" && json.Unmarshal([]byte(f.Event.Body), &ch) == nil && ch.Type == message.ChunkToolInputAvailable {
				runID, call = f.Event.RunID, ch.ToolCallID
			}
		}
		return call != ""
	})
	w.waitRaw(ctx, "the waiting progress", func(s string) bool { return strings.Contains(s, `Waiting for get_local_time`) })
	w.send(map[string]any{"type": wire.AgentToolApproval, "runId": runID, "toolCallId": call, "approved": true})
	w.waitRaw(ctx, "the refusal", func(s string) bool { return strings.Contains(s, "tool_call_not_waiting") })
	w.send(map[string]any{"type": wire.AgentToolResult, "runId": runID, "toolCallId": call, "output": map[string]any{"time": "10:42"}})
	res := <-done
	if res.Outcome != chat.OutcomeCompleted || !strings.Contains(res.Text(), `the time is {\"time\":\"10:42\"}`) {
		t.Fatalf("parent turn %+v", res)
	}
	fs := w.waitFrames(ctx, "the run's end", terminated(runID))
	if bodies := runTimeline(fs, runID); indexOf(bodies, `"delta":"the time"`) < indexOf(bodies, "Input received") {
		t.Fatalf("the continuation did not reach the parent's client after the answer:\n%s", strings.Join(bodies, "\n"))
	}
	checkOneSequence(t, fs, runID)
}

// TestRemoteChildAnsweredOnItsNode: the wait answered (a denial) in the
// child's own chat on its node, as the drill-in chat does (the cluster
// routes the drill-in's socket to the child's owner): the parent's
// follower tails the continuation, and the parent's turn completes with
// the child's report of the denial.
func TestRemoteChildAnsweredOnItsNode(t *testing.T) {
	var published atomic.Int64
	nodes, _ := startRemoteWaiting(t, &published)
	ctx := testCtx(t)
	a := getAssistant(t, nodes.parents, "p2")
	w := dial(t, nodes.parents, "assistant/p2")
	done := make(chan chat.TurnResult, 1)
	go func() {
		res, _ := a.SaveMessages(context.Background(), []message.Message{userMsg("research and publish")})
		done <- res
	}()
	runID := startedRun(t, ctx, w)
	call := waitingCall(t, ctx, w, runID)
	w.waitRaw(ctx, "the waiting progress", func(s string) bool { return strings.Contains(s, `waiting-for-input`) })
	child, err := nodes.children.RT.Get(ctx, agent.Root("Assistant", "p2").Child("Publisher", runID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := child.(*publisher).AddToolApprovalResponse(ctx, call, false, "", chat.AnswerOptions{AutoContinue: true}); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.Outcome != chat.OutcomeCompleted || !strings.Contains(res.Text(), message.ResultDenied) {
		t.Fatalf("parent turn %+v, want the child's report of the denial", res)
	}
	if n := published.Load(); n != 0 {
		t.Fatalf("a denied call ran %d times", n)
	}
	fs := w.waitFrames(ctx, "the run's end", terminated(runID))
	if bodies := runTimeline(fs, runID); indexOf(bodies, `"type":"tool-output-denied"`) < indexOf(bodies, "Input received") {
		t.Fatalf("the continuation did not reach the parent's client:\n%s", strings.Join(bodies, "\n"))
	}
	checkOneSequence(t, fs, runID)
}

// TestRemoteDetachedWaitIsNotSilence: a detached run whose child, on
// another node, waits for an approval is not given up by its no-progress
// budget however long the wait (the child's record says it waits); the
// approval from the parent's node resumes it, and the run completes.
func TestRemoteDetachedWaitIsNotSilence(t *testing.T) {
	k := newDetKit()
	k.work = func(ctx context.Context, w *detWorker, tt *chat.Turn) error {
		if tt.Continuation {
			return tt.WriteText("published after approval")
		}
		// A first signal, so that the no-progress budget counts.
		if err := agenttool.ReportProgress(ctx, agenttool.Progress{Fraction: agenttool.Fraction(0.5), Message: "drafted"}); err != nil {
			return err
		}
		for _, ch := range []message.Chunk{message.StartStep(), message.ToolInputAvailable("call_pub", "publish", json.RawMessage(`{}`)),
			message.ToolApprovalRequest("ap1", "call_pub"), message.FinishStep()} {
			if err := tt.Write(ch); err != nil {
				return err
			}
		}
		return nil
	}
	nodes := startTwoNodes(t, newKit(), k.clock, []agent.Class{
		{Name: "DetParent", New: func() agent.Agent { return &detParent{k: k} }, Public: true},
		{Name: "DetWorker", New: func() agent.Agent { return &detWorker{k: k} }},
	})
	d := detWatch(t, nodes.parents)
	cd := detWatch(t, nodes.children)
	ctx := detCtx(t)
	p := detParentOf(t, nodes.parents, "pw")
	detDispatch(t, ctx, p, "DetWorker", "w1", agenttool.DetachedOptions{OnFinish: "OnDone", NoProgressBudget: 40 * time.Second})
	cd.wait(t, ctx, "the run's wait for input", diag.ChannelAgentTool, "waiting", detAttr("runId", "w1"))
	for range 4 { // ticks at 5, 20, 50, 170 s: 170 s of waiting
		detTickNext(t, ctx, k, d, p)
	}
	if r := getRun(t, p, "w1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("a remote run waiting for input was given up: %s (%s)", r.Status, r.Reason)
	}
	if err := agenttool.AnswerAgentToolApproval(ctx, p, "w1", "call_pub", true, ""); err != nil {
		t.Fatal(err)
	}
	call := k.waitCall(t, ctx, "done")
	if call.Run.RunID != "w1" || call.Result.Status != agenttool.StatusCompleted || !strings.Contains(call.Result.Summary, "published after approval") {
		t.Fatalf("finish = %+v", call)
	}
	if n := nodes.remote.answers.Load(); n != 1 {
		t.Errorf("%d answers through the child's owner, want 1", n)
	}
}

// startRemoteTree is startTree on two nodes: Root on one, Mid and its Leaf
// on the other.
func startRemoteTree(t *testing.T, b agenttool.TokenBudget, leafTools []chat.Tool) *twoNodes {
	t.Helper()
	leafModel := fixedUsage{Model: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("leaf answer")}))), in: 100, out: 200}
	if len(leafTools) > 0 {
		leafModel = fixedUsage{Model: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.ToolCall("wait", map[string]any{})}))), in: 100, out: 200}
	}
	return startTwoNodes(t, newKit(), nil, []agent.Class{
		{Name: "Root", Public: true, New: func() agent.Agent {
			return &treeAgent{m: delegating("mid", "root done", 1, 2),
				tools: []chat.Tool{agenttool.AgentTool[treeInput]("Mid", agenttool.ToolOptions{Name: "mid", Tokens: b})}}
		}},
		{Name: "Mid", New: func() agent.Agent {
			return &treeAgent{m: delegating("leaf", "mid done", 10, 20),
				tools: []chat.Tool{agenttool.AgentTool[treeInput]("Leaf", agenttool.ToolOptions{Name: "leaf"})}}
		}},
		{Name: "Leaf", New: func() agent.Agent { return &treeAgent{m: leafModel, tools: leafTools} }},
	})
}

// TestRemoteUsageRollsUpTree: Root's child Mid is on another node: the
// run records Mid's tree usage, and Root's message and turn report their
// own usage, Mid's under its run, and the sum of all three levels, as on
// one node (TestUsageRollsUpTree).
func TestRemoteUsageRollsUpTree(t *testing.T) {
	nodes := startRemoteTree(t, agenttool.TokenBudget{}, nil)
	ctx := testCtx(t)
	root, err := nodes.parents.RT.Get(ctx, agent.Root("Root", "r"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := root.(*treeAgent).SaveMessages(ctx, []message.Message{userMsg("go")})
	if err != nil || res.Outcome != chat.OutcomeCompleted || res.Text() != "root done" {
		t.Fatalf("root turn: %v %+v", err, res)
	}
	leafOwn, midOwn, rootOwn := u(100, 200), u(2*10, 2*20), u(2*1, 2*2)
	midTree := midOwn.Add(leafOwn)
	rootTree := rootOwn.Add(midTree)
	midRun := onlyRun(t, ctx, root)
	if _, ok := nodes.parents.RT.Lookup(agent.BaseOf(root).Path().Child("Mid", midRun.RunID)); ok {
		t.Fatal("Mid is resident on Root's node: the test's placement is wrong")
	}
	if midRun.Usage == nil || *midRun.Usage != midTree {
		t.Errorf("the remote run records usage %+v, want %+v", midRun.Usage, midTree)
	}
	md := chat.MessageMetadata(res.Message)
	if md.Usage == nil || *md.Usage != rootOwn || md.TreeUsage == nil || *md.TreeUsage != rootTree {
		t.Errorf("root message: usage %+v tree %+v, want %+v and %+v", md.Usage, md.TreeUsage, rootOwn, rootTree)
	}
	if got := md.ChildUsage; len(got) != 1 || got[midRun.RunID] != midTree {
		t.Errorf("root's child usage %+v, want %s: %+v", got, midRun.RunID, midTree)
	}
	if res.Usage != rootOwn || res.TreeUsage != rootTree {
		t.Errorf("root result usage %+v tree %+v, want %+v and %+v", res.Usage, res.TreeUsage, rootOwn, rootTree)
	}
}

// TestRemoteTreeBudgetStopsRun: Root's tool gives its remote Mid run a tree
// budget (50 tokens, which Mid's Leaf crosses while it waits to be
// canceled) or a per-run budget (20, which Mid's own first call crosses):
// Root stops the run through the child's owner, and it ends interrupted
// with reason budget-exceeded, its usage recorded, the Leaf aborted with
// it, as on one node (TestTreeBudgetStopsRun).
func TestRemoteTreeBudgetStopsRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget agenttool.TokenBudget
		usage  chat.Usage
		text   string
	}{
		{"tree", agenttool.TokenBudget{MaxTreeTokens: 50}, u(10, 20).Add(u(100, 200)), "tree used 330 tokens, over its budget of 50"},
		{"own", agenttool.TokenBudget{MaxTokens: 20}, u(10, 20), "used 30 tokens, over its budget of 20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wait := chat.NewTool("wait", "Waits until canceled.", func(ctx context.Context, in struct{}) (string, error) {
				err := agent.Await(ctx, func() error { <-ctx.Done(); return ctx.Err() })
				return "", err
			})
			nodes := startRemoteTree(t, tc.budget, []chat.Tool{wait})
			ctx := testCtx(t)
			root, err := nodes.parents.RT.Get(ctx, agent.Root("Root", "b"))
			if err != nil {
				t.Fatal(err)
			}
			res, err := root.(*treeAgent).SaveMessages(ctx, []message.Message{userMsg("go")})
			if err != nil || res.Outcome != chat.OutcomeCompleted || res.Text() != "root done" {
				t.Fatalf("root turn: %v %+v", err, res)
			}
			run := onlyRun(t, ctx, root)
			if run.Status != agenttool.StatusInterrupted || run.Reason != agenttool.ReasonBudgetExceeded || !strings.Contains(run.Error, tc.text) {
				t.Fatalf("run = %+v", run)
			}
			// As on one node, a per-run stop races with the leaf's first
			// report.
			if run.Usage == nil || (*run.Usage != tc.usage && (tc.name == "tree" || *run.Usage != tc.usage.Add(u(100, 200)))) {
				t.Errorf("run usage %+v, want %+v", run.Usage, tc.usage)
			}
			var failure agenttool.Failure
			for _, p := range res.Message.Parts {
				if p.Type == "tool-mid" {
					_ = json.Unmarshal(p.Output, &failure)
				}
			}
			if failure.OK || failure.Status != agenttool.StatusInterrupted || failure.Reason != agenttool.ReasonBudgetExceeded || failure.Retryable {
				t.Errorf("tool output %+v", failure)
			}
			mid, err := nodes.children.RT.Get(ctx, agent.BaseOf(root).Path().Child("Mid", run.RunID))
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "tree" {
				if leafRun := onlyRun(t, ctx, mid); leafRun.Status != agenttool.StatusAborted {
					t.Errorf("leaf run %+v, want aborted with its parent", leafRun)
				}
			}
			// The child's record of the run ended aborted on its node.
			var status string
			if err := nodes.parents.DB.View(ctx, func(tx store.Tx) error {
				return tx.QueryRow(ctx, `SELECT r.status FROM agent_tool_child_runs r JOIN instances i ON i.id = r.instance_id WHERE i.path = ?`,
					agent.BaseOf(mid).Path().String()).Scan(&status)
			}); err != nil || status != string(agenttool.StatusAborted) {
				t.Errorf("the child's record: %q %v, want aborted", status, err)
			}
		})
	}
}
