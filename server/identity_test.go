package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	agentry "github.com/agentry/agentry/client"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/server"
)

// user is the identity the tests' auth puts in the request context.
type user struct{ Name string }

// tenantKey is the test middleware's own context key: a value that is not
// the identity, which the connection's hooks must see too.
type tenantKey struct{}

// seen is what one hook saw in its ctx.
type seen struct {
	hook   string
	user   string // agent.IdentityFrom, "" for none
	tenant string // the middleware's own value, "" for none
}

func seenIn(ctx context.Context, hook string) seen {
	s := seen{hook: hook}
	if id, ok := agent.IdentityFrom(ctx); ok {
		s.user = id.(*user).Name
	}
	s.tenant, _ = ctx.Value(tenantKey{}).(string)
	return s
}

// witness records what its hooks, methods and chat turns see.
type witness struct {
	seen    chan seen
	release chan struct{} // lets Later return
}

func newWitness() *witness {
	return &witness{seen: make(chan seen, 64), release: make(chan struct{})}
}

// next returns the next record of hook, failing the test after waitLimit.
// Records of other hooks are dropped.
func (w *witness) next(t *testing.T, hook string) seen {
	t.Helper()
	timeout := time.After(waitLimit)
	for {
		select {
		case s := <-w.seen:
			if s.hook == hook {
				return s
			}
		case <-timeout:
			t.Fatalf("no %s record", hook)
		}
	}
}

// Witness is a chat agent whose every hook, callable and tool records the
// identity in its ctx.
type Witness struct {
	chat.Base
	w *witness
	m *scripted.Model
}

func witnessClass(w *witness) agent.Class {
	m := scripted.New(scripted.WithRules(
		scripted.Rule{
			Name:  "answer",
			Match: scripted.LastIsToolResult,
			Reply: func(req *model.Request) scripted.Reply {
				return scripted.Reply{scripted.Text(fmt.Sprintf("you are %s", scripted.ToolResults(req)[0].Output))}
			},
		},
		scripted.Rule{Name: "ask", Match: scripted.LastUserContains("who"),
			Reply: scripted.Always(scripted.Reply{scripted.ToolCall("whoami", map[string]any{})})},
	))
	return agent.Class{
		Name:     "Witness",
		New:      func() agent.Agent { return &Witness{w: w, m: m} },
		Public:   true,
		Callable: []string{"whoami", "later"},
	}
}

func (a *Witness) ChatModel() model.Model { return a.m }

func (a *Witness) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("whoami", "Who is asking.", func(ctx context.Context, _ struct{}) (string, error) {
		s := seenIn(ctx, "tool")
		a.w.seen <- s
		return s.user, nil
	})}
}

func (a *Witness) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	a.w.seen <- seenIn(ctx, "OnChatMessage")
	return t.RunLoop(ctx, chat.LoopOptions{Model: a.m, Tools: a.Tools()})
}

func (a *Witness) OnConnect(ctx context.Context, c *agent.Conn) error {
	a.w.seen <- seenIn(ctx, "OnConnect")
	return nil
}

func (a *Witness) OnMessage(ctx context.Context, c *agent.Conn, data []byte) error {
	s := seenIn(ctx, "OnMessage")
	a.w.seen <- s
	return c.Send(map[string]any{"type": "seen", "user": s.user, "tenant": s.tenant})
}

func (a *Witness) OnClose(ctx context.Context, c *agent.Conn, code int, reason string) {
	a.w.seen <- seenIn(ctx, "OnClose")
}

func (a *Witness) OnRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	s := seenIn(ctx, "OnRequest")
	fmt.Fprintf(w, "%s/%s", s.user, s.tenant)
}

// Whoami returns the caller's name and tenant.
func (a *Witness) Whoami(ctx context.Context) string {
	s := seenIn(ctx, "Whoami")
	return s.user + "/" + s.tenant
}

