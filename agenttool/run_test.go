package agenttool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/wire"
)

// Groups G (TA) and H (AA): a chat child run through RunAgentTool.

// TestRunAgentToolCompleted covers scenarios 70, 76 and 103: the result,
// the live frames [started, chunk×N, finished] with one contiguous
// sequence, the child's inspection, and the child's stored chunks, which
// are exactly the forwarded bodies, numbered from 0.
func TestRunAgentToolCompleted(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p70")
	ws := dial(t, env, "assistant/p70")

	res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "HTTP/3"}, RunID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	// The result carries the child's usage, as its message records it.
	rmsgs := childOf[*researcher](t, env, a, "Researcher", "r1").Messages()
	rusage := chat.TreeUsageOf(rmsgs[len(rmsgs)-1])
	if rusage.TotalTokens == 0 {
		t.Fatalf("the child recorded no usage: %s", rmsgs[len(rmsgs)-1].Metadata)
	}
	jsonEq(t, res, agenttool.Result{RunID: "r1", AgentType: "Researcher", Status: agenttool.StatusCompleted, Summary: "Findings for HTTP/3", Usage: &rusage})

	fs := framesOf(ws.waitFrames(ctx, "r1 terminal", terminated("r1")), "r1")
	checkSequences(t, fs)
	last := fs[len(fs)-1]
	if last.Event.Kind != "finished" || last.Event.Summary == nil || *last.Event.Summary != "Findings for HTTP/3" {
		t.Fatalf("terminal = %+v", last)
	}
	if got := textOf(fs); got != "Findings for HTTP/3" {
		t.Fatalf("forwarded text = %q", got)
	}
	for _, f := range fs {
		if f.ParentToolCallID != "" || f.Replay {
			t.Fatalf("unbound live frame has parentToolCallId/replay: %+v", f)
		}
	}
	if st := fs[0].Event; st.AgentType != "Researcher" || st.Order == nil || *st.Order != 0 {
		t.Fatalf("started = %+v", st)
	}

	insp, err := agenttool.InspectAgentToolRun(ctx, a, "r1")
	if err != nil || insp == nil {
		t.Fatalf("inspect = %v, %v", insp, err)
	}
	if insp.Status != agenttool.StatusCompleted || insp.Summary != "Findings for HTTP/3" || insp.RequestID == "" || insp.CompletedAt == nil {
		t.Fatalf("inspection = %+v", insp)
	}
	child := childOf[*researcher](t, env, a, "Researcher", "r1")
	chunks, err := child.StreamChunks(ctx, insp.RequestID, -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) != len(fs)-2 {
		t.Fatalf("%d stored chunks, %d forwarded", len(chunks), len(fs)-2)
	}
	for i, c := range chunks {
		if c.Seq != i || fs[i+1].Event.Body != c.Body {
			t.Fatalf("stored chunk %d (seq %d) %s != forwarded %s", i, c.Seq, c.Body, fs[i+1].Event.Body)
		}
		var one map[string]any
		if err := json.Unmarshal([]byte(c.Body), &one); err != nil {
			t.Fatalf("chunk %d is not a single chunk object: %s", i, c.Body)
		}
	}
	after, _ := child.StreamChunks(ctx, insp.RequestID, 0)
	jsonEq(t, after, chunks[1:])

	// The child's transcript: the formatted input, then the answer.
	msgs := child.Messages()
	if len(msgs) != 2 || msgs[0].ID != "agent-tool-r1-input" || msgs[0].Parts[0].Text != "{\n  \"query\": \"HTTP/3\"\n}" ||
		chat.MessageText(msgs[1]) != "Findings for HTTP/3" {
		t.Fatalf("child transcript = %+v", msgs)
	}
	if fin := k.rec.finishesOf("r1"); len(fin) != 1 || fin[0].Result.Status != agenttool.StatusCompleted {
		t.Fatalf("finish hooks = %+v", fin)
	}
}

