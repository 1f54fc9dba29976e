package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/examples/echochat"
	"github.com/agentry/agentry/internal/testkit/testctx"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait: a deadline for a broken test, never a way
// to let time pass.
const waitLimit = 15 * time.Second

func testCtx(t *testing.T) context.Context { return testctx.Within(t, waitLimit) }

// start runs a server with Counter and EchoChat. EchoChat streams on clk
// with a one-second delay between events when clk is not nil.
func start(t *testing.T, clk clockwork.Clock, so ...func(*testenv.Options)) *testenv.Env {
	t.Helper()
	eo := echochat.Options{}
	if clk != nil {
		eo = echochat.Options{Delay: time.Second, Clock: clk}
	}
	opts := testenv.Options{
		Classes: []agent.Class{counter.Class(), echochat.Class(eo)},
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			return nil
		},
	}
	for _, f := range so {
		f(&opts)
	}
	return testenv.Start(t, opts)
}

func dial(t *testing.T, env *testenv.Env, o client.Options) *client.Conn {
	t.Helper()
	o.Host = env.Host
	c, err := client.Dial(testCtx(t), o)
	if err != nil {
		t.Fatalf("dial %+v: %v", o, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// states returns Options whose OnState feeds the returned channel.
func states(o client.Options) (client.Options, chan json.RawMessage) {
	ch := make(chan json.RawMessage, 64)
	o.OnState = func(s json.RawMessage) { ch <- s }
	return o, ch
}

func waitState(t *testing.T, ch <-chan json.RawMessage, want string) {
	t.Helper()
	timeout := time.After(waitLimit)
	for {
		select {
		case s := <-ch:
			if string(s) == want {
				return
			}
		case <-timeout:
			t.Fatalf("no state %s", want)
		}
	}
}

func TestCounterRPC(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	o, st := states(client.Options{Agent: "Counter", Name: "rpc"})
	c := dial(t, env, o)
	if got := c.Identity(); got != (client.Identity{Agent: "counter", Name: "rpc"}) {
		t.Errorf("identity = %+v", got)
	}
	if s := c.State(); s != nil {
		t.Errorf("initial state = %s, want none", s)
	}
	res, err := c.Call(ctx, "increment", 2)
	if err != nil || string(res) != "2" {
		t.Fatalf("increment = %s, %v", res, err)
	}
	waitState(t, st, `{"count":2}`)
	var s counter.State
	if err := c.DecodeState(&s); err != nil || s.Count != 2 {
		t.Errorf("state = %+v, %v", s, err)
	}
	if res, err := c.Call(ctx, "get"); err != nil || string(res) != "2" {
		t.Errorf("get = %s, %v", res, err)
	}

	// A new connection gets the state with its identity.
	c2 := dial(t, env, client.Options{Agent: "Counter", Name: "rpc"})
	if s := c2.State(); string(s) != `{"count":2}` {
		t.Errorf("state on connect = %s", s)
	}
}

func TestCallErrors(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	c := dial(t, env, client.Options{Agent: "Counter", Name: "errors"})
	for _, tc := range []struct {
		method string
		args   []any
		want   string
	}{
		{"nope", []any{1}, "Method nope does not exist"},
		{"scheduledIncrement", []any{1}, "Method scheduledIncrement is not callable"},
		{"countTo", []any{-1}, "n must be between 0 and 10000"},
	} {
		_, err := c.Call(ctx, tc.method, tc.args...)
		var re *client.RPCError
		if !errors.As(err, &re) || re.Message != tc.want || re.Method != tc.method {
			t.Errorf("%s: err = %v, want RPCError %q", tc.method, err, tc.want)
		}
	}
	// The connection is still usable.
	if _, err := c.Call(ctx, "get"); err != nil {
		t.Errorf("get after errors: %v", err)
	}
}

func TestCallStream(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	c := dial(t, env, client.Options{Agent: "Counter", Name: "stream"})
	var got []string
	res, err := c.CallStream(ctx, "countTo", func(chunk json.RawMessage) { got = append(got, string(chunk)) }, 5)
	if err != nil || string(res) != "5" {
		t.Fatalf("countTo = %s, %v", res, err)
	}
	if strings.Join(got, ",") != "1,2,3,4,5" {
		t.Errorf("chunks = %v", got)
	}
	// Call ignores the chunks and returns the final result.
	if res, err := c.Call(ctx, "countTo", 3); err != nil || string(res) != "3" {
		t.Errorf("Call countTo = %s, %v", res, err)
	}
}

func TestStateSync(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	o1, st1 := states(client.Options{Agent: "Counter", Name: "sync"})
	o2, st2 := states(client.Options{Agent: "Counter", Name: "sync"})
	var errs atomic.Int32
	o1.OnStateError = func(string) { errs.Add(1) }
	c1 := dial(t, env, o1)
	c2 := dial(t, env, o2)

	if err := c1.SetState(ctx, counter.State{Count: 42}); err != nil {
		t.Fatal(err)
	}
	if s := c1.State(); string(s) != `{"count":42}` {
		t.Errorf("local state = %s", s)
	}
	waitState(t, st2, `{"count":42}`)

	// A change made through c2 reaches c1; the server's count started at
	// the state c1 set.
	if res, err := c2.Call(ctx, "increment", 1); err != nil || string(res) != "43" {
		t.Fatalf("increment = %s, %v", res, err)
	}
	waitState(t, st1, `{"count":43}`)
	// The sender of a state is not sent its own update back: c1's first
	// server state is 43.
	select {
	case s := <-st1:
		t.Errorf("unexpected state %s", s)
	default:
	}
	if errs.Load() != 0 {
		t.Errorf("%d state errors", errs.Load())
	}
}

func TestSubAgent(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	child := dial(t, env, client.Options{Agent: "Counter", Name: "parent", Sub: []client.Hop{{Agent: "Counter", Name: "ok-child 1"}}})
	if got := child.Identity(); got != (client.Identity{Agent: "counter", Name: "ok-child 1"}) {
		t.Errorf("identity = %+v", got)
	}
	if res, err := child.Call(ctx, "increment", 5); err != nil || string(res) != "5" {
		t.Fatalf("child increment = %s, %v", res, err)
	}
	parent := dial(t, env, client.Options{Agent: "Counter", Name: "parent"})
	if res, err := parent.Call(ctx, "get"); err != nil || string(res) != "0" {
		t.Errorf("parent get = %s, %v (the child's count must not leak)", res, err)
	}

	// The parent's gate refuses other children with 404.
	_, err := client.Dial(ctx, client.Options{Host: env.Host, Agent: "Counter", Name: "parent", Sub: []client.Hop{{Agent: "Counter", Name: "nope"}}})
	var he *client.HTTPError
	if !errors.As(err, &he) || he.StatusCode != http.StatusNotFound {
		t.Errorf("refused child: err = %v, want HTTPError 404", err)
	}
}

func TestTerminalClose(t *testing.T) {
	env := start(t, nil, func(o *testenv.Options) {
		o.Server.Authorize = func(r *http.Request, p agent.Path) error {
			if r.URL.Query().Get("token") != "good" {
				return &agent.CloseError{Code: 4003, Reason: "forbidden"}
			}
			return nil
		}
	})
	ctx := testCtx(t)
	_, err := client.Dial(ctx, client.Options{Host: env.Host, Agent: "Counter", Name: "auth", Query: map[string][]string{"token": {"bad"}}})
	var ce *client.CloseError
	if !errors.As(err, &ce) || ce.Code != 4003 || ce.Reason != "forbidden" || !ce.Terminal() {
		t.Fatalf("dial with a bad token: err = %v, want terminal CloseError 4003", err)
	}
	c := dial(t, env, client.Options{Agent: "Counter", Name: "auth", Query: map[string][]string{"token": {"good"}}})
	if _, err := c.Call(ctx, "get"); err != nil {
		t.Errorf("get with a good token: %v", err)
	}
}

func TestServerClose(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	c := dial(t, env, client.Options{Agent: "Counter", Name: "shutdown"})
	env.Server.Close()
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("connection did not end")
	}
	var ce *client.CloseError
	if err := c.Err(); !errors.As(err, &ce) || ce.Code != 1001 || ce.Terminal() {
		t.Errorf("Err = %v, want non-terminal CloseError 1001", err)
	}
	if _, err := c.Call(ctx, "get"); !errors.As(err, &ce) {
		t.Errorf("call after close: %v, want the CloseError", err)
	}
	c.Close()
	if err := c.Err(); !errors.As(err, &ce) {
		t.Errorf("Err after Close = %v, want the server's CloseError", err)
	}
}

func TestCloseFailsCalls(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	c := dial(t, env, client.Options{Agent: "Counter", Name: "local-close"})
	c.Close()
	if _, err := c.Call(ctx, "get"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("call after Close: %v, want ErrClosed", err)
	}
	c.Close() // idempotent
}

func TestSubscribe(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	var mu sync.Mutex
	var first []string
	c := dial(t, env, client.Options{Agent: "Counter", Name: "subscribe", OnFrame: func(f client.Frame) {
		mu.Lock()
		defer mu.Unlock()
		first = append(first, f.Type)
	}})
	mu.Lock()
	if len(first) == 0 || first[0] != wire.Identity {
		t.Errorf("first frames = %v, want identity first (before Dial returns)", first)
	}
	mu.Unlock()
	sub := c.Subscribe()
	defer sub.Close()
	if _, err := c.Call(ctx, "increment", 1); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for !seen[wire.RPC] || !seen[wire.State] {
		select {
		case f := <-sub.C():
			seen[f.Type] = true
			if !json.Valid(f.Data) {
				t.Errorf("frame %q is not JSON", f.Data)
			}
		case <-ctx.Done():
			t.Fatalf("frames seen: %v", seen)
		}
	}
	// A subscription ends when the connection does.
	sub2 := c.Subscribe()
	c.Close()
	for range sub2.C() {
	}
	sub2.Close()
}

func TestURLs(t *testing.T) {
	if got, want := client.EncodeURIComponent("a b/c?d&é~'()*!"), "a%20b%2Fc%3Fd%26%C3%A9~'()*!"; got != want {
		t.Errorf("EncodeURIComponent = %q, want %q", got, want)
	}
	// The request URL is what the server sees: capture it.
	seen := make(chan string, 1)
	env := start(t, nil, func(o *testenv.Options) {
		o.Server.Authorize = func(r *http.Request, p agent.Path) error {
			select {
			case seen <- r.URL.RequestURI():
			default:
			}
			return nil
		}
	})
	dial(t, env, client.Options{Agent: "Counter", Name: "Room 1", ID: "fixed", Sub: []client.Hop{{Agent: "Counter", Name: "ok-a b/c"}},
		Query: map[string][]string{"token": {"abc"}}})
	got := <-seen
	if want := "/agents/counter/Room%201/sub/counter/ok-a%20b%2Fc?_pk=fixed&token=abc"; got != want {
		t.Errorf("URL = %s, want %s", got, want)
	}
}

func TestChatTurn(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	c := dial(t, env, client.Options{Agent: "EchoChat", Name: "turn"})
	ch := c.Chat()
	s, err := ch.Send(ctx, "hello there")
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	var text strings.Builder
	for chunk, err := range s.All(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, chunk.Type)
		if chunk.Type == message.ChunkTextDelta {
			text.WriteString(chunk.Delta)
		}
	}
	if text.String() != "You said: hello there" {
		t.Errorf("streamed text = %q", text.String())
	}
	if types[0] != message.ChunkStart || types[len(types)-1] != message.ChunkFinish {
		t.Errorf("chunk types = %v", types)
	}
	r, ok := s.Result()
	if !ok || r.Outcome != client.OutcomeCompleted || chat.MessageText(r.Message) != "You said: hello there" || len(r.MessageIDs) != 1 {
		t.Fatalf("result = %+v, %v", r, ok)
	}
	tr := ch.Transcript()
	if len(tr) != 2 || tr[0].Role != message.RoleUser || tr[1].ID != r.Message.ID {
		t.Fatalf("transcript = %+v", tr)
	}

	// The server's copy, over HTTP, matches.
	msgs, err := ch.Messages(ctx)
	if err != nil || len(msgs) != 2 || msgs[1].ID != r.Message.ID || chat.MessageText(msgs[1]) != "You said: hello there" {
		t.Fatalf("get-messages = %+v, %v", msgs, err)
	}

	// A second turn sends the whole transcript; a new connection gets it
	// on connect.
	s2, err := ch.Send(ctx, "again")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s2.Wait(ctx)
	if err != nil || chat.MessageText(r2.Message) != "You said: again" {
		t.Fatalf("second turn = %+v, %v", r2, err)
	}
	transcript := make(chan struct{}, 1)
	c2 := dial(t, env, client.Options{Agent: "EchoChat", Name: "turn", OnFrame: func(f client.Frame) {
		if f.Type == wire.ChatMessages {
			transcript <- struct{}{}
		}
	}})
	select {
	case <-transcript:
	case <-ctx.Done():
		t.Fatal("no transcript on connect")
	}
	if tr := c2.Chat().Transcript(); len(tr) != 4 {
		t.Errorf("transcript on connect has %d messages, want 4", len(tr))
	}

	// Clear wipes the server's history.
	if err := ch.Clear(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, "nope"); err == nil { // a round trip: the clear is done
		t.Fatal("nope succeeded")
	}
	if msgs, err := ch.Messages(ctx); err != nil || len(msgs) != 0 {
		t.Errorf("get-messages after clear = %+v, %v", msgs, err)
	}
}

func TestChatToolParts(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	c := dial(t, env, client.Options{Agent: "EchoChat", Name: "tools"})
	s, err := c.Chat().Send(ctx, "please use the clock tool in UTC")
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var tool *message.Part
	for i, p := range r.Message.Parts {
		if p.Type == "tool-clock" {
			tool = &r.Message.Parts[i]
		}
	}
	if tool == nil || tool.State != message.StateOutputAvailable || string(tool.Input) != `{"zone":"UTC"}` {
		t.Fatalf("parts = %+v", r.Message.Parts)
	}
	var out echochat.ClockOutput
	if err := json.Unmarshal(tool.Output, &out); err != nil || out.Zone != "UTC" {
		t.Errorf("tool output = %s, %v", tool.Output, err)
	}
	if got := chat.MessageText(r.Message); !strings.HasPrefix(got, "The time in UTC is ") {
		t.Errorf("text = %q", got)
	}
}

// streamOnFakeClock sends a turn to an EchoChat whose stream waits on clk,
// and returns its stream after the first text delta.
func streamOnFakeClock(t *testing.T, ctx context.Context, c *client.Conn, text string) *client.Stream {
	t.Helper()
	s, err := c.Chat().Send(ctx, text)
	if err != nil {
		t.Fatal(err)
	}
	for {
		chunk, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("stream ended before text: %v", err)
		}
		if chunk.Type == message.ChunkTextDelta {
			return s
		}
	}
}

