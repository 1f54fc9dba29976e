package mcpclient_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/mcpclient"
)

// goServer is an MCP server built with the Go SDK, served over streamable
// HTTP on 127.0.0.1.
type goServer struct {
	srv      *mcp.Server
	http     *httptest.Server
	started  chan string // the slow tool started (its progress token)
	release  chan struct{}
	canceled chan struct{} // the slow tool saw its context end
	auth     chan string   // Authorization headers seen
}

type echoIn struct {
	Text string `json:"text"`
}

type weather struct {
	Temperature float64 `json:"temperature"`
	Conditions  string  `json:"conditions"`
}

func newGoServer(t *testing.T) *goServer {
	t.Helper()
	g := &goServer{
		started:  make(chan string, 4),
		release:  make(chan struct{}),
		canceled: make(chan struct{}, 4),
		auth:     make(chan string, 64),
	}
	g.srv = mcp.NewServer(&mcp.Implementation{Name: "go-test", Version: "1"}, nil)
	mcp.AddTool(g.srv, &mcp.Tool{Name: "echo", Description: "Echoes text."}, func(ctx context.Context, req *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo: " + in.Text}}}, nil, nil
	})
	mcp.AddTool(g.srv, &mcp.Tool{Name: "weather", Description: "Structured weather."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, weather, error) {
		return nil, weather{Temperature: 21.5, Conditions: "sunny"}, nil
	})
	mcp.AddTool(g.srv, &mcp.Tool{Name: "picture", Description: "An image and a resource."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: "here it is"},
			&mcp.ImageContent{Data: []byte("PNGDATA"), MIMEType: "image/png"},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "mem://notes.txt", MIMEType: "text/plain", Text: "notes"}},
		}}, nil, nil
	})
	mcp.AddTool(g.srv, &mcp.Tool{Name: "fail", Description: "Always fails."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "disk on fire"}}}, nil, nil
	})
	mcp.AddTool(g.srv, &mcp.Tool{Name: "slow", Description: "Reports progress, then waits."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		tok := req.Params.GetProgressToken()
		for i := 1; i <= 3; i++ {
			if tok != nil {
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: 3, Message: "step"}); err != nil {
					return nil, nil, err
				}
			}
		}
		s, _ := tok.(string)
		g.started <- s
		select {
		case <-g.release:
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slow done"}}}, nil, nil
		case <-ctx.Done():
			g.canceled <- struct{}{}
			return nil, nil, ctx.Err()
		}
	})
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server { return g.srv }, nil)
	g.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case g.auth <- r.Header.Get("Authorization"):
		default:
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		g.http.CloseClientConnections() // the client's standalone SSE stream
		g.http.Close()
		for ss := range g.srv.Sessions() {
			_ = ss.Close()
		}
	})
	return g
}

