package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/examples/echochat"
	"github.com/agentry/agentry/internal/testkit/testctx"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

// TestResumeAfterAckedOfferOnConnect is the flake of
// test/clusterclients TestChatCommandThroughAnyNode (issue 24), in one
// process. The chat's owner dies mid-turn; a new owner (a runtime started
// again on the same SQLite file) recovers the turn, which waits in its
// model. The client reconnects through a relay (a cluster node's bridge)
// and the new owner offers the recovered stream on connect. Then, in this
// order:
//
//  1. the resume takes stock of the turns in flight before the offer
//     arrives (the relay holds it), so it will probe;
//  2. the offer arrives and the client acknowledges it at once (the
//     resume is under way); the acknowledgement reaches the server, which
//     replays the stream and lets the socket follow it live;
//  3. the probe reaches the server, which answers with the offer of the
//     same stream and holds the socket out of its live chunks and end
//     again, until an acknowledgement reaches it.
//
// The client used to skip that acknowledgement (it had acknowledged the
// offer of that stream on this socket), so it saw neither the rest of the
// recovered turn nor its end: the answer was only in the transcript. Now
// the stream ends with the whole answer.
func TestResumeAfterAckedOfferOnConnect(t *testing.T) {
	ctx := testctx.Within(t, 15*time.Second)
	dir := t.TempDir()
	clk1 := clockwork.NewFakeClock()
	env1, _ := startOwner(t, dir, clk1)
	rl := startRelay(t, env1.Host)

	rclk := clockwork.NewFakeClock()
	lost, back := make(chan error, 4), make(chan struct{}, 4)
	rc := &Reconnect{MinDelay: time.Second, Growth: 1, Clock: rclk,
		OnDisconnect: func(err error) { lost <- err }, OnReconnect: func() { back <- struct{}{} }}
	probing := make(chan string, 1)
	rc.beforeProbe = func() {
		// Steps 1 and 2: the resume took stock without the offer, which
		// the relay holds. Let the offer through and wait until the
		// client's acknowledgement of it has reached the server; the probe
		// goes after it.
		var id string
		select {
		case id = <-rl.held:
		case <-ctx.Done():
			return
		}
		rl.releaseOffer()
		for {
			select {
			case ack := <-rl.acks:
				if ack != id {
					continue
				}
				probing <- id
				return
			case <-ctx.Done():
				return
			}
		}
	}
	c, err := Dial(ctx, Options{Host: rl.addr(), Agent: "EchoChat", Name: "moved", Chat: true, Reconnect: rc})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Chat().Send(ctx, "survive the death of my agent's node")
	if err != nil {
		t.Fatal(err)
	}
	for {
		ch, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("the turn ended before its first text: %v", err)
		}
		if ch.Type == message.ChunkTextDelta {
			break // committed: a client only gets chunks the server stored
		}
	}

	// The owner dies. Meanwhile the relay has no server to reach: the
	// client's first attempt is refused, the next waits on rclk.
	rl.point("")
	env1.Close()
	select {
	case <-lost:
	case <-ctx.Done():
		t.Fatal("the client did not lose its socket")
	}
	if err := rclk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}

	// The new owner recovers the turn, which waits in the model: its
	// stream has started (the stored chunks), so a new socket is offered
	// it on connect.
	clk2 := clockwork.NewFakeClock()
	env2, events := startOwner(t, dir, clk2)
	waitEvent(t, ctx, events, "recover-turn", s.ID())
	if err := clk2.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	rl.point(env2.Host)
	rl.holdOffer()
	rclk.Advance(time.Second)
	select {
	case <-back:
	case <-ctx.Done():
		t.Fatal("the client did not reconnect")
	}
	select {
	case id := <-probing:
		if id != s.ID() {
			t.Fatalf("offered %s, want the turn %s", id, s.ID())
		}
	case <-ctx.Done():
		t.Fatal("the resume did not probe after acknowledging the offer")
	}
	// Step 3: the probe's answer offers the stream again (the server holds
	// the socket out of it from then on).
	select {
	case id := <-rl.answers:
		if id != s.ID() {
			t.Fatalf("the probe's answer offered %s, want the turn %s", id, s.ID())
		}
	case <-ctx.Done():
		t.Fatal("the probe's answer did not offer the stream again")
	}

	// The recovered turn runs to its end.
	stop := pumpClock(clk2)
	defer stop()
	waitEvent(t, ctx, events, "turn", s.ID())
	r, err := s.Wait(ctx)
	if err != nil {
		t.Fatalf("the recovered turn's stream did not end on the client (%v): the probe's answer offered it again, and the client did not acknowledge it", err)
	}
	stop()
	if r.Outcome != OutcomeCompleted {
		t.Fatalf("outcome %q, want completed", r.Outcome)
	}
	msgs, err := c.Chat().Messages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 || msgs[1].ID != r.Message.ID {
		t.Fatalf("transcript %+v: want the question and the stream's message %s", msgs, r.Message.ID)
	}
	if got, want := chat.MessageText(r.Message), chat.MessageText(msgs[1]); got != want || !strings.Contains(got, "You said: ") {
		t.Fatalf("the stream's answer %q, the transcript's %q", got, want)
	}
	if tr := c.Chat().Transcript(); len(tr) != 2 || chat.MessageText(tr[1]) != chat.MessageText(msgs[1]) {
		t.Errorf("the client's transcript %+v lacks the answer", tr)
	}
}

