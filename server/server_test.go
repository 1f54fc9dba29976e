package server_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/wire"
)

// Bad client input gets a clear agentry_error frame and the same
// connection keeps working afterwards; the server keeps serving.
func TestBadInputKeepsConnection(t *testing.T) {
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{counter.Class()},
		Server:  server.Options{MaxFrameBytes: 256},
	})
	c := dial(t, env, "/agents/counter/bad")
	c.handshake()

	cases := []struct {
		name string
		typ  websocket.MessageType
		data string
		code string
	}{
		{"malformed JSON", websocket.MessageText, `{"type":`, "bad_json"},
		{"not an object", websocket.MessageText, `[1,2,3]`, "bad_json"},
		{"plain text", websocket.MessageText, `hello`, "bad_json"},
		{"no type", websocket.MessageText, `{"id":"x"}`, "bad_frame"},
		{"null", websocket.MessageText, `null`, "bad_frame"},
		{"unknown type", websocket.MessageText, `{"type":"cf_agent_nonsense"}`, "unknown_type"},
		{"oversized", websocket.MessageText, `{"type":"rpc","id":"big","method":"get","args":["` + strings.Repeat("x", 1000) + `"]}`, "too_large"},
		{"oversized binary", websocket.MessageBinary, strings.Repeat("\x00", 300), "too_large"},
		{"invalid UTF-8", websocket.MessageText, "{\"type\":\"\xff\xfe\"}", "bad_utf8"},
		{"binary", websocket.MessageBinary, `{"type":"rpc","id":"b","method":"get","args":[]}`, "binary"},
		{"rpc without id", websocket.MessageText, `{"type":"rpc","method":"get","args":[]}`, "bad_rpc"},
		{"rpc args not an array", websocket.MessageText, `{"type":"rpc","id":"q","method":"get","args":{}}`, "bad_rpc"},
	}
	for _, tc := range cases {
		c.sendRaw(tc.typ, []byte(tc.data))
		f := c.next()
		if f["type"] != wire.Error || f["code"] != tc.code {
			t.Errorf("%s: got %v, want an agentry_error with code %s", tc.name, f, tc.code)
			continue
		}
		if msg, _ := f["error"].(string); msg == "" {
			t.Errorf("%s: error frame without a message: %v", tc.name, f)
		}
		// The same connection still answers RPC.
		if got := c.ok("get"); got != 0.0 {
			t.Fatalf("%s: get after bad input = %v", tc.name, got)
		}
	}
	// A frame exactly at the limit is accepted.
	pad := strings.Repeat("y", 256-len(`{"type":"rpc","id":"edge","method":"get","args":[""]}`))
	edge := `{"type":"rpc","id":"edge","method":"get","args":["` + pad + `"]}`
	if len(edge) != 256 {
		t.Fatalf("edge frame is %d bytes", len(edge))
	}
	c.sendRaw(websocket.MessageText, []byte(edge))
	if f := c.next(); f["id"] != "edge" || f["success"] != true {
		t.Fatalf("frame at the limit answered %v", f)
	}

	// The server still serves other connections.
	d := dial(t, env, "/agents/counter/bad")
	d.handshake()
	if got := d.ok("get"); got != 0.0 {
		t.Fatalf("new connection get = %v", got)
	}
}

// Routing over plain HTTP: unknown class 400, malformed agent paths 400,
// paths outside the prefix 404, an instance without OnRequest 404.
func TestHTTPRouting(t *testing.T) {
	env := startCounter(t)
	for _, tc := range []struct {
		path   string
		status int
	}{
		{"/agents/nope/x", http.StatusBadRequest},
		{"/agents/Counter/x", http.StatusBadRequest}, // routes are kebab-case, matched exactly
		{"/agents/counter", http.StatusBadRequest},
		{"/agents/counter/", http.StatusBadRequest},
		{"/agents/counter/sub", http.StatusBadRequest},
		{"/agents/counter/x/sub/counter", http.StatusBadRequest},
		{"/agents/counter/x/sub/nope/y", http.StatusBadRequest},
		{"/", http.StatusNotFound},
		{"/other/counter/x", http.StatusNotFound},
		{"/agentsx/counter/x", http.StatusNotFound},
		{"/agents/counter/x", http.StatusNotFound}, // Counter has no OnRequest
	} {
		if status, body := get(t, env, tc.path); status != tc.status {
			t.Errorf("GET %s = %d %q, want %d", tc.path, status, body, tc.status)
		}
	}
	// A WebSocket to an unknown class is refused before the upgrade.
	_, resp, err := tryDial(t, env, "/agents/nope/x")
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("dial to an unknown class: %v, %v", err, resp)
	}
	if ok, _ := env.RT.Exists(context.Background(), agent.Root("Counter", "nope")); ok {
		t.Error("a refused request created an instance")
	}
}