// TestChildWithoutText covers scenario 71: a child that streams no text
// completes with an empty summary.
func TestChildWithoutText(t *testing.T) {
	k := newKit()
	k.researcher = scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{})))
	env := startKit(t, k, agenttool.Options{})
	a := getAssistant(t, env, "p71")
	res, err := agenttool.RunAgentTool(testCtx(t), a, "Researcher", agenttool.RunOptions{Input: "quiet"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != agenttool.StatusCompleted || res.Summary != "" || res.Output != nil {
		t.Fatalf("result = %+v", res)
	}
}

// TestWorkflowChildOutput covers scenarios 72 and 120 with the seed's
// Extractor: output from the child's own table, summary from the hook; the
// output is stored with the run, so it survives the table row and a second
// dispatch returns the same result.
func TestWorkflowChildOutput(t *testing.T) {
	k := newKit()
	k.extractor = extractorModel("Go", "Rust")
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p72")
	res, err := agenttool.RunAgentTool(ctx, a, "Extractor", agenttool.RunOptions{Input: map[string]string{"doc": "Go and Rust"}, RunID: "x1"})
	if err != nil {
		t.Fatal(err)
	}
	child := childOf[*extractor](t, env, a, "Extractor", "x1")
	xusage := chat.TreeUsageOf(child.Messages()[len(child.Messages())-1])
	want := agenttool.Result{RunID: "x1", AgentType: "Extractor", Status: agenttool.StatusCompleted, Summary: "Extraction complete",
		Output: must[json.RawMessage](t)(json.Marshal(extraction{Entities: []string{"Go", "Rust"}, Count: 2})), Usage: &xusage}
	jsonEq(t, res, want)
	if txt := chat.MessageText(child.Messages()[len(child.Messages())-1]); txt != "" {
		t.Fatalf("the workflow child wrote text %q", txt)
	}
	// The application forgets its row: the run keeps its output.
	if err := child.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`DELETE FROM {extraction_runs}`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	insp, err := agenttool.InspectAgentToolRun(ctx, a, "x1")
	if err != nil || insp == nil {
		t.Fatal(insp, err)
	}
	jsonEq(t, insp.Output, want.Output)
	again, err := agenttool.RunAgentTool(ctx, a, "Extractor", agenttool.RunOptions{Input: "other", RunID: "x1"})
	if err != nil {
		t.Fatal(err)
	}
	jsonEq(t, again, want)
}

// TestIdempotentRunID covers scenario 119: the same run id with a
// different input returns the first result and never starts a second
// child turn.
func TestIdempotentRunID(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p119")
	first, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "only once"}, RunID: "same"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "changed input"}, RunID: "same"})
	if err != nil {
		t.Fatal(err)
	}
	jsonEq(t, second, first)
	if first.Summary != "Findings for only once" {
		t.Fatalf("first = %+v", first)
	}
	child := childOf[*researcher](t, env, a, "Researcher", "same")
	users := 0
	for _, m := range child.Messages() {
		if m.Role == message.RoleUser {
			users++
			if !strings.Contains(m.Parts[0].Text, "only once") {
				t.Fatalf("user message %q", m.Parts[0].Text)
			}
		}
	}
	if users != 1 {
		t.Fatalf("child has %d user messages, want 1", users)
	}
	if n := k.rec.startCount(); n != 1 {
		t.Fatalf("%d start hooks, want 1", n)
	}
}

// failingResearcher fails the stream of queries containing "fail", with the
// query as a public error text.
func failingResearcher() model.Model {
	return echoResearcher(scripted.WithRules(scripted.Rule{Match: scripted.LastUserContains("fail"), Reply: func(req *model.Request) scripted.Reply {
		var in researchInput
		_ = json.Unmarshal([]byte(scripted.LastUserText(req)), &in)
		return scripted.Reply{scripted.Text("working"), scripted.Fail(agent.Publicf("%s", in.Query))}
	}}))
}

// TestChildStreamError covers scenario 121 (and 80): a child stream error
// is the run's error, with the message, an error event and a finish hook.
func TestChildStreamError(t *testing.T) {
	k := newKit()
	k.researcher = failingResearcher()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p121")
	ws := dial(t, env, "assistant/p121")
	res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "model stream failed"}, RunID: "bad"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != agenttool.StatusError || !strings.Contains(res.Error, "model stream failed") {
		t.Fatalf("result = %+v", res)
	}
	fs := framesOf(ws.waitFrames(ctx, "error frame", terminated("bad")), "bad")
	checkSequences(t, fs)
	if last := fs[len(fs)-1].Event; last.Kind != "error" || !strings.Contains(last.Error, "model stream failed") {
		t.Fatalf("terminal = %+v", last)
	}
	if row := getRun(t, a, "bad"); row.Status != agenttool.StatusError || row.Error != res.Error {
		t.Fatalf("row = %+v", row)
	}
	if fin := k.rec.finishesOf("bad"); len(fin) != 1 || fin[0].Result.Status != agenttool.StatusError {
		t.Fatalf("finish hooks = %+v", fin)
	}
	insp, _ := agenttool.InspectAgentToolRun(ctx, a, "bad")
	if insp == nil || insp.Status != agenttool.StatusError || !strings.Contains(insp.Error, "model stream failed") {
		t.Fatalf("inspection = %+v", insp)
	}
}

