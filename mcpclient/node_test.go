package mcpclient_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/mcpclient"
)

// everything declares @modelcontextprotocol/server-everything over stdio.
func everything(name string) mcpclient.Server {
	return mcpclient.Server{
		Name:    name,
		Command: "node",
		Args:    []string{filepath.Join(testenv.MCPDir(), "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"), "stdio"},
	}
}

// tsServer starts test/mcp/http-server.mjs (the TypeScript SDK over
// streamable HTTP) and returns its URL and its process.
func tsServer(t *testing.T, token string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command("node", "http-server.mjs")
	cmd.Dir = testenv.MCPDir()
	cmd.Env = append(cmd.Environ(), "MCP_TOKEN="+token)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "READY ")
	if err != nil || !ok {
		t.Fatalf("http-server.mjs said %q, %v", line, err)
	}
	return url, cmd
}

// prelims sends on the returned channel each preliminary output of the
// stream id.
func prelims(t *testing.T, a chatter, id string) <-chan mcpclient.Progress {
	t.Helper()
	ch := make(chan mcpclient.Progress, 256)
	follow(t, a, id, func(c message.Chunk) {
		if c.Type == message.ChunkToolOutputAvailable && c.Preliminary != nil && *c.Preliminary {
			var p mcpclient.Progress
			_ = json.Unmarshal(c.Output, &p)
			select {
			case ch <- p:
			default:
			}
		}
	})
	return ch
}

func waitPrelim(t *testing.T, ctx context.Context, ch <-chan mcpclient.Progress) mcpclient.Progress {
	t.Helper()
	select {
	case p := <-ch:
		return p
	case <-ctx.Done():
		t.Fatal("no preliminary output arrived")
		return mcpclient.Progress{}
	}
}

