package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// answerer is what the approval tests use of a chat agent.
type answerer interface {
	chatter
	AddToolApprovalResponse(ctx context.Context, toolCallID string, approved bool, reason string, opts chat.AnswerOptions) (string, error)
	AddToolOutput(ctx context.Context, toolCallID string, output json.RawMessage, errText string, opts chat.AnswerOptions) (string, error)
	StreamChunks(ctx context.Context, id string, afterSeq int) ([]chat.StreamChunk, error)
}

func getAnswerer(t *testing.T, r *rig, class, name string) answerer {
	t.Helper()
	a, ok := getChat(t, r.rt, class, name).(answerer)
	if !ok {
		t.Fatal("not an answerer")
	}
	return a
}

// approvalModel calls the tools the user names ("delete", "delete twice",
// "time") and, once it sees tool results, reports them.
func approvalModel() *scripted.Model {
	call := func(word string, steps ...scripted.Step) scripted.Rule {
		return scripted.Rule{Name: word, Match: scripted.LastUserContains(word), Reply: scripted.Always(steps)}
	}
	return scripted.New(scripted.WithRules(
		scripted.ReportToolResults(),
		call("delete twice", scripted.ToolCall("delete", map[string]any{"what": "a"}), scripted.ToolCall("delete", map[string]any{"what": "b"})),
		call("delete small", scripted.ToolCall("delete", map[string]any{"what": "small"})),
		call("delete", scripted.ToolCall("delete", map[string]any{"what": "runs"})),
		call("time", scripted.ToolCall("get_local_time", map[string]any{})),
	))
}

type deleteIn struct {
	What string `json:"what"`
}

// approvalKit is a chat class whose "delete" tool needs approval unless it
// deletes "small", and whose "get_local_time" is a client tool.
func approvalKit(deleted *atomic.Int64) *kit {
	del := chat.NewTool("delete", "Deletes things.", func(ctx context.Context, in deleteIn) (string, error) {
		deleted.Add(1)
		return "deleted " + in.What, nil
	}).WithApproval(chat.ApprovalIf(func(ctx context.Context, in deleteIn) bool { return in.What != "small" }))
	return &kit{model: approvalModel(), tools: []chat.Tool{del, chat.NewClientTool[struct{}]("get_local_time", "The user's local time.")}}
}

func lastAssistant(t *testing.T, a chatter) message.Message {
	t.Helper()
	as := assistants(a.Messages())
	if len(as) == 0 {
		t.Fatal("no assistant message")
	}
	return as[len(as)-1]
}