// TestConcurrentFailingAndHealthy covers scenarios 81 and 126: a failing
// and a healthy run at the same time keep their own outcomes.
func TestConcurrentFailingAndHealthy(t *testing.T) {
	k := newKit()
	k.researcher = failingResearcher()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p81")
	type out struct {
		res agenttool.Result
		err error
	}
	ra, rb := make(chan out, 1), make(chan out, 1)
	go func() {
		r, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "run A failed"}, RunID: "A"})
		ra <- out{r, err}
	}()
	go func() {
		r, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "B"}, RunID: "B"})
		rb <- out{r, err}
	}()
	A, B := <-ra, <-rb
	if A.err != nil || B.err != nil {
		t.Fatal(A.err, B.err)
	}
	if A.res.Status != agenttool.StatusError || !strings.Contains(A.res.Error, "run A failed") {
		t.Fatalf("A = %+v", A.res)
	}
	if B.res.Status != agenttool.StatusCompleted || B.res.Error != "" || B.res.Summary != "Findings for B" {
		t.Fatalf("B = %+v", B.res)
	}
}

// heldKit is a kit whose Researcher streams "Hello world from the child"
// one event per tick of a fake clock.
func heldKit() (*kit, *clockwork.FakeClock) {
	k := newKit()
	fake := clockwork.NewFakeClock()
	k.researcher = heldModel(fake, scripted.Always(scripted.Reply{scripted.Text("Hello world from the child")}))
	return k, fake
}

// waitForwarding returns once the parent forwards the run's chunks, that
// is, once RunAgentTool follows the child's stream.
func waitForwarding(t *testing.T, ctx context.Context, ws *wsClient, runID string) {
	t.Helper()
	ws.waitFrames(ctx, "a chunk of "+runID, func(fs []agenttool.Frame) bool {
		for _, f := range framesOf(fs, runID) {
			if f.Event.Kind == "chunk" {
				return true
			}
		}
		return false
	})
}

type runOut struct {
	res agenttool.Result
	err error
}

func goRun(ctx context.Context, a agent.Agent, class string, o agenttool.RunOptions) chan runOut {
	ch := make(chan runOut, 1)
	go func() {
		r, err := agenttool.RunAgentTool(ctx, a, class, o)
		ch <- runOut{r, err}
	}()
	return ch
}

func recv(t *testing.T, ctx context.Context, ch chan runOut) agenttool.Result {
	t.Helper()
	select {
	case o := <-ch:
		if o.err != nil {
			t.Fatal(o.err)
		}
		return o.res
	case <-ctx.Done():
		t.Fatal("timed out waiting for the run")
	}
	return agenttool.Result{}
}

// TestAbortByContext covers scenario 127: canceling the ctx given to
// RunAgentTool mid-stream ends the run aborted with the cause's text; the
// registry row is aborted, the child's turn was aborted, and the finish
// hook fires once.
func TestAbortByContext(t *testing.T) {
	k, fake := heldKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p127")
	ws := dial(t, env, "assistant/p127")
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	out := goRun(runCtx, a, "Researcher", agenttool.RunOptions{Input: "x", RunID: "ab"})
	waitHeld(t, ctx, fake, 1)
	waitForwarding(t, ctx, ws, "ab")
	cancel(errors.New("test abort"))
	res := recv(t, ctx, out)
	if res.Status != agenttool.StatusAborted || res.Error != "test abort" {
		t.Fatalf("result = %+v", res)
	}
	if row := getRun(t, a, "ab"); row.Status != agenttool.StatusAborted || row.Error != "test abort" {
		t.Fatalf("row = %+v", row)
	}
	insp, _ := agenttool.InspectAgentToolRun(ctx, a, "ab")
	if insp == nil || insp.Status != agenttool.StatusAborted {
		t.Fatalf("child inspection = %+v", insp)
	}
	child := childOf[*researcher](t, env, a, "Researcher", "ab")
	turn, err := child.WaitTurn(ctx, insp.RequestID)
	if err != nil || turn.Outcome != chat.OutcomeAborted {
		t.Fatalf("child turn = %+v, %v", turn, err)
	}
	fs := framesOf(ws.waitFrames(ctx, "aborted frame", terminated("ab")), "ab")
	checkSequences(t, fs)
	if last := fs[len(fs)-1].Event; last.Kind != "aborted" || last.Reason != "test abort" {
		t.Fatalf("terminal = %+v", last)
	}
	if fin := k.rec.finishesOf("ab"); len(fin) != 1 || fin[0].Result.Status != agenttool.StatusAborted {
		t.Fatalf("finish hooks = %+v", fin)
	}
}