// TestEverythingStdio: a chat agent uses the reference server-everything
// over stdio: text, structured content and an image; progress arrives as
// preliminary output; an approval is asked and answered; killing the
// server mid-call gives output-error while the chat goes on, and the
// client restarts the server and uses it again.
func TestEverythingStdio(t *testing.T) {
	testenv.RequireMCP(t)
	w := newWatcher()
	mc := newClient(t, w)
	ctx := testCtx(t)
	s := everything("ev")
	s.ToolApproval = map[string]chat.ApprovalFunc{"get-sum": chat.RequireApproval}
	if err := mc.AddServer(ctx, s); err != nil {
		t.Fatal(err)
	}
	st := w.wait(t, "ev", "tools listed", func(s mcpclient.ServerStatus) bool { return has(s.Tools, "ev_echo") })
	for _, want := range []string{"ev_get-structured-content", "ev_get-tiny-image", "ev_trigger-long-running-operation"} {
		if !has(st.Tools, want) {
			t.Fatalf("tools %v lack %s", st.Tools, want)
		}
	}
	r := newRig(t, mc)
	a := r.bot(t, "everything")

	res, err := a.SaveMessages(ctx, []message.Message{userMsg(`call ev_echo {"message":"hi"}`)})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("echo: %+v %v", res, err)
	}
	if p := toolParts(res.Message); len(p) != 1 || string(p[0].Output) != `"Echo: hi"` {
		t.Fatalf("echo part %+v", p)
	}

	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call ev_get-structured-content {"location":"Chicago"}`)})
	if err != nil {
		t.Fatal(err)
	}
	var weather struct {
		Temperature *float64 `json:"temperature"`
	}
	if p := toolParts(res.Message); len(p) != 1 || json.Unmarshal(p[0].Output, &weather) != nil || weather.Temperature == nil {
		t.Fatalf("structured part %+v, want structuredContent as output", p)
	}

	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call ev_get-tiny-image`)})
	if err != nil {
		t.Fatal(err)
	}
	if f := partsOf(res.Message, message.PartFile); len(f) != 1 || f[0].MediaType != "image/png" || !strings.HasPrefix(f[0].URL, "data:image/png;base64,iVBOR") {
		t.Fatalf("image file parts %+v", f)
	}

	// Approval per tool.
	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call ev_get-sum {"a":2,"b":3}`)})
	if err != nil || len(res.Waiting) != 1 || !res.Waiting[0].Approval {
		t.Fatalf("get-sum: %+v %v, want waiting for an approval", res, err)
	}
	cont, err := a.AddToolApprovalResponse(ctx, toolParts(res.Message)[0].ToolCallID, true, "", chat.AnswerOptions{AutoContinue: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WaitTurn(ctx, cont); err != nil {
		t.Fatal(err)
	}
	msgs := a.Messages()
	if p := toolParts(msgs[len(msgs)-1]); len(p) != 1 || !strings.Contains(string(p[0].Output), "5") {
		t.Fatalf("approved get-sum %+v", p)
	}

	// Progress as preliminary output, then cancel: the turn ends aborted.
	// (The wait is for the first three in order: a notification the
	// server sends right before its result may be handled after it and
	// is dropped, the final output being there.)
	id, err := a.SubmitMessages(ctx, []message.Message{userMsg(`call ev_trigger-long-running-operation {"duration":600,"steps":6000}`)}, chat.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pc := prelims(t, a, id)
	for i := 1; i <= 3; i++ {
		if p := waitPrelim(t, ctx, pc); p.Progress != float64(i) || p.Total != 6000 {
			t.Fatalf("preliminary output %d: %+v", i, p)
		}
	}
	if !a.CancelTurn(id) {
		t.Fatal("CancelTurn found no turn")
	}
	if res, err = a.WaitTurn(ctx, id); err != nil || res.Outcome != chat.OutcomeAborted {
		t.Fatalf("cancelled turn: %+v %v", res, err)
	}
	if st := mc.Status()[0]; !st.Connected || st.Sessions != 1 {
		t.Fatalf("status after the cancel %+v: want the same session", st)
	}

	// Kill the server mid-call.
	id, err = a.SubmitMessages(ctx, []message.Message{userMsg(`call ev_trigger-long-running-operation {"duration":600,"steps":6000}`)}, chat.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPrelim(t, ctx, prelims(t, a, id))
	pid := mc.Status()[0].PID
	if pid == 0 {
		t.Fatal("no PID for the stdio server")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	res, err = a.WaitTurn(ctx, id)
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn with the server killed: %+v %v", res, err)
	}
	if p := toolParts(res.Message); len(p) != 1 || p[0].State != message.StateOutputError {
		t.Fatalf("killed call %+v, want output-error", p)
	}
	if tx := partsOf(res.Message, message.PartText); len(tx) == 0 || !strings.Contains(tx[0].Text, "error=true") {
		t.Fatalf("the chat did not go on: %+v", res.Message.Parts)
	}

	// The client restarts the server.
	w.wait(t, "ev", "reconnected", func(s mcpclient.ServerStatus) bool { return s.Connected && s.Sessions >= 2 && len(s.Tools) > 0 })
	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call ev_echo {"message":"again"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if p := toolParts(res.Message); len(p) != 1 || string(p[0].Output) != `"Echo: again"` {
		t.Fatalf("echo after restart %+v", p)
	}

	// Close stops the server's process: no orphan.
	pid = mc.Status()[0].PID
	if err := mc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Fatalf("process %d after Close: %v, want it gone", pid, err)
	}
}

// TestTypeScriptHTTP: a chat agent uses an MCP server built with the
// TypeScript SDK over streamable HTTP, with a bearer token: calls,
// structuredContent, list_changed, progress, and the server killed
// mid-call.
func TestTypeScriptHTTP(t *testing.T) {
	testenv.RequireMCP(t)
	url, cmd := tsServer(t, "tok")
	w := newWatcher()
	mc := newClient(t, w)
	ctx := testCtx(t)
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "ts", URL: url, BearerToken: "wrong"}); err == nil {
		t.Fatal("a wrong bearer token connected")
	}
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "ts2", URL: url, BearerToken: "tok"}); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, mc)
	a := r.bot(t, "ts")

	res, err := a.SaveMessages(ctx, []message.Message{userMsg(`call ts2_greet {"name":"Ada"}`)})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("greet: %+v %v", res, err)
	}
	if p := toolParts(res.Message); len(p) != 1 || string(p[0].Output) != `"Hello, Ada!"` {
		t.Fatalf("greet part %+v", p)
	}
	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call ts2_report`)})
	if err != nil {
		t.Fatal(err)
	}
	if p := toolParts(res.Message); len(p) != 1 || string(p[0].Output) != `{"count":3,"ok":true}` {
		t.Fatalf("report part %+v, want structuredContent", p)
	}

	// list_changed.
	if _, err := a.SaveMessages(ctx, []message.Message{userMsg(`call ts2_add_tool`)}); err != nil {
		t.Fatal(err)
	}
	w.wait(t, "ts2", "ts2_added listed", func(s mcpclient.ServerStatus) bool { return has(s.Tools, "ts2_added") })
	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call ts2_added`)})
	if err != nil {
		t.Fatal(err)
	}
	if p := toolParts(res.Message); len(p) != 1 || string(p[0].Output) != `"added works"` {
		t.Fatalf("added part %+v", p)
	}

	// Progress, then the server killed mid-call.
	id, err := a.SubmitMessages(ctx, []message.Message{userMsg(`call ts2_slow {"steps":3}`)}, chat.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pc := prelims(t, a, id)
	for i := 1; i <= 3; i++ {
		if p := waitPrelim(t, ctx, pc); p.Progress != float64(i) || p.Message == "" {
			t.Fatalf("preliminary output %d: %+v", i, p)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	res, err = a.WaitTurn(ctx, id)
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn with the server killed: %+v %v", res, err)
	}
	if p := toolParts(res.Message); len(p) != 1 || p[0].State != message.StateOutputError {
		t.Fatalf("killed call %+v, want output-error", p)
	}
	if tx := partsOf(res.Message, message.PartText); len(tx) == 0 || !strings.Contains(tx[0].Text, "error=true") {
		t.Fatalf("the chat did not go on: %+v", res.Message.Parts)
	}
}
