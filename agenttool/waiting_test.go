package agenttool_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/wire"
)

// publisher is a child whose publish tool needs approval.
type publisher struct {
	chat.Base
	published *atomic.Int64
}

func (p *publisher) ChatModel() model.Model {
	return scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			r := scripted.ToolResults(req)[0]
			return scripted.Reply{scripted.Text("publish result: " + string(r.Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.Text("Researching. "),
			scripted.ToolCall("publish_findings", map[string]any{"title": "t"})})},
	))
}

func (p *publisher) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("publish_findings", "Publish.", func(ctx context.Context, in struct {
		Title string `json:"title"`
	}) (string, error) {
		p.published.Add(1)
		return "published " + in.Title, nil
	}).WithApproval(chat.RequireApproval)}
}

func startWaiting(t *testing.T, published *atomic.Int64) (*testenv.Env, *kit) {
	return startWaitingIn(t, published, "")
}

func startWaitingIn(t *testing.T, published *atomic.Int64, dir string) (*testenv.Env, *kit) {
	k := newKit()
	k.parentModel = scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("parent got: " + string(scripted.ToolResults(req)[0].Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.ToolCall("research", researchInput{Query: "q"})})},
	))
	k.parentTools = []chat.Tool{agenttool.AgentTool[researchInput]("Publisher", agenttool.ToolOptions{Name: "research"})}
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{
			{Name: "Assistant", New: func() agent.Agent { return &assistant{k: k} }, Public: true},
			{Name: "Publisher", New: func() agent.Agent { return &publisher{published: published} }},
		},
		Logger: k.logs.Logger(),
		Dir:    dir,
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			agenttool.Install(rt, agenttool.Options{})
			return nil
		},
	})
	return env, k
}

// waitingCall waits until the run's chunks carry a tool-approval-request
// and returns its tool call id.
func waitingCall(t *testing.T, ctx context.Context, w *wsClient, runID string) string {
	t.Helper()
	var id string
	w.waitFrames(ctx, "the child's approval request", func(fs []agenttool.Frame) bool {
		for _, f := range fs {
			var ch message.Chunk
			if f.Event.RunID == runID && f.Event.Kind == "chunk" && json.Unmarshal([]byte(f.Event.Body), &ch) == nil &&
				ch.Type == message.ChunkToolApprovalRequest {
				id = ch.ToolCallID
				return true
			}
		}
		return false
	})
	return id
}

