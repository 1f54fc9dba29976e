package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait: a deadline for a broken test, never a way
// to let time pass.
const waitLimit = 10 * time.Second

// client is the server tests' WebSocket client: a testenv.WSClient that
// decodes every frame into a JSON object and takes them one by one.
type client struct {
	t  *testing.T
	ws *testenv.WSClient[map[string]any]
	c  *websocket.Conn // ws's connection, to close it with a chosen code
	// frames is, once closed returned, the frames never taken by next.
	frames []testenv.Frame[map[string]any]
	ids    atomic.Int64
}

// dial opens a WebSocket to path (such as "/agents/counter/a?x=1") and
// fails the test if the handshake fails.
func dial(t *testing.T, env *testenv.Env, path string) *client {
	t.Helper()
	return dialHeader(t, env, path, nil)
}

// dialHeader is dial with the handshake request's headers.
func dialHeader(t *testing.T, env *testenv.Env, path string, header http.Header) *client {
	t.Helper()
	return newClient(t, testenv.DialWSHeader[map[string]any](t, waitLimit, env.URL(path), header))
}

// tryDial dials path and returns the handshake's response and error
// instead of failing the test when it is refused.
func tryDial(t *testing.T, env *testenv.Env, path string) (*client, *http.Response, error) {
	t.Helper()
	ws, resp, err := testenv.TryDialWS[map[string]any](t, waitLimit, env.URL(path), nil)
	if err != nil {
		return nil, resp, err
	}
	return newClient(t, ws), resp, nil
}

func newClient(t *testing.T, ws *testenv.WSClient[map[string]any]) *client {
	return &client{t: t, ws: ws, c: ws.Conn()}
}

// next returns the next frame, which must be a JSON object in a text
// frame.
func (c *client) next() map[string]any {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	f, err := c.ws.Next(ctx)
	if err != nil {
		c.t.Fatalf("waiting for a frame: %v", err)
	}
	if f.MessageType != websocket.MessageText {
		c.t.Fatalf("server sent a %v frame", f.MessageType)
	}
	if f.Err != nil {
		c.t.Fatalf("server frame %q is not a JSON object: %v", f.Raw, f.Err)
	}
	return f.Value
}

// expectType returns the next frame, failing unless it has type typ.
func (c *client) expectType(typ string) map[string]any {
	c.t.Helper()
	f := c.next()
	if f["type"] != typ {
		c.t.Fatalf("got frame %v, want type %q", f, typ)
	}
	return f
}

// handshake reads the connect sequence and returns the identity frame and
// the state (nil when no state frame was sent).
func (c *client) handshake() (identity map[string]any, state any) {
	c.t.Helper()
	identity = c.expectType(wire.Identity)
	if identity["stateFollows"] == true {
		state = c.expectType(wire.State)["state"]
	} else if _, present := identity["stateFollows"]; present {
		c.t.Fatalf("identity has stateFollows=%v; it must be absent when no state follows", identity["stateFollows"])
	}
	c.expectType(wire.MCPServers)
	return identity, state
}

func (c *client) send(v any) {
	c.t.Helper()
	c.ws.Send(v)
}

func (c *client) sendRaw(typ websocket.MessageType, data []byte) {
	c.t.Helper()
	c.ws.SendRaw(typ, data)
}

// call sends an RPC and returns its id.
func (c *client) call(method string, args ...any) string {
	c.t.Helper()
	id := "call-" + strconv.FormatInt(c.ids.Add(1), 10)
	if args == nil {
		args = []any{}
	}
	c.send(map[string]any{"type": wire.RPC, "id": id, "method": method, "args": args})
	return id
}

// rpc calls method and returns the response frame, which must be the next
// frame on the connection.
func (c *client) rpc(method string, args ...any) map[string]any {
	c.t.Helper()
	id := c.call(method, args...)
	f := c.expectType(wire.RPC)
	if f["id"] != id {
		c.t.Fatalf("rpc response %v, want id %s", f, id)
	}
	return f
}

// ok calls method and returns its result, failing unless it succeeded.
func (c *client) ok(method string, args ...any) any {
	c.t.Helper()
	f := c.rpc(method, args...)
	if f["success"] != true || f["done"] != true {
		c.t.Fatalf("%s failed: %v", method, f)
	}
	return f["result"]
}

// closed waits for the connection to close and returns the close status
// (-1 and the error when it ended without a close frame), and keeps the
// frames never read in frames.
func (c *client) closed() (websocket.StatusCode, string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ce, err := c.ws.CloseError(ctx)
	if ctx.Err() != nil {
		c.t.Fatal("connection was not closed")
	}
	c.frames = c.ws.Unread()
	if err != nil {
		return ce.Code, err.Error()
	}
	return ce.Code, ce.Reason
}