// The capnweb transport is accepted and closed at once with a 4xxx code.
func TestCapnwebRefused(t *testing.T) {
	env := startCounter(t)
	c := dial(t, env, "/agents/counter/cap?__agents_transport=capnweb")
	code, _ := c.closed()
	if code < 4000 || code > 4999 {
		t.Fatalf("capnweb closed with %d, want 4xxx", code)
	}
	if len(c.frames) != 0 {
		t.Errorf("capnweb connection got %d frames", len(c.frames))
	}
	if ok, _ := env.RT.Exists(context.Background(), agent.Root("Counter", "cap")); ok {
		t.Error("capnweb connection created the instance")
	}
}

// Authorize refusing: a WebSocket is accepted then closed with 4001 (or the
// CloseError's code), plain HTTP gets 401 (or the HTTPError's status), and
// nothing is created. Admitted requests work.
func TestAuthorize(t *testing.T) {
	h := newHooks()
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{hookedClass(h)},
		Server: server.Options{Authorize: func(r *http.Request, p agent.Path) error {
			switch r.URL.Query().Get("token") {
			case "good":
				if p.Leaf().Name == "locked" {
					return &agent.HTTPError{Status: http.StatusForbidden, Message: "locked"}
				}
				return nil
			case "banned":
				return &agent.CloseError{Code: 4003, Reason: "banned"}
			}
			return errors.New("no token")
		}},
	})
	c := dial(t, env, "/agents/hooked/auth?token=bad")
	if code, reason := c.closed(); code != 4001 {
		t.Fatalf("refused socket closed with %d %q, want 4001", code, reason)
	}
	if len(c.frames) != 0 {
		t.Errorf("refused socket got %d frames", len(c.frames))
	}
	c = dial(t, env, "/agents/hooked/auth?token=banned")
	if code, reason := c.closed(); code != 4003 || reason != "banned" {
		t.Fatalf("CloseError refusal closed with %d %q, want 4003 banned", code, reason)
	}
	if status, _ := get(t, env, "/agents/hooked/auth?token=bad"); status != http.StatusUnauthorized {
		t.Errorf("refused HTTP = %d, want 401", status)
	}
	if status, body := get(t, env, "/agents/hooked/locked?token=good"); status != http.StatusForbidden || !strings.Contains(body, "locked") {
		t.Errorf("HTTPError refusal = %d %q, want 403 locked", status, body)
	}
	if ok, _ := env.RT.Exists(context.Background(), agent.Root("Hooked", "auth")); ok {
		t.Fatal("refused requests created the instance")
	}
	if h.starts.Load() != 0 {
		t.Fatal("refused requests started an instance")
	}

	ok := dial(t, env, "/agents/hooked/auth?token=good&_pk=ok")
	ok.handshake()
	ok.expectType("welcome")
	if status, body := get(t, env, "/agents/hooked/auth/x?token=good"); status != http.StatusOK || !strings.Contains(body, "path=/x") {
		t.Errorf("admitted HTTP = %d %q", status, body)
	}
}