// TestCancelAgentToolAwaited covers scenarios 74 and 131 and deliberate
// difference 5: canceling an awaited run records aborted with the reason
// and fires the finish hook once; canceling again, or canceling a finished
// run, does nothing.
func TestCancelAgentToolAwaited(t *testing.T) {
	k, fake := heldKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p131")
	ws := dial(t, env, "assistant/p131")
	out := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: "x", RunID: "c1"})
	waitHeld(t, ctx, fake, 1)
	waitForwarding(t, ctx, ws, "c1")
	if err := agenttool.CancelAgentTool(ctx, a, "c1", "stop"); err != nil {
		t.Fatal(err)
	}
	res := recv(t, ctx, out)
	if res.Status != agenttool.StatusAborted || res.Error != "stop" {
		t.Fatalf("result = %+v", res)
	}
	if err := agenttool.CancelAgentTool(ctx, a, "c1", "again"); err != nil {
		t.Fatal(err)
	}
	if row := getRun(t, a, "c1"); row.Status != agenttool.StatusAborted || row.Error != "stop" {
		t.Fatalf("row = %+v", row)
	}
	insp, _ := agenttool.InspectAgentToolRun(ctx, a, "c1")
	if insp == nil || insp.Status != agenttool.StatusAborted {
		t.Fatalf("child inspection = %+v", insp)
	}
	if fin := k.rec.finishesOf("c1"); len(fin) != 1 || fin[0].Result.Error != "stop" {
		t.Fatalf("finish hooks = %+v", fin)
	}

	// A finished run is never rewritten.
	stop := pump(fake)
	defer stop()
	if _, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: "y", RunID: "c2"}); err != nil {
		t.Fatal(err)
	}
	if err := agenttool.CancelAgentTool(ctx, a, "c2", "late"); err != nil {
		t.Fatal(err)
	}
	if row := getRun(t, a, "c2"); row.Status != agenttool.StatusCompleted || row.Error != "" {
		t.Fatalf("late cancel rewrote the row: %+v", row)
	}
	if fin := k.rec.finishesOf("c2"); len(fin) != 1 {
		t.Fatalf("finish hooks = %+v", fin)
	}
	// Canceling an unknown run is a no-op.
	if err := agenttool.CancelAgentTool(ctx, a, "nope", ""); err != nil {
		t.Fatal(err)
	}
}

// TestChildChunksForwardedVerbatim covers scenarios 77, 78, 104 and 105:
// whatever the child writes into its turn — tool output, progress and
// milestone data parts — reaches the parent's clients as is.
func TestChildChunksForwardedVerbatim(t *testing.T) {
	k := newKit()
	written := []message.Chunk{
		message.ToolInputAvailable("t1", "lookup", json.RawMessage(`{"q":1}`)),
		message.ToolOutputAvailable("t1", json.RawMessage(`{"hits":3}`)),
		message.Data("agent-progress", "", json.RawMessage(`{"fraction":0.5,"phase":"reading"}`), true),
		message.Data("agent-milestone", "", json.RawMessage(`{"name":"sources-gathered","sequence":0,"at":1000}`), false),
	}
	k.middle = func(ctx context.Context, self agent.Agent, t *chat.Turn) error {
		for _, c := range written {
			if err := t.Write(c); err != nil {
				return err
			}
		}
		return t.WriteText("done")
	}
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p77")
	ws := dial(t, env, "assistant/p77")
	res, err := agenttool.RunAgentTool(ctx, a, "Middle", agenttool.RunOptions{Input: "go", RunID: "v"})
	if err != nil || res.Status != agenttool.StatusCompleted || res.Summary != "done" {
		t.Fatalf("result = %+v, %v", res, err)
	}
	fs := framesOf(ws.waitFrames(ctx, "terminal", terminated("v")), "v")
	checkSequences(t, fs)
	bodies := map[string]bool{}
	for _, f := range fs {
		bodies[f.Event.Body] = true
	}
	for _, c := range written {
		body, _ := json.Marshal(c)
		if !bodies[string(body)] {
			t.Errorf("body %s not forwarded; frames:\n%s", body, dumpFrames(fs))
		}
	}
}

