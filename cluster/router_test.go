package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// routeTest parses /agents/x/{name} into the path X/{name}.
func routeTest(p string) (agent.Path, bool) {
	rest, ok := strings.CutPrefix(p, "/agents/x/")
	if !ok || rest == "" {
		return nil, false
	}
	return agent.Path{{Class: "X", Name: rest}}, true
}

// fakeOwner is a node's local handler: it answers HTTP with its id and
// echoes WebSocket frames prefixed with it; it refuses the name "refused".
type fakeOwner struct {
	id string
	mu sync.Mutex
	ws []*websocket.Conn
}

func (f *fakeOwner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/refused") {
		http.Error(w, "no", http.StatusUnauthorized)
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		fmt.Fprintf(w, "%s %s %s", f.id, r.URL.Path, r.Header.Get(ForwardedHeader))
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	f.mu.Lock()
	f.ws = append(f.ws, c)
	f.mu.Unlock()
	ctx := context.Background()
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		if err := c.Write(ctx, typ, append([]byte(f.id+":"), data...)); err != nil {
			return
		}
	}
}

// dropAll ends the owner's sockets without a close frame, as a killed
// process does.
func (f *fakeOwner) dropAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.ws {
		c.CloseNow()
	}
}

func (f *fakeOwner) closeAll(code websocket.StatusCode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.ws {
		c.Close(code, "moved")
	}
}

type testNode struct {
	node  *Node
	owner *fakeOwner
	http  *httptest.Server
	route *Router
}

func startNodes(t *testing.T, d *db, ids ...string) []*testNode {
	t.Helper()
	clock := clockwork.NewFakeClock()
	var out []*testNode
	for _, id := range ids {
		tn := &testNode{owner: &fakeOwner{id: id}}
		tn.http = httptest.NewUnstartedServer(nil)
		tn.node = join(t, d, id, clock, func(c *Config) { c.Addr = tn.http.Listener.Addr().String() })
		tn.route = &Router{Node: tn.node, Local: tn.owner, Route: routeTest}
		tn.http.Config.Handler = tn.route
		tn.http.Start()
		t.Cleanup(func() { tn.route.Close(); tn.http.Close() })
		out = append(out, tn)
	}
	// Settle: every node takes its share and reads the others'.
	for range 3 {
		for _, tn := range out {
			step(t, tn.node)
		}
	}
	return out
}

// nameOwnedBy returns an instance name whose shard node owns.
func nameOwnedBy(t *testing.T, n *Node) string {
	t.Helper()
	for i := range 10000 {
		name := fmt.Sprint("i", i)
		if n.Owns(agent.Path{{Class: "X", Name: name}}) {
			return name
		}
	}
	t.Fatal("no name owned")
	return ""
}

func TestRouterForwardsHTTP(t *testing.T) {
	d := newDB(t)
	ns := startNodes(t, d, "a", "b")
	a, b := ns[0], ns[1]
	name := nameOwnedBy(t, b.node)
	resp, err := http.Get(a.http.URL + "/agents/x/" + name)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "b /agents/x/" + name + " a"; string(body) != want {
		t.Fatalf("got %q, want %q", body, want)
	}
	// A request that a node forwarded is never forwarded again.
	req, _ := http.NewRequest("GET", b.http.URL+"/agents/x/"+nameOwnedBy(t, a.node), nil)
	req.Header.Set(ForwardedHeader, "c")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("second hop: %d, want 503 with Retry-After", resp.StatusCode)
	}
	// Outside the agent routes: local.
	resp, err = http.Get(a.http.URL + "/other")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(body), "a /other") {
		t.Fatalf("non-agent route: %q", body)
	}
}

// wsLimit bounds the router tests' WebSocket dials and waits.
const wsLimit = 10 * time.Second

func TestRouterBridgesSockets(t *testing.T) {
	d := newDB(t)
	ns := startNodes(t, d, "a", "b")
	a, b := ns[0], ns[1]
	ctx, cancel := context.WithTimeout(context.Background(), wsLimit)
	defer cancel()
	name := nameOwnedBy(t, b.node)
	url := "ws" + strings.TrimPrefix(a.http.URL, "http") + "/agents/x/" + name
	// The nodes' frames are plain text: F is json.RawMessage, Raw is read.
	c := testenv.DialWS[json.RawMessage](t, wsLimit, url)
	for i := range 3 {
		msg := fmt.Sprint("hello ", i)
		c.SendRaw(websocket.MessageText, []byte(msg))
		got, err := c.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Raw) != "b:"+msg {
			t.Fatalf("got %q", got.Raw)
		}
	}
	// The owner hands the shard over: its close code reaches the client.
	b.owner.closeAll(websocket.StatusServiceRestart)
	if ce, err := c.CloseError(ctx); ce.Code != websocket.StatusServiceRestart || len(c.Unread()) != 0 {
		t.Fatalf("client closed with %v (%v), want 1012", ce.Code, err)
	}

	// The owner dies without a close frame: the client gets 1012 too.
	c2 := testenv.DialWS[json.RawMessage](t, wsLimit, url)
	c2.SendRaw(websocket.MessageText, []byte("x"))
	if _, err := c2.Next(ctx); err != nil {
		t.Fatal(err)
	}
	b.owner.dropAll()
	if ce, err := c2.CloseError(ctx); ce.Code != websocket.StatusServiceRestart || len(c2.Unread()) != 0 {
		t.Fatalf("client closed with %v (%v), want 1012", ce.Code, err)
	}
}

func TestRouterRelaysRefusedUpgrade(t *testing.T) {
	d := newDB(t)
	ns := startNodes(t, d, "a", "b")
	a, b := ns[0], ns[1]
	if !b.node.Owns(agent.Path{{Class: "X", Name: "refused"}}) {
		a, b = b, a
	}
	_, resp, err := testenv.TryDialWS[json.RawMessage](t, wsLimit, "ws"+strings.TrimPrefix(a.http.URL, "http")+"/agents/x/refused", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("refused upgrade through %s: %v %v", a.node.ID(), resp, err)
	}
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		t.Fatal("refusal turned into a close")
	}
}