// TestApprovalApproved: a call that needs approval is not executed; the
// turn ends waiting with the part in approval-requested; approving it
// starts a continuation that runs the call once and lets the model answer
// with its result.
func TestApprovalApproved(t *testing.T) {
	var deleted atomic.Int64
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", approvalKit(&deleted))}})
	ctx := testCtx(t)
	a := getAnswerer(t, r, "Bot", "approve")
	res, err := a.SaveMessages(ctx, []message.Message{userMsg("please delete my runs")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != chat.OutcomeCompleted || len(res.Waiting) != 1 || !res.Waiting[0].Approval || res.Waiting[0].ApprovalID == "" {
		t.Fatalf("turn ended %s waiting %+v, want completed waiting for one approval", res.Outcome, res.Waiting)
	}
	if n := deleted.Load(); n != 0 {
		t.Fatalf("the tool ran %d times before its approval", n)
	}
	p := toolParts(lastAssistant(t, a))
	if len(p) != 1 || p[0].State != message.StateApprovalRequested || p[0].Approval == nil || p[0].Approval.ID != res.Waiting[0].ApprovalID {
		t.Fatalf("tool part %+v, want approval-requested", p)
	}
	cont, err := a.AddToolApprovalResponse(ctx, p[0].ToolCallID, true, "", chat.AnswerOptions{AutoContinue: true})
	if err != nil || cont == "" {
		t.Fatalf("approve: continuation %q, %v", cont, err)
	}
	res2, err := a.WaitTurn(ctx, cont)
	if err != nil || res2.Outcome != chat.OutcomeCompleted || len(res2.Waiting) != 0 {
		t.Fatalf("continuation: %+v %v", res2, err)
	}
	if n := deleted.Load(); n != 1 {
		t.Fatalf("the approved tool ran %d times, want 1", n)
	}
	m := lastAssistant(t, a)
	if len(assistants(a.Messages())) != 1 || m.ID != res.Message.ID {
		t.Fatalf("the continuation wrote a new message; want it to continue %s", res.Message.ID)
	}
	p = toolParts(m)
	if len(p) != 1 || p[0].State != message.StateOutputAvailable || string(p[0].Output) != `"deleted runs"` || p[0].Approval == nil || !*p[0].Approval.Approved {
		t.Fatalf("tool part after approval %+v", p)
	}
	if got := chat.MessageText(m); !strings.Contains(got, `[delete error=false "deleted runs"]`) {
		t.Fatalf("model's follow-up %q", got)
	}
	// The continuation's stream carries the call's output.
	chunks, err := a.StreamChunks(ctx, cont, -1)
	if err != nil {
		t.Fatal(err)
	}
	if !hasChunk(chunks, message.ChunkToolOutputAvailable) {
		t.Fatalf("continuation stream %v has no tool output", chunks)
	}
	// The answer is not taken twice.
	if _, err := a.AddToolApprovalResponse(ctx, p[0].ToolCallID, true, "", chat.AnswerOptions{AutoContinue: true}); !errors.Is(err, chat.ErrNotWaiting) {
		t.Fatalf("second approval: %v, want ErrNotWaiting", err)
	}
}

func hasChunk(chunks []chat.StreamChunk, typ string) bool {
	for _, c := range chunks {
		if strings.Contains(c.Body, `"type":"`+typ+`"`) {
			return true
		}
	}
	return false
}

// TestApprovalDenied: a denied call never runs, its part goes to
// output-denied (streamed as tool-output-denied), and the model reads the
// denial.
func TestApprovalDenied(t *testing.T) {
	var deleted atomic.Int64
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", approvalKit(&deleted))}})
	ctx := testCtx(t)
	a := getAnswerer(t, r, "Bot", "deny")
	res, err := a.SaveMessages(ctx, []message.Message{userMsg("delete my runs")})
	if err != nil || len(res.Waiting) != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	cont, err := a.AddToolApprovalResponse(ctx, res.Waiting[0].ToolCallID, false, "not now", chat.AnswerOptions{AutoContinue: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WaitTurn(ctx, cont); err != nil {
		t.Fatal(err)
	}
	if n := deleted.Load(); n != 0 {
		t.Fatalf("a denied tool ran %d times", n)
	}
	m := lastAssistant(t, a)
	if p := toolParts(m); len(p) != 1 || p[0].State != message.StateOutputDenied {
		t.Fatalf("tool part %+v, want output-denied", p)
	}
	if got := chat.MessageText(m); !strings.Contains(got, "[delete error=true") || !strings.Contains(got, message.ResultDenied+": not now") {
		t.Fatalf("model's follow-up %q, want the denial", got)
	}
	chunks, _ := a.StreamChunks(ctx, cont, -1)
	if !hasChunk(chunks, message.ChunkToolOutputDenied) {
		t.Fatalf("continuation stream has no tool-output-denied")
	}
}

// TestApprovalByInput: ApprovalIf decides per call; a call it waves
// through runs in the turn.
func TestApprovalByInput(t *testing.T) {
	var deleted atomic.Int64
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", approvalKit(&deleted))}})
	res, err := getAnswerer(t, r, "Bot", "small").SaveMessages(testCtx(t), []message.Message{userMsg("delete small")})
	if err != nil || len(res.Waiting) != 0 || deleted.Load() != 1 {
		t.Fatalf("%+v %v, ran %d", res.Waiting, err, deleted.Load())
	}
}

// TestApprovalBarrier: with two calls waiting, the first answer does not
// continue the turn; the second does, and both approved calls run.
func TestApprovalBarrier(t *testing.T) {
	var deleted atomic.Int64
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", approvalKit(&deleted))}})
	ctx := testCtx(t)
	a := getAnswerer(t, r, "Bot", "barrier")
	res, err := a.SaveMessages(ctx, []message.Message{userMsg("delete twice")})
	if err != nil || len(res.Waiting) != 2 {
		t.Fatalf("%+v %v", res.Waiting, err)
	}
	first, err := a.AddToolApprovalResponse(ctx, res.Waiting[0].ToolCallID, true, "", chat.AnswerOptions{AutoContinue: true})
	if err != nil || first != "" {
		t.Fatalf("first answer: continuation %q %v, want none", first, err)
	}
	if _, busy := a.BusyTurn(); busy {
		t.Fatal("a turn runs after the first of two answers")
	}
	second, err := a.AddToolApprovalResponse(ctx, res.Waiting[1].ToolCallID, true, "", chat.AnswerOptions{AutoContinue: true})
	if err != nil || second == "" {
		t.Fatalf("second answer: %q %v", second, err)
	}
	if _, err := a.WaitTurn(ctx, second); err != nil {
		t.Fatal(err)
	}
	if n := deleted.Load(); n != 2 {
		t.Fatalf("ran %d calls, want 2", n)
	}
}

// TestClientTool: a client tool's call is not executed; the turn ends
// waiting for its output, which continues the turn.
func TestClientTool(t *testing.T) {
	var deleted atomic.Int64
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", approvalKit(&deleted))}})
	ctx := testCtx(t)
	a := getAnswerer(t, r, "Bot", "client")
	res, err := a.SaveMessages(ctx, []message.Message{userMsg("what time is it")})
	if err != nil || len(res.Waiting) != 1 || res.Waiting[0].Approval || res.Waiting[0].ToolName != "get_local_time" {
		t.Fatalf("%+v %v", res.Waiting, err)
	}
	id := res.Waiting[0].ToolCallID
	if _, err := a.AddToolApprovalResponse(ctx, id, true, "", chat.AnswerOptions{}); !errors.Is(err, chat.ErrNotWaiting) {
		t.Fatalf("approving a client tool's call: %v, want ErrNotWaiting", err)
	}
	if _, err := a.AddToolOutput(ctx, "nope", json.RawMessage(`1`), "", chat.AnswerOptions{}); !errors.Is(err, chat.ErrUnknownToolCall) {
		t.Fatalf("unknown call: %v", err)
	}
	cont, err := a.AddToolOutput(ctx, id, json.RawMessage(`{"time":"10:42"}`), "", chat.AnswerOptions{AutoContinue: true})
	if err != nil || cont == "" {
		t.Fatalf("%q %v", cont, err)
	}
	if _, err := a.WaitTurn(ctx, cont); err != nil {
		t.Fatal(err)
	}
	if got := chat.MessageText(lastAssistant(t, a)); !strings.Contains(got, `[get_local_time error=false {"time":"10:42"}]`) {
		t.Fatalf("follow-up %q", got)
	}
}

// TestClientToolsFromBody: the request body's clientTools are offered to
// the model and wait for the client like declared ones; a bad list fails
// the turn with a clear error.
func TestClientToolsFromBody(t *testing.T) {
	m := scripted.New(scripted.WithRules(scripted.Rule{Match: scripted.LastUserContains("where"),
		Reply: func(req *model.Request) scripted.Reply {
			for _, s := range req.Tools {
				if s.Name == "get_location" {
					return scripted.Reply{scripted.ToolCall("get_location", map[string]any{"precise": true})}
				}
			}
			return scripted.Reply{scripted.Text("no location tool")}
		}}))
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", &kit{model: m})}})
	ctx := testCtx(t)
	a := getAnswerer(t, r, "Bot", "body")
	body := json.RawMessage(`{"clientTools":[{"name":"get_location","description":"where","parameters":{"type":"object","properties":{"precise":{"type":"boolean"}}}}]}`)
	id, err := a.SubmitMessages(ctx, []message.Message{userMsg("where am I")}, chat.SubmitOptions{Body: body})
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.WaitTurn(ctx, id)
	if err != nil || len(res.Waiting) != 1 || res.Waiting[0].ToolName != "get_location" {
		t.Fatalf("%+v %v", res, err)
	}
	bad := json.RawMessage(`{"clientTools":[{"name":"bad name!"}]}`)
	id, err = a.SubmitMessages(ctx, []message.Message{userMsg("where now")}, chat.SubmitOptions{Body: bad})
	if err != nil {
		t.Fatal(err)
	}
	res, err = a.WaitTurn(ctx, id)
	if err != nil || res.Outcome != chat.OutcomeError || !strings.Contains(res.Error, "client tool name") {
		t.Fatalf("bad clientTools: %+v %v", res, err)
	}
}

// TestApprovalAcrossRestart: a turn waiting for an approval stays waiting
// through a restart, and the answer given to the new process runs the
// call.
func TestApprovalAcrossRestart(t *testing.T) {
	var deleted atomic.Int64
	dir := t.TempDir()
	clk := clockwork.NewFakeClock()
	r := newRig(t, rigOptions{dir: dir, clock: clk, classes: []agent.Class{chatClass("Bot", approvalKit(&deleted))}})
	res, err := getAnswerer(t, r, "Bot", "restart").SaveMessages(testCtx(t), []message.Message{userMsg("delete my runs")})
	if err != nil || len(res.Waiting) != 1 {
		t.Fatalf("%+v %v", res.Waiting, err)
	}
	r.close()
	r2 := newRig(t, rigOptions{dir: dir, clock: clk, classes: []agent.Class{chatClass("Bot", approvalKit(&deleted))}})
	ctx := testCtx(t)
	a := getAnswerer(t, r2, "Bot", "restart")
	if p := toolParts(lastAssistant(t, a)); len(p) != 1 || p[0].State != message.StateApprovalRequested {
		t.Fatalf("after the restart the part is %+v, want approval-requested", p)
	}
	cont, err := a.AddToolApprovalResponse(ctx, res.Waiting[0].ToolCallID, true, "", chat.AnswerOptions{AutoContinue: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WaitTurn(ctx, cont); err != nil {
		t.Fatal(err)
	}
	if n := deleted.Load(); n != 1 {
		t.Fatalf("ran %d times, want 1", n)
	}
}