// TestChildApprovalFromParent: a child's approval request reaches the
// parent's clients under its run, which waits (the parent's turn too)
// until a parent's client answers it with agent_tool_approval; then the
// child runs the call once, and the run and the parent's turn complete
// with one timeline.
func TestChildApprovalFromParent(t *testing.T) {
	var published atomic.Int64
	env, _ := startWaiting(t, &published)
	ctx := testCtx(t)
	a := getAssistant(t, env, "p1")
	w := dial(t, env, "assistant/p1")
	done := make(chan chat.TurnResult, 1)
	go func() {
		res, err := a.SaveMessages(context.Background(), []message.Message{userMsg("research and publish")})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
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
	call := waitingCall(t, ctx, w, runID)
	w.waitRaw(ctx, "the waiting progress", func(s string) bool { return strings.Contains(s, `waiting-for-input`) })
	if published.Load() != 0 {
		t.Fatal("the tool ran before its approval")
	}
	if insp, err := agenttool.InspectAgentToolRun(ctx, a, runID); err != nil || insp == nil ||
		len(insp.Waiting) != 1 || insp.Waiting[0].ToolCallID != call || !insp.Waiting[0].Approval {
		t.Fatalf("inspection while waiting: %+v %v", insp, err)
	}
	select {
	case res := <-done:
		t.Fatalf("the parent's turn ended while its helper waited: %+v", res)
	default:
	}
	// A refused answer: an unknown run.
	w.send(map[string]any{"type": wire.AgentToolApproval, "runId": "nope", "toolCallId": call, "approved": true})
	w.waitRaw(ctx, "the refusal", func(s string) bool { return strings.Contains(s, "unknown_run") })
	w.send(map[string]any{"type": wire.AgentToolApproval, "runId": runID, "toolCallId": call, "approved": true})
	res := <-done
	if res.Outcome != chat.OutcomeCompleted || !strings.Contains(res.Text(), "published t") {
		t.Fatalf("parent turn %+v", res)
	}
	if n := published.Load(); n != 1 {
		t.Fatalf("published %d times, want 1", n)
	}
	fs := w.waitFrames(ctx, "the run's end", terminated(runID))
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
	// A new connection replays the whole timeline: the request, the
	// output, the end.
	w2 := dial(t, env, "assistant/p1")
	replay := w2.waitFrames(ctx, "the replay's end", terminated(runID))
	var bodies []string
	for _, f := range replay {
		if f.Event.RunID == runID && f.Event.Kind == "chunk" {
			bodies = append(bodies, f.Event.Body)
		}
	}
	joined := strings.Join(bodies, "\n")
	for _, want := range []string{message.ChunkToolApprovalRequest, message.ChunkToolOutputAvailable, `"finishReason":"stop"`} {
		if !strings.Contains(joined, want) {
			t.Fatalf("replay lacks %s:\n%s", want, joined)
		}
	}
	if got := getRun(t, a, runID); got.Status != agenttool.StatusCompleted || !strings.Contains(got.Summary, "published t") {
		t.Fatalf("run %+v", got)
	}
}

// TestChildApprovalFromDrillIn: the same wait answered (a denial) from the
// child's own chat through the parent's route.
func TestChildApprovalFromDrillIn(t *testing.T) {
	var published atomic.Int64
	env, _ := startWaiting(t, &published)
	ctx := testCtx(t)
	a := getAssistant(t, env, "p2")
	w := dial(t, env, "assistant/p2")
	done := make(chan chat.TurnResult, 1)
	go func() {
		res, _ := a.SaveMessages(context.Background(), []message.Message{userMsg("research and publish")})
		done <- res
	}()
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
	call := waitingCall(t, ctx, w, runID)
	child := dial(t, env, "assistant/p2/sub/publisher/"+strings.ReplaceAll(runID, ":", "%3A"))
	child.send(map[string]any{"type": wire.ToolApproval, "toolCallId": call, "approved": false, "autoContinue": true})
	res := <-done
	if res.Outcome != chat.OutcomeCompleted || !strings.Contains(res.Text(), message.ResultDenied) {
		t.Fatalf("parent turn %+v, want the child's report of the denial", res)
	}
	if n := published.Load(); n != 0 {
		t.Fatalf("a denied call ran %d times", n)
	}
	w.waitFrames(ctx, "the run's end", terminated(runID))
}

// TestChildApprovalAcrossRestart: the runtime stops while a child's run
// waits for an approval; after the restart the parent's recovered turn
// re-attaches to the waiting run (it does not time out), the approval given
// to the new process runs the call once, and the run and the parent's turn
// complete.
func TestChildApprovalAcrossRestart(t *testing.T) {
	var published atomic.Int64
	dir := t.TempDir()
	env, _ := startWaitingIn(t, &published, dir)
	ctx := testCtx(t)
	a := getAssistant(t, env, "p3")
	w := dial(t, env, "assistant/p3")
	go func() {
		_, _ = a.SaveMessages(context.Background(), []message.Message{userMsg("research and publish")})
	}()
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
	call := waitingCall(t, ctx, w, runID)
	w.close()
	env.Close()

	env2, _ := startWaitingIn(t, &published, dir)
	w2 := dial(t, env2, "assistant/p3")
	a2 := getAssistant(t, env2, "p3")
	// The recovered parent re-attaches to the run, which waits again once
	// the child has recovered its turn (the stop may have cut its end).
	w2.waitRaw(ctx, "the run waiting again", func(s string) bool { return strings.Contains(s, `waiting-for-input`) })
	if err := agenttool.AnswerAgentToolApproval(ctx, a2, runID, call, true, ""); err != nil {
		t.Fatal(err)
	}
	w2.waitFrames(ctx, "the run's end", terminated(runID))
	if got := getRun(t, a2, runID); got.Status != agenttool.StatusCompleted || !strings.Contains(got.Summary, "published t") {
		t.Fatalf("run %+v", got)
	}
	if n := published.Load(); n != 1 {
		t.Fatalf("published %d times, want 1", n)
	}
	w2.waitRaw(ctx, "the parent's answer", func(s string) bool { return strings.Contains(s, `parent got: \"Researching. publish result`) })
}

// clocker is a child that asks its client for the local time.
type clocker struct{ chat.Base }

func (c *clocker) ChatModel() model.Model {
	return scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("the time is " + string(scripted.ToolResults(req)[0].Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.ToolCall("get_local_time", map[string]any{})})},
	))
}

