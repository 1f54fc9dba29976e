package mcpserver_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/teststore"
	"github.com/agentry/agentry/mcpserver"
	"github.com/agentry/agentry/server"
)

// Boss is a public chat class whose one agent tool, ask, runs a Worker.
type Boss struct{ chat.Base }

// Question is ask's input.
type Question struct {
	Q string `json:"q"`
}

// Tools returns ask.
func (b *Boss) Tools() []chat.Tool {
	return []chat.Tool{agenttool.AgentTool[Question]("Worker", agenttool.ToolOptions{Name: "ask", Description: "Ask a worker."})}
}

// Worker answers with the identity its turn runs for.
type Worker struct{ chat.Base }

// OnChatMessage writes the caller's identity.
func (w *Worker) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	id, _ := agent.IdentityFrom(ctx)
	return t.WriteText(fmt.Sprintf("answered for %v", id))
}

// startAuth serves Boss and Worker with an Authenticate hook that knows
// one bearer token, alice's.
func startAuth(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	rt := teststore.NewRuntime(t, agent.Options{IdleTimeout: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	chat.Configure(rt, chat.Config{})
	agenttool.Install(rt, agenttool.Options{})
	rt.MustRegister(agent.Class{Name: "Boss", New: func() agent.Agent { return &Boss{} }, Public: true})
	rt.MustRegister(agent.Class{Name: "Worker", New: func() agent.Agent { return &Worker{} }})
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	front := server.New(server.Options{Runtime: rt, Authenticate: func(r *http.Request) (any, error) {
		if r.Header.Get("Authorization") == "Bearer alice-token" {
			return "alice", nil
		}
		return nil, &agent.HTTPError{Status: http.StatusUnauthorized, Message: "who are you?"}
	}})
	h := mcpserver.New(mcpserver.Options{Runtime: rt, Front: front, MaxBodyBytes: 64 << 10})
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		h.Close()
		hs.CloseClientConnections()
		hs.Close()
		front.Close()
	})
	return hs.URL + "/mcp"
}

func post(t testing.TB, url, body string, header map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

func TestAuthOriginAndLimits(t *testing.T) {
	url := startAuth(t)
	alice := map[string]string{"Authorization": "Bearer alice-token"}

	if code, body := post(t, url, initBody, nil); code != http.StatusUnauthorized || !strings.Contains(body, "who are you?") {
		t.Fatalf("no token: %d %s; want 401", code, body)
	}
	if code, _ := post(t, url, initBody, map[string]string{"Authorization": "Bearer alice-token", "Origin": "http://evil.example"}); code != http.StatusForbidden {
		t.Fatalf("another origin: %d; want 403", code)
	}
	big := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"` + strings.Repeat("x", 128<<10) + `"}}`
	if code, body := post(t, url, big, alice); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, `"code":-32600`) {
		t.Fatalf("oversized body: %d %s; want 413 with a JSON-RPC error", code, body)
	}
	for _, bad := range []string{`{`, `[]`, `{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":1}}`, `{"jsonrpc":"2.0","id":{},"method":"x"}`, "\x00\xff"} {
		code, body := post(t, url, bad, alice)
		if code >= 500 || !strings.Contains(body, `"error"`) {
			t.Fatalf("malformed %q: %d %s; want a JSON-RPC error", bad, code, body)
		}
	}

	// The caller's identity reaches the run's child.
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: headerTransport{h: http.Header{"Authorization": {"Bearer alice-token"}}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"q": "who?"}})
	if err != nil {
		t.Fatal(err)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; res.IsError || text != "answered for alice" {
		t.Fatalf("ask: %q (error %v); want the child to run for alice", text, res.IsError)
	}
}