// get performs a plain HTTP GET and returns the status and body.
func get(t *testing.T, env *testenv.Env, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + env.Host + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// jsonEq compares a decoded frame with a JSON literal.
func jsonEq(t *testing.T, got map[string]any, want string) {
	t.Helper()
	var w map[string]any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	g, _ := json.Marshal(got)
	ws, _ := json.Marshal(w)
	if string(g) != string(ws) {
		t.Errorf("frame %s, want %s", g, ws)
	}
}

// hooks records what the Hooked agents saw.
type hooks struct {
	logs     testenv.Logs // the runtime's log, when the test passes it
	starts   atomic.Int32
	closes   chan closeInfo
	mu       sync.Mutex
	messages []string
}

type closeInfo struct {
	name   string
	code   int
	reason string
}

func newHooks() *hooks { return &hooks{closes: make(chan closeInfo, 64)} }

func (h *hooks) nextClose(t *testing.T) closeInfo {
	t.Helper()
	select {
	case c := <-h.closes:
		return c
	case <-time.After(waitLimit):
		t.Fatal("OnClose was not called")
		return closeInfo{}
	}
}

// Hooked implements every hook and a set of callables for the protocol
// tests.
type Hooked struct {
	agent.Base
	h *hooks
}

func hookedClass(h *hooks) agent.Class {
	return agent.Class{
		Name:   "Hooked",
		New:    func() agent.Agent { return &Hooked{h: h} },
		Public: true,
		Callable: []string{"echo", "fail", "failPublic", "boom", "setMine", "mine", "shout", "putState",
			"stream", "streamFail", "nothing"},
	}
}

func (a *Hooked) OnStart(ctx context.Context) error {
	a.h.starts.Add(1)
	return nil
}

func (a *Hooked) OnConnect(ctx context.Context, c *agent.Conn) error {
	if agent.ConnFromContext(ctx) != c {
		return errors.New("OnConnect context does not carry the connection")
	}
	switch c.Request().URL.Query().Get("deny") {
	case "plain":
		return errors.New("denied")
	case "close":
		return &agent.CloseError{Code: 4003, Reason: "go away"}
	}
	return c.Send(map[string]any{"type": "welcome", "id": c.ID()})
}

func (a *Hooked) OnMessage(ctx context.Context, c *agent.Conn, data []byte) error {
	switch string(data) {
	case "fail please":
		return agent.Publicf("cannot handle that")
	case "fail inside":
		return errors.New("secret detail")
	}
	a.h.mu.Lock()
	a.h.messages = append(a.h.messages, string(data))
	a.h.mu.Unlock()
	return c.Send(map[string]any{"type": "echo", "data": string(data)})
}

func (a *Hooked) OnClose(ctx context.Context, c *agent.Conn, code int, reason string) {
	a.h.closes <- closeInfo{name: c.ID(), code: code, reason: reason}
}

func (a *Hooked) OnRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "%s %s path=%s q=%s agent=%s", a.Name(), r.Method, r.URL.Path, r.URL.Query().Get("q"), a.Path())
}

func (a *Hooked) ValidateState(ctx context.Context, next json.RawMessage, from *agent.Conn) error {
	var s map[string]any
	if err := json.Unmarshal(next, &s); err != nil {
		return err
	}
	if s["bad"] == true {
		return errors.New("bad state")
	}
	return nil
}

func (a *Hooked) Echo(v any) any { return v }

func (a *Hooked) Fail(ctx context.Context) (int, error) {
	return 0, fmt.Errorf("query kv: %w", errors.New("secret detail"))
}

func (a *Hooked) FailPublic(ctx context.Context) (int, error) {
	return 0, fmt.Errorf("wrapped: %w", agent.Publicf("it failed on purpose"))
}

func (a *Hooked) Boom() int { panic("kaboom") }

func (a *Hooked) SetMine(ctx context.Context, v string) error {
	return agent.ConnFromContext(ctx).SetState(map[string]string{"mine": v})
}

func (a *Hooked) Mine(ctx context.Context) json.RawMessage {
	return agent.ConnFromContext(ctx).State()
}

func (a *Hooked) Shout(ctx context.Context, msg string) error {
	return a.Broadcast(map[string]any{"type": "shout", "msg": msg}, agent.ConnFromContext(ctx))
}

func (a *Hooked) PutState(ctx context.Context, v any) error { return a.SetState(ctx, v) }

func (a *Hooked) Stream(ctx context.Context, s *agent.Stream, parts []string) (string, error) {
	for _, p := range parts {
		if err := s.Send(p); err != nil {
			return "", err
		}
	}
	return strings.Join(parts, "+"), nil
}

func (a *Hooked) StreamFail(ctx context.Context, s *agent.Stream) error {
	if err := s.Send("partial"); err != nil {
		return err
	}
	return errors.New("stream broke")
}

func (a *Hooked) Nothing() {}

// NotCallable is exported but not in the allowlist.
func (a *Hooked) NotCallable() int { return 1 }