// TestUnrelatedChildErrorDoesNotFailRun covers scenarios 79 and 122 in Go
// terms: while a run streams, a client of the child sends a malformed
// chat request and gets an error frame; the run still completes cleanly.
func TestUnrelatedChildErrorDoesNotFailRun(t *testing.T) {
	k, fake := heldKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p79")
	out := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: "x", RunID: "u1"})
	waitHeld(t, ctx, fake, 1)
	child := dial(t, env, "assistant/p79/sub/researcher/u1")
	child.send(map[string]any{"type": wire.ChatRequest, "id": "bad1", "init": map[string]any{"method": "POST", "body": "{not json"}})
	child.waitRaw(ctx, "the error answer", func(s string) bool { return strings.Contains(s, `"bad1"`) && strings.Contains(s, `"error":true`) })
	stop := pump(fake)
	defer stop()
	res := recv(t, ctx, out)
	if res.Status != agenttool.StatusCompleted || res.Error != "" || res.Summary != "Hello world from the child" {
		t.Fatalf("result = %+v", res)
	}
}

// TestStartFailureLeavesNoActiveRow: a class that is not a chat agent can
// not be a child; the run ends in error instead of staying "starting"
// (the reference leaves such rows starting, §4.5/§10.16).
func TestStartFailureLeavesNoActiveRow(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p-plain")
	res, err := agenttool.RunAgentTool(ctx, a, "Plain", agenttool.RunOptions{Input: "x", RunID: "pl"})
	if err == nil && res.Status == agenttool.StatusCompleted {
		t.Fatalf("a non-chat child completed: %+v", res)
	}
	if row, ok, _ := agenttool.GetAgentToolRun(ctx, a, "pl"); ok && row.Status.Active() {
		t.Fatalf("row left active: %+v", row)
	}
	if _, err := agenttool.RunAgentTool(ctx, a, "NoSuchClass", agenttool.RunOptions{RunID: "z"}); !errors.Is(err, agent.ErrUnknownClass) {
		t.Fatalf("unknown class: %v", err)
	}
}

// TestCancelDuringDispatch: a cancel that arrives while the run is being
// dispatched (the row is written, the child is starting, RunAgentTool does
// not follow the stream yet) ends the run like any other cancel: aborted
// with the reason, the child's turn aborted, one finish hook, and
// CancelAgentTool returns once the run has ended. The children are held
// on a fake clock that never moves, so a child turn that was not canceled
// would never end.
func TestCancelDuringDispatch(t *testing.T) {
	k, _ := heldKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p-window")
	canceled := make(chan error, 1)
	k.onStart = func(run agenttool.Run) {
		go func() { canceled <- agenttool.CancelAgentTool(ctx, a, run.RunID, "early") }()
	}
	for i := 0; i < 10; i++ {
		id := fmt.Sprint("w", i)
		res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: "x", RunID: id})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != agenttool.StatusAborted || res.Error != "early" {
			t.Fatalf("%s: result = %+v", id, res)
		}
		select {
		case err := <-canceled:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("CancelAgentTool did not return")
		}
		insp, _ := agenttool.InspectAgentToolRun(ctx, a, id)
		if insp == nil || insp.Status != agenttool.StatusAborted {
			t.Fatalf("%s: child inspection = %+v", id, insp)
		}
		if fin := k.rec.finishesOf(id); len(fin) != 1 || fin[0].Result.Status != agenttool.StatusAborted {
			t.Fatalf("%s: finish hooks = %+v", id, fin)
		}
	}
}

// TestConcurrentDispatchOfOneRunID: two dispatches of the same new run id
// at once start one child turn, and both callers get its result.
func TestConcurrentDispatchOfOneRunID(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p-twice")
	for i := 0; i < 5; i++ {
		id := fmt.Sprint("t", i)
		o1 := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "one"}, RunID: id})
		o2 := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "two"}, RunID: id})
		r1, r2 := recv(t, ctx, o1), recv(t, ctx, o2)
		if r1.Status != agenttool.StatusCompleted {
			t.Fatalf("%s: first = %+v", id, r1)
		}
		jsonEq(t, r2, r1)
		child := childOf[*researcher](t, env, a, "Researcher", id)
		if n := len(child.Messages()); n != 2 {
			t.Fatalf("%s: child has %d messages", id, n)
		}
	}
}