func (c *clocker) Tools() []chat.Tool {
	return []chat.Tool{chat.NewClientTool[struct{}]("get_local_time", "The local time.")}
}

// TestChildClientToolFromParent: a child's client-side tool call waits for
// input under its run; the parent's client answers it with
// agent_tool_result, and the run completes with the child's answer.
func TestChildClientToolFromParent(t *testing.T) {
	k := newKit()
	k.parentModel = scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("parent got: " + string(scripted.ToolResults(req)[0].Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.ToolCall("clock", researchInput{Query: "now"})})},
	))
	k.parentTools = []chat.Tool{agenttool.AgentTool[researchInput]("Clocker", agenttool.ToolOptions{Name: "clock"})}
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{
			{Name: "Assistant", New: func() agent.Agent { return &assistant{k: k} }, Public: true},
			{Name: "Clocker", New: func() agent.Agent { return &clocker{} }},
		},
		Logger: k.logs.Logger(),
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			agenttool.Install(rt, agenttool.Options{})
			return nil
		},
	})
	ctx := testCtx(t)
	a := getAssistant(t, env, "c1")
	w := dial(t, env, "assistant/c1")
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
	// An approval is not what this call waits for.
	w.send(map[string]any{"type": wire.AgentToolApproval, "runId": runID, "toolCallId": call, "approved": true})
	w.waitRaw(ctx, "the refusal", func(s string) bool { return strings.Contains(s, "tool_call_not_waiting") })
	w.send(map[string]any{"type": wire.AgentToolResult, "runId": runID, "toolCallId": call, "output": map[string]any{"time": "10:42"}})
	res := <-done
	if res.Outcome != chat.OutcomeCompleted || !strings.Contains(res.Text(), `the time is {\"time\":\"10:42\"}`) {
		t.Fatalf("parent turn %+v", res)
	}
	w.waitFrames(ctx, "the run's end", terminated(runID))
}

// TestDetachedWaitIsNotSilence: a detached run whose child waits for an
// approval is not given up by its no-progress budget however long the
// wait; the approval resumes it, the answer counts as a signal, and the run
// completes.
func TestDetachedWaitIsNotSilence(t *testing.T) {
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
	env := detStart(t, k, "")
	d := detWatch(t, env)
	ctx := detCtx(t)
	p := detParentOf(t, env, "pw")
	detDispatch(t, ctx, p, "DetWorker", "w1", agenttool.DetachedOptions{OnFinish: "OnDone", NoProgressBudget: 40 * time.Second})
	d.wait(t, ctx, "the run's wait for input", diag.ChannelAgentTool, "waiting", detAttr("runId", "w1"))
	for range 4 { // ticks at 5, 20, 50, 170 s: 170 s of waiting
		detTickNext(t, ctx, k, d, p)
	}
	if r := getRun(t, p, "w1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("a run waiting for input was given up: %s (%s)", r.Status, r.Reason)
	}
	if err := agenttool.AnswerAgentToolApproval(ctx, p, "w1", "call_pub", true, ""); err != nil {
		t.Fatal(err)
	}
	call := k.waitCall(t, ctx, "done")
	if call.Run.RunID != "w1" || call.Result.Status != agenttool.StatusCompleted || !strings.Contains(call.Result.Summary, "published after approval") {
		t.Fatalf("finish = %+v", call)
	}
}
