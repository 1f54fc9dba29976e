package server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

func startCounter(t *testing.T) *testenv.Env {
	return testenv.Start(t, testenv.Options{Classes: []agent.Class{counter.Class()}})
}

func startHooked(t *testing.T, h *hooks) *testenv.Env {
	return testenv.Start(t, testenv.Options{Classes: []agent.Class{hookedClass(h), counter.Class()}, Logger: h.logs.Logger()})
}

// dialHooked connects to a Hooked instance and reads the connect sequence
// and the OnConnect welcome frame.
func dialHooked(t *testing.T, env *testenv.Env, name, connID string) *client {
	t.Helper()
	c := dial(t, env, "/agents/hooked/"+name+"?_pk="+connID)
	c.handshake()
	if w := c.expectType("welcome"); w["id"] != connID {
		t.Fatalf("welcome %v, want connection id %s", w, connID)
	}
	return c
}

// The connect sequence is identity (stateFollows only when a state
// exists), state, cf_agent_mcp_servers, in that order.
func TestConnectSequence(t *testing.T) {
	env := startCounter(t)

	c := dial(t, env, "/agents/counter/Room%201?_pk=p1")
	jsonEq(t, c.next(), `{"type":"cf_agent_identity","name":"Room 1","agent":"counter"}`)
	jsonEq(t, c.next(), `{"type":"cf_agent_mcp_servers","mcp":{"servers":{},"tools":[],"prompts":[],"resources":[]}}`)
	id := c.call("increment", 3)
	jsonEq(t, c.next(), `{"type":"cf_agent_state","state":{"count":3}}`)
	jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":true,"result":3,"done":true}`)

	c2 := dial(t, env, "/agents/counter/Room%201?_pk=p2")
	jsonEq(t, c2.next(), `{"type":"cf_agent_identity","name":"Room 1","agent":"counter","stateFollows":true}`)
	jsonEq(t, c2.next(), `{"type":"cf_agent_state","state":{"count":3}}`)
	jsonEq(t, c2.next(), `{"type":"cf_agent_mcp_servers","mcp":{"servers":{},"tools":[],"prompts":[],"resources":[]}}`)
}

// Frames a client sends right after the upgrade, before reading the
// connect sequence, are handled.
func TestEarlyFrames(t *testing.T) {
	env := startCounter(t)
	c := dial(t, env, "/agents/counter/early")
	id := c.call("increment", 1)
	c.handshake()
	f := c.next()
	if f["type"] == wire.State {
		f = c.next()
	}
	if f["type"] != wire.RPC || f["id"] != id || f["result"] != 1.0 {
		t.Fatalf("early rpc answered %v", f)
	}
}

// Server-side SetState reaches every connection; a client cf_agent_state is
// persisted and broadcast to the others, never echoed to its sender.
func TestStateSync(t *testing.T) {
	env := startCounter(t)
	a := dial(t, env, "/agents/counter/s?_pk=a")
	b := dial(t, env, "/agents/counter/s?_pk=b")
	a.handshake()
	b.handshake()

	id := a.call("increment", 2)
	jsonEq(t, a.next(), `{"type":"cf_agent_state","state":{"count":2}}`)
	jsonEq(t, a.next(), `{"type":"rpc","id":"`+id+`","success":true,"result":2,"done":true}`)
	jsonEq(t, b.next(), `{"type":"cf_agent_state","state":{"count":2}}`)

	a.send(map[string]any{"type": wire.State, "state": map[string]any{"count": 42}})
	jsonEq(t, b.next(), `{"type":"cf_agent_state","state":{"count":42}}`)
	// The sender gets no echo: its next frame is the answer to this call.
	if got := a.ok("get"); got != 42.0 {
		t.Fatalf("get after client state = %v, want 42", got)
	}
	if got := b.ok("get"); got != 42.0 {
		t.Fatalf("b get = %v", got)
	}

	// Persisted, and sent in a new connection's connect sequence.
	var stored string
	err := env.DB.View(context.Background(), func(tx store.Tx) error {
		return tx.QueryRow(context.Background(), `SELECT state FROM instances WHERE path = ?`, "Counter/s").Scan(&stored)
	})
	if err != nil || stored != `{"count":42}` {
		t.Fatalf("stored state = %q, %v", stored, err)
	}
	c := dial(t, env, "/agents/counter/s")
	_, state := c.handshake()
	if m, _ := state.(map[string]any); m["count"] != 42.0 {
		t.Fatalf("state of a new connection = %v", state)
	}
}

// ValidateState refuses a client state: the sender alone gets
// cf_agent_state_error, nothing is persisted or broadcast. An accepted one is
// persisted and broadcast to the others.
func TestClientStateValidation(t *testing.T) {
	env, a, b := hookedPair(t, "v")

	a.send(map[string]any{"type": wire.State, "state": map[string]any{"bad": true}})
	jsonEq(t, a.next(), `{"type":"cf_agent_state_error","error":"State update rejected"}`)
	// b got nothing: its next frame answers its own call.
	if got := b.ok("echo", "ping"); got != "ping" {
		t.Fatalf("echo = %v", got)
	}
	st, err := env.RT.Get(context.Background(), agent.Root("Hooked", "v"))
	if err != nil {
		t.Fatal(err)
	}
	if s := st.(*Hooked).State(); s != nil {
		t.Fatalf("refused state was applied: %s", s)
	}
	c := dial(t, env, "/agents/hooked/v?_pk=c")
	if _, state := c.handshake(); state != nil {
		t.Fatalf("refused state was persisted: %v", state)
	}
	c.expectType("welcome")

	// A frame without a state is refused as well.
	a.send(map[string]any{"type": wire.State})
	jsonEq(t, a.next(), `{"type":"cf_agent_state_error","error":"State update rejected"}`)

	a.send(map[string]any{"type": wire.State, "state": map[string]any{"ok": 1}})
	jsonEq(t, b.next(), `{"type":"cf_agent_state","state":{"ok":1}}`)
	jsonEq(t, c.next(), `{"type":"cf_agent_state","state":{"ok":1}}`)
	if got := a.ok("echo", "after"); got != "after" {
		t.Fatalf("sender's next frame was not its rpc answer: %v", got)
	}
	if s := string(st.(*Hooked).State()); s != `{"ok":1}` {
		t.Fatalf("accepted state = %s", s)
	}
}