// An OnConnect error closes the socket (1011, or the CloseError's code)
// after the connect frames, and OnClose still runs.
func TestOnConnectRefuses(t *testing.T) {
	h := newHooks()
	env := startHooked(t, h)
	c := dial(t, env, "/agents/hooked/oc?deny=plain&_pk=plain")
	c.handshake()
	if code, _ := c.closed(); code != websocket.StatusInternalError {
		t.Fatalf("OnConnect error closed with %d, want 1011", code)
	}
	if ci := h.nextClose(t); ci.name != "plain" || ci.code != 1011 {
		t.Errorf("OnClose got %+v, want plain with 1011", ci)
	}

	c = dial(t, env, "/agents/hooked/oc?deny=close&_pk=close")
	c.handshake()
	if code, reason := c.closed(); code != 4003 || reason != "go away" {
		t.Fatalf("OnConnect CloseError closed with %d %q, want 4003", code, reason)
	}
	if ci := h.nextClose(t); ci.code != 4003 {
		t.Errorf("OnClose got %+v, want 4003", ci)
	}

	ok := dialHooked(t, env, "oc", "fine")
	if got := ok.ok("echo", "x"); got != "x" {
		t.Fatalf("echo = %v", got)
	}
}

// Lifecycle hooks: OnStart once per hydration, OnMessage for non-protocol
// frames, OnClose with the client's code and reason, OnRequest with the
// instance prefix stripped.
func TestLifecycleHooks(t *testing.T) {
	h := newHooks()
	env := startHooked(t, h)
	c := dialHooked(t, env, "life", "c1")
	if h.starts.Load() != 1 {
		t.Fatalf("OnStart ran %d times", h.starts.Load())
	}
	c2 := dialHooked(t, env, "life", "c2")
	if h.starts.Load() != 1 {
		t.Fatalf("OnStart ran again for a second connection")
	}

	for _, msg := range []string{"not json", `{"type":"custom","x":1}`, `{"no":"type"}`} {
		c.sendRaw(websocket.MessageText, []byte(msg))
		jsonEq(t, c.next(), `{"type":"echo","data":`+quote(msg)+`}`)
	}
	c.sendRaw(websocket.MessageText, []byte("fail please"))
	if f := c.expectType(wire.Error); f["code"] != "message_failed" || f["error"] != "cannot handle that" {
		t.Fatalf("OnMessage error answered %v", f)
	}
	c.sendRaw(websocket.MessageText, []byte("fail inside"))
	if f := c.expectType(wire.Error); f["code"] != "message_failed" {
		t.Fatalf("OnMessage error answered %v", f)
	} else {
		h.logs.InternalError(t, f["error"].(string), "secret detail", "in=OnMessage")
	}
	// Protocol frames do not reach OnMessage.
	c.ok("echo", 1)
	h.mu.Lock()
	msgs := append([]string(nil), h.messages...)
	h.mu.Unlock()
	if len(msgs) != 3 {
		t.Fatalf("OnMessage saw %q", msgs)
	}

	if err := c.c.Close(4321, "bye now"); err != nil {
		t.Fatal(err)
	}
	if ci := h.nextClose(t); ci != (closeInfo{name: "c1", code: 4321, reason: "bye now"}) {
		t.Fatalf("OnClose got %+v", ci)
	}
	if got := c2.ok("echo", "alive"); got != "alive" {
		t.Fatalf("other connection after a close: %v", got)
	}

	status, body := get(t, env, "/agents/hooked/life/some/deep%20path?q=v")
	if status != http.StatusOK || body != "life GET path=/some/deep path q=v agent=Hooked/life" {
		t.Errorf("OnRequest = %d %q", status, body)
	}
	status, body = get(t, env, "/agents/hooked/life")
	if status != http.StatusOK || body != "life GET path=/ q= agent=Hooked/life" {
		t.Errorf("OnRequest at the instance root = %d %q", status, body)
	}
	status, body = get(t, env, "/agents/hooked/life/sub/hooked/kid/info")
	if status != http.StatusOK || body != "kid GET path=/info q= agent=Hooked/life/Hooked/kid" {
		t.Errorf("OnRequest of a sub-agent = %d %q", status, body)
	}
}

func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		if r == '"' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