// startOwner starts a server for EchoChat, streaming on clk, on the data
// folder dir, and returns the chat events "recover-turn" and "turn".
func startOwner(t *testing.T, dir string, clk clockwork.Clock) (*testenv.Env, <-chan diag.Event) {
	t.Helper()
	events := make(chan diag.Event, 16)
	env := testenv.Start(t, testenv.Options{
		Dir:     dir,
		Classes: []agent.Class{echochat.Class(echochat.Options{Delay: time.Second, Clock: clk})},
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			rt.Diag().Subscribe(diag.ChannelChat, func(e diag.Event) {
				if e.Type == "recover-turn" || e.Type == "turn" {
					select {
					case events <- e:
					default:
					}
				}
			})
			return nil
		},
	})
	return env, events
}

// waitEvent waits for the chat event typ of the stream id.
func waitEvent(t *testing.T, ctx context.Context, events <-chan diag.Event, typ, id string) {
	t.Helper()
	for {
		select {
		case e := <-events:
			if e.Type == typ && e.Attrs["stream"] == id {
				return
			}
		case <-ctx.Done():
			t.Fatalf("no chat event %s of %s", typ, id)
		}
	}
}

// pumpClock advances clk by a second whenever something waits on it,
// until stop is called.
func pumpClock(clk *clockwork.FakeClock) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for clk.BlockUntilContext(ctx, 1) == nil {
			clk.Advance(time.Second)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

// relay bridges WebSockets, frame by frame, and plain HTTP requests to the
// server it points at, as a cluster node forwards a client to the owner of
// an instance: when the server's side of a socket ends, the client's is
// closed with 1012 (service restart), and while it points nowhere every
// request is answered 503. Armed with holdOffer, it holds the next stream
// offer sent without a probe id (a server's offer on connect) on its way
// to the client until releaseOffer. acks receives the id of every resume
// acknowledgement once it is passed to the server, answers the id of every
// stream offer answering a probe once it is passed to the client.
type relay struct {
	srv     *httptest.Server
	ctx     context.Context // canceled by close: ends every bridge
	cancel  context.CancelFunc
	held    chan string // the id of the offer held
	acks    chan string
	answers chan string

	mu      sync.Mutex
	target  string        // host:port of the server; "" answers 503
	arm     bool          // hold the next offer
	release chan struct{} // closed by releaseOffer
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &relay{ctx: ctx, cancel: cancel, target: target, held: make(chan string, 1), acks: make(chan string, 16),
		answers: make(chan string, 16), release: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		r.cancel()
		r.srv.Close()
	})
	return r
}

func (r *relay) addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *relay) point(target string) {
	r.mu.Lock()
	r.target = target
	r.mu.Unlock()
}

func (r *relay) holdOffer() {
	r.mu.Lock()
	r.arm = true
	r.mu.Unlock()
}

func (r *relay) releaseOffer() { close(r.release) }

func (r *relay) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	target := r.target
	r.mu.Unlock()
	if target == "" {
		http.Error(w, "no server to relay to", http.StatusServiceUnavailable)
		return
	}
	if !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
		httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: target}).ServeHTTP(w, req)
		return
	}
	server, _, err := websocket.Dial(req.Context(), "ws://"+target+req.URL.RequestURI(), nil)
	if err != nil {
		http.Error(w, "server unreachable: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	client, err := websocket.Accept(w, req, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		server.CloseNow()
		return
	}
	client.SetReadLimit(-1)
	server.SetReadLimit(-1)
	ctx, stop := context.WithCancel(r.ctx)
	defer stop()
	errc := make(chan error, 2)
	go func() { errc <- r.pump(ctx, client, server, true) }()
	go func() { errc <- r.pump(ctx, server, client, false) }()
	<-errc
	client.Close(websocket.StatusServiceRestart, "relay: server side ended")
	server.CloseNow()
	stop()
	<-errc
}

// pump copies frames from src to dst; toClient says src is the server.
func (r *relay) pump(ctx context.Context, dst, src *websocket.Conn, toClient bool) error {
	for {
		typ, data, err := src.Read(ctx)
		if err != nil {
			return err
		}
		var f struct {
			Type    string `json:"type"`
			ID      string `json:"id"`
			ProbeID string `json:"probeId"`
		}
		_ = json.Unmarshal(data, &f)
		if toClient && f.Type == wire.StreamResuming && f.ProbeID == "" {
			r.mu.Lock()
			hold := r.arm
			r.arm = false
			r.mu.Unlock()
			if hold {
				r.held <- f.ID
				select {
				case <-r.release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		if err := dst.Write(ctx, typ, data); err != nil {
			return err
		}
		var report chan string
		switch {
		case !toClient && f.Type == wire.StreamResumeAck:
			report = r.acks
		case toClient && f.Type == wire.StreamResuming && f.ProbeID != "":
			report = r.answers
		}
		if report != nil {
			select {
			case report <- f.ID:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}