// RPC responses have the exact shapes of the protocol: results with
// done:true, streams as done:false chunks then done:true, errors as
// success:false without done, and the connection survives failing and
// panicking methods.
func TestRPC(t *testing.T) {
	h := newHooks()
	env := startHooked(t, h)
	c := dialHooked(t, env, "r", "c")

	id := c.call("echo", map[string]any{"x": []int{1, 2}})
	jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":true,"result":{"x":[1,2]},"done":true}`)

	id = c.call("nothing")
	jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":true,"done":true}`)

	id = c.call("stream", []string{"a", "b", "c"})
	for _, want := range []string{"a", "b", "c"} {
		jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":true,"result":"`+want+`","done":false}`)
	}
	jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":true,"result":"a+b+c","done":true}`)

	id = c.call("streamFail")
	jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":true,"result":"partial","done":false}`)
	f := c.next()
	if f["id"] != id || f["success"] != false {
		t.Fatalf("failed stream answered %v", f)
	}
	h.logs.InternalError(t, f["error"].(string), "stream broke", "method=streamFail")

	id = c.call("nope")
	jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":false,"error":"Method nope does not exist"}`)
	id = c.call("notCallable")
	jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":false,"error":"Method notCallable is not callable"}`)
	id = c.call("onStart")
	jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":false,"error":"Method onStart is not callable"}`)

	// An error the method means the user to read is shown; any other is
	// an internal error id, its text only in the log.
	id = c.call("failPublic")
	jsonEq(t, c.next(), `{"type":"rpc","id":"`+id+`","success":false,"error":"it failed on purpose"}`)
	f = c.rpc("fail")
	if f["success"] != false {
		t.Fatalf("failing method answered %v", f)
	}
	h.logs.InternalError(t, f["error"].(string), "secret detail", "agent=Hooked/r", "method=fail")

	f = c.rpc("boom")
	if f["success"] != false {
		t.Fatalf("panicking method answered %v", f)
	}
	h.logs.InternalError(t, f["error"].(string), "kaboom")
	if _, ok := f["done"]; ok {
		t.Errorf("error response has a done key: %v", f)
	}

	f = c.rpc("setMine", 12)
	if f["success"] != false || !strings.Contains(f["error"].(string), "invalid argument 0") {
		t.Fatalf("bad argument answered %v", f)
	}

	// The connection and the instance still work.
	if got := c.ok("echo", "still here"); got != "still here" {
		t.Fatalf("echo after failures = %v", got)
	}
	d := dialHooked(t, env, "r", "d")
	if got := d.ok("echo", 1); got != 1.0 {
		t.Fatalf("a new connection after a panic got %v", got)
	}

	// The counter's streaming method and its argument check.
	cc := dial(t, env, "/agents/counter/streams")
	cc.handshake()
	id = cc.call("countTo", 3)
	for i := 1; i <= 3; i++ {
		f := cc.next()
		if f["id"] != id || f["done"] != false || f["result"] != float64(i) {
			t.Fatalf("chunk %d = %v", i, f)
		}
	}
	jsonEq(t, cc.next(), `{"type":"rpc","id":"`+id+`","success":true,"result":3,"done":true}`)
	if f := cc.rpc("countTo", -1); f["success"] != false || f["error"] != "n must be between 0 and 10000" {
		t.Fatalf("countTo(-1) = %v", f)
	}
}

// Per-connection state is private to its connection; Broadcast with an
// exclusion skips the excluded connection only.
func TestConnStateAndBroadcast(t *testing.T) {
	env, a, b := hookedPair(t, "b")
	c := dialHooked(t, env, "b", "c")

	a.ok("setMine", "A")
	b.ok("setMine", "B")
	for _, x := range []struct {
		c    *client
		want string
	}{{a, "A"}, {b, "B"}} {
		if got, _ := x.c.ok("mine").(map[string]any); got["mine"] != x.want {
			t.Errorf("connection state = %v, want %s", got, x.want)
		}
	}
	if got := c.ok("mine"); got != nil {
		t.Errorf("connection without state has %v", got)
	}

	a.ok("shout", "hello") // a's next frame is the rpc answer: it was excluded
	jsonEq(t, b.next(), `{"type":"shout","msg":"hello"}`)
	jsonEq(t, c.next(), `{"type":"shout","msg":"hello"}`)

	// Server-side SetState reaches every connection, the caller included.
	id := b.call("putState", map[string]any{"v": 1})
	jsonEq(t, b.next(), `{"type":"cf_agent_state","state":{"v":1}}`)
	jsonEq(t, b.next(), `{"type":"rpc","id":"`+id+`","success":true,"done":true}`)
	jsonEq(t, a.next(), `{"type":"cf_agent_state","state":{"v":1}}`)
	jsonEq(t, c.next(), `{"type":"cf_agent_state","state":{"v":1}}`)
}

// hookedPair starts a Hooked server and dials two connections, "a" and
// "b", to its instance name.
func hookedPair(t *testing.T, name string) (*testenv.Env, *client, *client) {
	t.Helper()
	env := startHooked(t, newHooks())
	return env, dialHooked(t, env, name, "a"), dialHooked(t, env, name, "b")
}