// Sub-agent routes: an admitted child is reached over WebSocket with its
// own identity and state, nested two levels deep; a refused one answers
// 404 and creates nothing; destroying a child closes its sockets.
func TestSubAgentRoutes(t *testing.T) {
	env := startCounter(t)
	ctx := context.Background()
	parent := agent.Root("Counter", "p")
	child := parent.Child("Counter", "ok-x")
	grand := child.Child("Counter", "ok-y")

	c := dial(t, env, "/agents/counter/p/sub/counter/ok-x")
	id, _ := c.handshake()
	jsonEq(t, id, `{"type":"cf_agent_identity","name":"ok-x","agent":"counter"}`)
	c.call("increment", 5)
	c.expectType(wire.State)
	if f := c.expectType(wire.RPC); f["result"] != 5.0 {
		t.Fatalf("child increment = %v", f)
	}
	if got, _ := env.RT.Call(ctx, parent, "get"); string(got) != "0" {
		t.Errorf("parent count = %s; the child's state leaked into the parent", got)
	}
	if got, _ := env.RT.Call(ctx, child, "get"); string(got) != "5" {
		t.Errorf("child count = %s", got)
	}

	g := dial(t, env, "/agents/counter/p/sub/counter/ok-x/sub/counter/ok-y")
	id, _ = g.handshake()
	jsonEq(t, id, `{"type":"cf_agent_identity","name":"ok-y","agent":"counter"}`)
	if got := g.ok("get"); got != 0.0 {
		t.Fatalf("grandchild get = %v", got)
	}
	if ok, _ := env.RT.Exists(ctx, grand); !ok {
		t.Fatal("grandchild does not exist after its connection")
	}

	for _, path := range []string{
		"/agents/counter/p/sub/counter/bad-x",
		"/agents/counter/p/sub/counter/ok-x/sub/counter/nope",
		"/agents/counter/p/sub/counter/bad-x/sub/counter/ok-z",
	} {
		if status, _ := get(t, env, path); status != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, status)
		}
		if _, resp, err := tryDial(t, env, path); err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
			t.Errorf("dial %s: %v, %v; want a 404 handshake", path, err, resp)
		}
	}
	for _, p := range []agent.Path{
		parent.Child("Counter", "bad-x"),
		child.Child("Counter", "nope"),
		parent.Child("Counter", "bad-x").Child("Counter", "ok-z"),
	} {
		if ok, _ := env.RT.Exists(ctx, p); ok {
			t.Errorf("refused sub-agent %s was created", p)
		}
	}

	// Destroying the child closes the sockets of the child and grandchild.
	if err := env.RT.Destroy(ctx, child); err != nil {
		t.Fatal(err)
	}
	for _, cl := range []*client{c, g} {
		if code, _ := cl.closed(); code != websocket.StatusNormalClosure {
			t.Errorf("socket of a destroyed agent closed with %d, want 1000", code)
		}
	}
	if ok, _ := env.RT.Exists(ctx, grand); ok {
		t.Error("grandchild survived the child's destruction")
	}
}

// Server.Close closes every socket with 1001 and refuses new ones; OnClose
// sees the close.
func TestServerCloseGoingAway(t *testing.T) {
	h := newHooks()
	env := startHooked(t, h)
	a := dialHooked(t, env, "shut", "a")
	b := dialHooked(t, env, "shut2", "b")
	if err := env.Server.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*client{a, b} {
		if code, _ := c.closed(); code != websocket.StatusGoingAway {
			t.Errorf("socket closed with %d, want 1001", code)
		}
	}
	seen := map[string]int{}
	for range 2 {
		ci := h.nextClose(t)
		seen[ci.name] = ci.code
	}
	if seen["a"] != 1001 || seen["b"] != 1001 {
		t.Errorf("OnClose codes %v, want 1001 for a and b", seen)
	}
	if _, resp, err := tryDial(t, env, "/agents/hooked/shut"); err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("dial after Close: %v, %v; want 503", err, resp)
	}
}

// A class is reached by its npm kebab-case route only.
func TestKebabRoute(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Classes: []agent.Class{{
		Name:   "AIAssistant",
		New:    func() agent.Agent { return &counter.Counter{} },
		Public: true,
	}}})
	c := dial(t, env, "/agents/a-i-assistant/x")
	id, _ := c.handshake()
	if id["agent"] != "a-i-assistant" {
		t.Errorf("identity agent = %v", id["agent"])
	}
	if status, _ := get(t, env, "/agents/ai-assistant/x"); status != http.StatusBadRequest {
		t.Errorf("docs spelling ai-assistant = %d, want 400", status)
	}
}