// advance moves clk on whenever the model waits, until stop is closed.
func advance(ctx context.Context, clk *clockwork.FakeClock, stop <-chan struct{}) {
	for {
		bctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-stop:
			case <-bctx.Done():
			}
			cancel()
		}()
		err := clk.BlockUntilContext(bctx, 1)
		cancel()
		if err != nil {
			return
		}
		clk.Advance(time.Second)
	}
}

func TestChatCancel(t *testing.T) {
	clk := clockwork.NewFakeClock()
	env := start(t, clk)
	ctx := testCtx(t)
	c := dial(t, env, client.Options{Agent: "EchoChat", Name: "cancel"})
	s := streamOnFakeClock(t, ctx, c, "a long message to be cut short")
	if err := c.Chat().Cancel(ctx, s.ID()); err != nil {
		t.Fatal(err)
	}
	r, err := s.Wait(ctx)
	if err != nil || r.Outcome != client.OutcomeAborted {
		t.Fatalf("result = %+v, %v", r, err)
	}
	if got := chat.MessageText(r.Message); got == "" || strings.HasSuffix(got, "short") {
		t.Errorf("partial text = %q", got)
	}
}

func TestChatResume(t *testing.T) {
	clk := clockwork.NewFakeClock()
	env := start(t, clk)
	ctx := testCtx(t)
	c1 := dial(t, env, client.Options{Agent: "EchoChat", Name: "resume"})

	// Nothing to resume yet.
	if _, err := c1.Chat().Resume(ctx); !errors.Is(err, client.ErrNoStream) {
		t.Fatalf("resume on an idle chat: %v", err)
	}

	s1 := streamOnFakeClock(t, ctx, c1, "resume me please")
	c2 := dial(t, env, client.Options{Agent: "EchoChat", Name: "resume"})
	s2, err := c2.Chat().Resume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s2.ID() != s1.ID() {
		t.Errorf("resumed %s, want %s", s2.ID(), s1.ID())
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		advance(ctx, clk, stop)
	}()
	r2, err := s2.Wait(ctx)
	r1, err1 := s1.Wait(ctx)
	close(stop)
	<-done
	if err != nil || err1 != nil {
		t.Fatalf("wait: %v, %v", err, err1)
	}
	if r2.Outcome != client.OutcomeCompleted || chat.MessageText(r2.Message) != "You said: resume me please" {
		t.Errorf("resumed result = %+v", r2)
	}
	if r1.Message.ID != r2.Message.ID || chat.MessageText(r1.Message) != chat.MessageText(r2.Message) {
		t.Errorf("results differ: %+v vs %+v", r1.Message, r2.Message)
	}

	// A finished stream replays to the end with its outcome.
	c3 := dial(t, env, client.Options{Agent: "EchoChat", Name: "resume"})
	if _, err := c3.Chat().Resume(ctx); !errors.Is(err, client.ErrNoStream) {
		t.Errorf("resume after the turn: %v, want ErrNoStream", err)
	}
}