// Later records the identity it sees once the test releases it: after its
// caller has disconnected.
func (a *Witness) Later(ctx context.Context) error {
	a.w.seen <- seen{hook: "Later started"}
	err := agent.Await(ctx, func() error {
		select {
		case <-a.w.release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	a.w.seen <- seenIn(ctx, "Later")
	return err
}

// authMiddleware is an application's own auth: it reads the user from a
// header (a session cookie, in real life), refuses requests without one,
// and puts the identity and a value of its own in the request context.
func authMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.Header.Get("X-User")
		if name == "" {
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		ctx := agent.WithIdentity(r.Context(), &user{Name: name})
		ctx = context.WithValue(ctx, tenantKey{}, "t-"+name)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func startWitness(t *testing.T, w *witness, o testenv.Options) *testenv.Env {
	t.Helper()
	o.Classes = []agent.Class{witnessClass(w)}
	o.Setup = func(rt *agent.Runtime) error { chat.Configure(rt, chat.Config{}); return nil }
	return testenv.Start(t, o)
}

func dialAs(t *testing.T, env *testenv.Env, name, who string) *agentry.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, err := agentry.Dial(ctx, agentry.Options{Host: env.Host, Agent: "Witness", Name: name,
		Header: http.Header{"X-User": {who}}})
	if err != nil {
		t.Fatalf("dial as %s: %v", who, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The identity and the other values the application's middleware puts in
// the request context reach, for each connection its own: OnConnect, the
// callable methods (also one still running after its caller has gone),
// OnMessage, OnClose, OnRequest, and the chat turn a connection starts (its
// OnChatMessage and its tools).
func TestIdentityFromMiddleware(t *testing.T) {
	w := newWitness()
	env := startWitness(t, w, testenv.Options{Middleware: authMiddleware})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	alice := dialAs(t, env, "room", "alice")
	if got := w.next(t, "OnConnect"); got != (seen{"OnConnect", "alice", "t-alice"}) {
		t.Errorf("OnConnect saw %+v", got)
	}
	bob := dialAs(t, env, "room", "bob")
	if got := w.next(t, "OnConnect"); got != (seen{"OnConnect", "bob", "t-bob"}) {
		t.Errorf("OnConnect saw %+v", got)
	}
	for _, tc := range []struct {
		c    *agentry.Conn
		want string
	}{{alice, `"alice/t-alice"`}, {bob, `"bob/t-bob"`}, {alice, `"alice/t-alice"`}} {
		got, err := tc.c.Call(ctx, "whoami")
		if err != nil || string(got) != tc.want {
			t.Errorf("whoami = %s, %v; want %s", got, err, tc.want)
		}
	}

	// OnMessage (a frame that is not the protocol's).
	if err := bob.SendRaw(ctx, []byte(`{"type":"ping"}`)); err != nil {
		t.Fatal(err)
	}
	if got := w.next(t, "OnMessage"); got != (seen{"OnMessage", "bob", "t-bob"}) {
		t.Errorf("OnMessage saw %+v", got)
	}

	// A chat turn started by alice's chat request: the handler and the tool.
	st, err := alice.Chat().Send(ctx, "who am I?")
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Wait(ctx)
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("chat turn = %+v, %v", res, err)
	}
	if got := w.next(t, "OnChatMessage"); got.user != "alice" {
		t.Errorf("OnChatMessage saw %+v, want alice", got)
	}
	if got := w.next(t, "tool"); got.user != "alice" {
		t.Errorf("the tool saw %+v, want alice", got)
	}
	if text := textOf(st.Message()); text != `you are "alice"` {
		t.Errorf("answer %q", text)
	}

	// A call that goes on after its caller has gone keeps its identity.
	go bob.Call(context.Background(), "later") //nolint:errcheck // bob closes before it answers
	w.next(t, "Later started")
	bob.Close()
	if got := w.next(t, "OnClose"); got != (seen{"OnClose", "bob", "t-bob"}) {
		t.Errorf("OnClose saw %+v", got)
	}
	close(w.release)
	if got := w.next(t, "Later"); got != (seen{"Later", "bob", "t-bob"}) {
		t.Errorf("a call still running after its caller left saw %+v", got)
	}

	// OnRequest: the request's own context.
	status, _, body := doHTTP(t, env, "/agents/witness/room/x", http.Header{"X-User": {"carol"}})
	if status != http.StatusOK || body != "carol/t-carol" {
		t.Errorf("OnRequest = %d %q", status, body)
	}
	if status, _, _ := doHTTP(t, env, "/agents/witness/room/x", nil); status != http.StatusUnauthorized {
		t.Errorf("the middleware let an anonymous request through: %d", status)
	}
}

// Options.Authenticate: its identity reaches Authorize, the parent's
// sub-agent gate and the methods; its error refuses the request (4001 for
// a WebSocket, 401 for HTTP), and a nil identity admits an anonymous caller.
func TestAuthenticate(t *testing.T) {
	w := newWitness()
	var mu sync.Mutex
	var authorized []string
	env := startWitness(t, w, testenv.Options{Server: server.Options{
		Authenticate: func(r *http.Request) (any, error) {
			switch name := r.Header.Get("X-User"); name {
			case "":
				return nil, errors.New("no user")
			case "anon":
				return nil, nil
			default:
				return &user{Name: name}, nil
			}
		},
		Authorize: func(r *http.Request, p agent.Path) error {
			s := seenIn(r.Context(), "Authorize")
			mu.Lock()
			authorized = append(authorized, s.user)
			mu.Unlock()
			if s.user == "mallory" {
				return &agent.CloseError{Code: 4003, Reason: "not you"}
			}
			return nil
		},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	dave := dialAs(t, env, "room", "dave")
	if got, err := dave.Call(ctx, "whoami"); err != nil || string(got) != `"dave/"` {
		t.Errorf("whoami = %s, %v; want dave", got, err)
	}
	anon := dialAs(t, env, "room", "anon")
	if got, err := anon.Call(ctx, "whoami"); err != nil || string(got) != `"/"` {
		t.Errorf("anonymous whoami = %s, %v; want no identity", got, err)
	}

	_, err := agentry.Dial(ctx, agentry.Options{Host: env.Host, Agent: "Witness", Name: "room"})
	if ce := (*agentry.CloseError)(nil); !errors.As(err, &ce) || ce.Code != 4001 {
		t.Errorf("dial without a user: %v, want close 4001", err)
	}
	_, err = agentry.Dial(ctx, agentry.Options{Host: env.Host, Agent: "Witness", Name: "room",
		Header: http.Header{"X-User": {"mallory"}}})
	if ce := (*agentry.CloseError)(nil); !errors.As(err, &ce) || ce.Code != 4003 {
		t.Errorf("dial as mallory: %v, want close 4003 from Authorize", err)
	}
	if status, _, _ := doHTTP(t, env, "/agents/witness/room/x", nil); status != http.StatusUnauthorized {
		t.Errorf("HTTP without a user = %d, want 401", status)
	}
	if status, _, body := doHTTP(t, env, "/agents/witness/room/x", http.Header{"X-User": {"erin"}}); status != http.StatusOK || body != "erin/" {
		t.Errorf("OnRequest = %d %q", status, body)
	}
	want := []string{"dave", "", "mallory", "erin"}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(authorized) != fmt.Sprint(want) {
		t.Errorf("Authorize saw %q, want %q (it runs after Authenticate, only when it admits)", authorized, want)
	}
}

// textOf joins the text parts of m.
func textOf(m message.Message) string {
	var b strings.Builder
	for _, p := range m.Parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}