func newClient(t *testing.T, w *watcher) *mcpclient.Client {
	t.Helper()
	opts := mcpclient.Options{MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	if w != nil {
		opts.OnChange = w.onChange
	}
	mc := mcpclient.New(opts)
	t.Cleanup(func() { _ = mc.Close() })
	return mc
}

// TestGoServerTools: a chat agent calls an MCP server's tools over
// streamable HTTP: prefixed names, the schema passed through, text as the
// output, structuredContent as the output, image and resource as file
// parts, isError as output-error, and the bearer token sent.
func TestGoServerTools(t *testing.T) {
	g := newGoServer(t)
	mc := newClient(t, nil)
	ctx := testCtx(t)
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "go", URL: g.http.URL, BearerToken: "s3cret"}); err != nil {
		t.Fatal(err)
	}
	names := map[string]chat.Tool{}
	for _, tl := range mc.Tools() {
		names[tl.Name] = tl
	}
	for _, want := range []string{"go_echo", "go_weather", "go_picture", "go_fail", "go_slow"} {
		if _, ok := names[want]; !ok {
			t.Fatalf("tools %v lack %s", names, want)
		}
	}
	var schema struct {
		Properties map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(names["go_echo"].Spec().InputSchema, &schema); err != nil || schema.Properties["text"] == nil {
		t.Fatalf("go_echo schema %s: want the server's, with property text", names["go_echo"].Spec().InputSchema)
	}
	if got := <-g.auth; got != "Bearer s3cret" {
		t.Fatalf("Authorization %q, want the bearer token", got)
	}

	r := newRig(t, mc)
	a := r.bot(t, "tools")

	res, err := a.SaveMessages(ctx, []message.Message{userMsg(`call go_echo {"text":"hi"}`)})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("echo turn: %+v %v", res, err)
	}
	p := toolParts(res.Message)
	if len(p) != 1 || p[0].State != message.StateOutputAvailable || string(p[0].Output) != `"echo: hi"` {
		t.Fatalf("echo part %+v, want output \"echo: hi\"", p)
	}

	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call go_weather`)})
	if err != nil {
		t.Fatal(err)
	}
	p = toolParts(res.Message)
	var w weather
	if len(p) != 1 || json.Unmarshal(p[0].Output, &w) != nil || w.Conditions != "sunny" {
		t.Fatalf("weather part %+v, want structuredContent as output", p)
	}

	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call go_picture`)})
	if err != nil {
		t.Fatal(err)
	}
	files := partsOf(res.Message, message.PartFile)
	if len(files) != 2 || files[0].MediaType != "image/png" || files[0].URL != "data:image/png;base64,UE5HREFUQQ==" ||
		files[1].MediaType != "text/plain" || files[1].URL != "data:text/plain;base64,bm90ZXM=" {
		t.Fatalf("file parts %+v, want the image and the resource", files)
	}
	p = toolParts(res.Message)
	if len(p) != 1 || !strings.Contains(string(p[0].Output), "here it is") || !strings.Contains(string(p[0].Output), "image/png") {
		t.Fatalf("picture output %s", p[0].Output)
	}

	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call go_fail`)})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("fail turn: %+v %v", res, err)
	}
	p = toolParts(res.Message)
	if len(p) != 1 || p[0].State != message.StateOutputError || p[0].ErrorText != "disk on fire" {
		t.Fatalf("fail part %+v, want output-error \"disk on fire\"", p)
	}
	if !strings.Contains(partsOf(res.Message, message.PartText)[0].Text, "error=true") {
		t.Fatalf("the model did not see the error: %+v", res.Message.Parts)
	}
}

// TestGoServerProgressAndCancel: the server's progress notifications
// arrive as preliminary outputs while the call runs, the final output
// replaces them; cancelling the turn cancels the call on the server
// (notifications/cancelled).
func TestGoServerProgressAndCancel(t *testing.T) {
	g := newGoServer(t)
	mc := newClient(t, nil)
	ctx := testCtx(t)
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "go", URL: g.http.URL}); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, mc)
	a := r.bot(t, "progress")

	id, err := a.SubmitMessages(ctx, []message.Message{userMsg(`call go_slow`)}, chat.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	prelim := make(chan mcpclient.Progress, 16)
	follow(t, a, id, func(c message.Chunk) {
		if c.Type == message.ChunkToolOutputAvailable && c.Preliminary != nil && *c.Preliminary {
			var p mcpclient.Progress
			_ = json.Unmarshal(c.Output, &p)
			prelim <- p
		}
	})
	if tok := <-g.started; tok == "" {
		t.Fatal("the call carried no progress token")
	}
	for i := 1; i <= 3; i++ {
		select {
		case p := <-prelim:
			if p.Progress != float64(i) || p.Total != 3 || p.Message != "step" {
				t.Fatalf("preliminary output %d: %+v", i, p)
			}
		case <-ctx.Done():
			t.Fatalf("preliminary output %d did not arrive", i)
		}
	}
	close(g.release)
	res, err := a.WaitTurn(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if p := toolParts(res.Message); len(p) != 1 || string(p[0].Output) != `"slow done"` {
		t.Fatalf("final part %+v, want the final output", p)
	}

	// Cancel: a second server whose slow tool never finishes unless
	// cancelled.
	g2 := newGoServer(t)
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "go2", URL: g2.http.URL}); err != nil {
		t.Fatal(err)
	}
	id, err = a.SubmitMessages(ctx, []message.Message{userMsg(`call go2_slow`)}, chat.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	<-g2.started
	if !a.CancelTurn(id) {
		t.Fatal("CancelTurn found no turn")
	}
	select {
	case <-g2.canceled:
	case <-ctx.Done():
		t.Fatal("the server's handler was not cancelled")
	}
	res, err = a.WaitTurn(ctx, id)
	if err != nil || res.Outcome != chat.OutcomeAborted {
		t.Fatalf("cancelled turn: %+v %v", res, err)
	}
}

// TestGoServerTimeout: a call longer than the server's CallTimeout fails
// with a timeout error the model sees, and the server's handler is
// cancelled.
func TestGoServerTimeout(t *testing.T) {
	g := newGoServer(t)
	mc := newClient(t, nil)
	ctx := testCtx(t)
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "go", URL: g.http.URL, CallTimeout: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, mc)
	a := r.bot(t, "timeout")
	res, err := a.SaveMessages(ctx, []message.Message{userMsg(`call go_slow`)})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn: %+v %v", res, err)
	}
	p := toolParts(res.Message)
	if len(p) != 1 || p[0].State != message.StateOutputError || !strings.Contains(p[0].ErrorText, "timed out") {
		t.Fatalf("part %+v, want a timeout output-error", p)
	}
	<-g.canceled
}

// TestGoServerApproval: NeedsApproval per server and per tool: the call
// waits for the user's answer, runs once approved, and a denied one never
// reaches the server.
func TestGoServerApproval(t *testing.T) {
	g := newGoServer(t)
	mc := newClient(t, nil)
	ctx := testCtx(t)
	err := mc.AddServer(ctx, mcpclient.Server{Name: "go", URL: g.http.URL, NeedsApproval: chat.RequireApproval,
		ToolApproval: map[string]chat.ApprovalFunc{"weather": nil}})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, mc)
	a := r.bot(t, "approve")

	res, err := a.SaveMessages(ctx, []message.Message{userMsg(`call go_weather`)})
	if err != nil || len(res.Waiting) != 0 {
		t.Fatalf("weather (no approval per tool): %+v %v", res, err)
	}

	res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call go_echo {"text":"approved"}`)})
	if err != nil || len(res.Waiting) != 1 || !res.Waiting[0].Approval {
		t.Fatalf("echo turn: %+v %v, want waiting for an approval", res, err)
	}
	p := toolParts(res.Message)
	if len(p) != 1 || p[0].State != message.StateApprovalRequested {
		t.Fatalf("part %+v, want approval-requested", p)
	}
	cont, err := a.AddToolApprovalResponse(ctx, p[0].ToolCallID, true, "", chat.AnswerOptions{AutoContinue: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err = a.WaitTurn(ctx, cont)
	if err != nil {
		t.Fatal(err)
	}
	msgs := a.Messages()
	p = toolParts(msgs[len(msgs)-1])
	if len(p) != 1 || string(p[0].Output) != `"echo: approved"` {
		t.Fatalf("approved part %+v (turn %+v)", p, res)
	}
}

// TestListChangedAndReconnect: a tool added on the server appears after
// notifications/tools/list_changed; a server that goes away fails the
// call with an output-error while the chat goes on. (Reconnecting is
// tested with a stdio server, which the client restarts.)
func TestListChangedAndReconnect(t *testing.T) {
	g := newGoServer(t)
	w := newWatcher()
	mc := newClient(t, w)
	ctx := testCtx(t)
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "go", URL: g.http.URL}); err != nil {
		t.Fatal(err)
	}
	mcp.AddTool(g.srv, &mcp.Tool{Name: "late", Description: "Added later."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "late"}}}, nil, nil
	})
	w.wait(t, "go", "go_late listed", func(s mcpclient.ServerStatus) bool { return has(s.Tools, "go_late") })

	r := newRig(t, mc)
	a := r.bot(t, "gone")
	res, err := a.SaveMessages(ctx, []message.Message{userMsg(`call go_late`)})
	if err != nil || string(toolParts(res.Message)[0].Output) != `"late"` {
		t.Fatalf("late tool: %+v %v", res, err)
	}

	g.http.CloseClientConnections()
	g.http.Close()
	// The first call after the server went away fails on the wire; it
	// ends the session, so the next one fails at once as not connected.
	for i, want := range []string{"go/echo", mcpclient.ErrNotConnected.Error()} {
		if i == 1 {
			w.wait(t, "go", "disconnected", func(s mcpclient.ServerStatus) bool { return !s.Connected })
		}
		res, err = a.SaveMessages(ctx, []message.Message{userMsg(`call go_echo {"text":"x"}`)})
		if err != nil || res.Outcome != chat.OutcomeCompleted {
			t.Fatalf("turn %d with the server gone: %+v %v", i, res, err)
		}
		p := toolParts(res.Message)
		if len(p) != 1 || p[0].State != message.StateOutputError || !strings.Contains(p[0].ErrorText, want) {
			t.Fatalf("turn %d: part %+v, want output-error with %q", i, p, want)
		}
		if tx := partsOf(res.Message, message.PartText); len(tx) == 0 || !strings.Contains(tx[0].Text, "error=true") {
			t.Fatalf("turn %d did not go on to the model: %+v", i, res.Message.Parts)
		}
	}
	if s := mc.Status()[0]; s.Connected || s.LastError == nil {
		t.Fatalf("status %+v: want disconnected with the last error", s)
	}
}

// TestAddServerRefusesBadDeclarations covers the declaration checks.
func TestAddServerRefusesBadDeclarations(t *testing.T) {
	mc := newClient(t, nil)
	ctx := testCtx(t)
	for _, s := range []mcpclient.Server{
		{Name: "bad_name", URL: "http://127.0.0.1:1"},
		{Name: "", URL: "http://127.0.0.1:1"},
		{Name: "both", URL: "http://127.0.0.1:1", Command: "true"},
		{Name: "neither"},
	} {
		if err := mc.AddServer(ctx, s); err == nil {
			t.Errorf("AddServer(%+v) succeeded", s)
		}
	}
	g := newGoServer(t)
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "go", URL: g.http.URL}); err != nil {
		t.Fatal(err)
	}
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "go", URL: g.http.URL}); err == nil {
		t.Fatal("a second server named go was accepted")
	}
}
