package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/wire"
)

// upgradeStatus attempts a WebSocket upgrade of path with an Origin header
// ("" sends none) and returns the HTTP status, 101 when accepted.
func upgradeStatus(t *testing.T, env *testenv.Env, path, origin string) int {
	t.Helper()
	h := http.Header{}
	if origin != "" {
		h.Set("Origin", origin)
	}
	return testenv.UpgradeStatus(t, waitLimit, env.URL(path), h)
}

// The WebSocket origin check is on by default: a foreign Origin gets 403
// before Authorize runs or any instance is created; the server's own
// origin and clients that send no Origin are accepted. OriginPatterns adds
// origins, and "*" accepts all.
func TestOriginCheck(t *testing.T) {
	var authorized atomic.Int32
	start := func(patterns ...string) *testenv.Env {
		return testenv.Start(t, testenv.Options{
			Classes: []agent.Class{counter.Class()},
			Server: server.Options{OriginPatterns: patterns, Authorize: func(r *http.Request, p agent.Path) error {
				authorized.Add(1)
				return nil
			}},
		})
	}
	env := start()
	for _, tc := range []struct {
		origin string
		want   int
	}{
		{"", http.StatusSwitchingProtocols},
		{"http://" + env.Host, http.StatusSwitchingProtocols},
		{"https://" + env.Host, http.StatusSwitchingProtocols}, // same host, as websocket.Accept
		{"http://evil.example", http.StatusForbidden},
		{"http://127.0.0.1", http.StatusForbidden}, // another port is another origin
		{"null", http.StatusForbidden},
	} {
		authorized.Store(0)
		if got := upgradeStatus(t, env, "/agents/counter/o1", tc.origin); got != tc.want {
			t.Errorf("default, Origin %q: %d, want %d", tc.origin, got, tc.want)
		}
		if tc.want == http.StatusForbidden && authorized.Load() != 0 {
			t.Errorf("Origin %q: Authorize ran for a refused origin", tc.origin)
		}
	}
	if upgradeStatus(t, env, "/agents/counter/o2", "http://evil.example") != http.StatusForbidden {
		t.Fatal("foreign origin accepted")
	}
	if ok, err := env.RT.Exists(context.Background(), agent.Root("Counter", "o2")); err != nil || ok {
		t.Errorf("a refused upgrade created its instance (%v)", err)
	}

	some := start("app.example", "https://*.trusted.example")
	for origin, want := range map[string]int{
		"http://app.example":          http.StatusSwitchingProtocols,
		"https://a.trusted.example":   http.StatusSwitchingProtocols,
		"http://a.trusted.example":    http.StatusForbidden, // the pattern names the scheme
		"https://evil.example":        http.StatusForbidden,
		"https://app.example.evil.io": http.StatusForbidden,
	} {
		if got := upgradeStatus(t, some, "/agents/counter/o3", origin); got != want {
			t.Errorf("patterns, Origin %q: %d, want %d", origin, got, want)
		}
	}

	all := start("*")
	for _, origin := range []string{"http://evil.example", "https://anything.example:8443", "http://" + all.Host} {
		if got := upgradeStatus(t, all, "/agents/counter/o4", origin); got != http.StatusSwitchingProtocols {
			t.Errorf(`"*", Origin %q: %d, want 101`, origin, got)
		}
	}
}

// Plain is a public class without a ValidateState hook.
type Plain struct{ agent.Base }

// Current returns the state.
func (p *Plain) Current() json.RawMessage { return p.State() }

// A class without ValidateState accepts no client state: the sender gets
// cf_agent_state_error "State update rejected" (what useAgent's
// onStateUpdateError shows), nothing is stored or broadcast, and the
// connection goes on. A class with one still refuses numbers that do not
// survive a JSON round trip.
func TestClientStateClosedByDefault(t *testing.T) {
	h := newHooks()
	env := testenv.Start(t, testenv.Options{Classes: []agent.Class{
		{Name: "Plain", New: func() agent.Agent { return &Plain{} }, Callable: []string{"current"}, Public: true},
		hookedClass(h),
	}})
	a := dial(t, env, "/agents/plain/p?_pk=a")
	b := dial(t, env, "/agents/plain/p?_pk=b")
	a.handshake()
	b.handshake()
	a.send(map[string]any{"type": wire.State, "state": map[string]any{"count": 1}})
	jsonEq(t, a.next(), `{"type":"`+wire.StateError+`","error":"State update rejected"}`)
	if got := b.ok("current"); got != nil {
		t.Fatalf("state after a refused write = %v", got)
	}
	if got := a.ok("current"); got != nil {
		t.Fatalf("sender: state after a refused write = %v", got)
	}

	// Hooked validates: absurd numbers never reach its validator or storage.
	c := dialHooked(t, env, "n", "c")
	for _, state := range []string{`{"n":1e999999}`, `[-1e400]`, `{"a":{"b":[1,2,1E309]}}`} {
		c.sendRaw(websocket.MessageText, []byte(`{"type":"`+wire.State+`","state":`+state+`}`))
		jsonEq(t, c.next(), `{"type":"`+wire.StateError+`","error":"State update rejected"}`)
	}
	// Large but finite numbers, and underflow to zero, are fine.
	c.sendRaw(websocket.MessageText, []byte(`{"type":"`+wire.State+`","state":{"n":1e308,"m":1e-400,"i":123456789012345678901234567890}}`))
	if got := c.ok("echo", "after"); got != "after" {
		t.Fatalf("echo = %v", got)
	}
	st, err := env.RT.Get(context.Background(), agent.Root("Hooked", "n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(st.(*Hooked).State()); s != `{"n":1e308,"m":1e-400,"i":123456789012345678901234567890}` {
		t.Fatalf("stored state = %s", s)
	}
}
