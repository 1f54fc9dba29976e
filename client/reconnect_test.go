package client_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// TestTranscriptReadyOnDial: the transcript is known when Dial returns,
// every time (it used to arrive a moment later, in about 5 of 8 dials).
func TestTranscriptReadyOnDial(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	c := dial(t, env, client.Options{Agent: "EchoChat", Name: "ready", Chat: true})
	s, err := c.Chat().Send(ctx, "remember me")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		c2, err := client.Dial(ctx, client.Options{Host: env.Host, Agent: "EchoChat", Name: "ready", Chat: true})
		if err != nil {
			t.Fatal(err)
		}
		tr := c2.Chat().Transcript()
		c2.Close()
		if len(tr) != 2 || chat.MessageText(tr[0]) != "remember me" {
			t.Fatalf("dial %d: transcript right after Dial = %+v, want the 2 messages", i, tr)
		}
	}
	// An agent without a chat counts as an empty one.
	cc := dial(t, env, client.Options{Agent: "Counter", Name: "ready", Chat: true})
	if tr := cc.Chat().Transcript(); len(tr) != 0 {
		t.Errorf("Counter transcript = %+v", tr)
	}
}

// reconnecting returns Options that reconnect through p on rclk (first
// attempt at once, then every second of rclk), with channels that receive
// each disconnect and reconnect.
func reconnecting(p *testenv.Proxy, rclk clockwork.Clock, o client.Options) (client.Options, chan error, chan struct{}) {
	lost, back := make(chan error, 8), make(chan struct{}, 8)
	o.Host, o.Chat = p.Addr(), true
	o.Reconnect = &client.Reconnect{MinDelay: time.Second, Growth: 1, Clock: rclk,
		OnDisconnect: func(err error) { lost <- err }, OnReconnect: func() { back <- struct{}{} }}
	return o, lost, back
}

func recv[T any](t *testing.T, ctx context.Context, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("no %s", what)
		panic("unreachable")
	}
}

// TestReconnectResumesTurn drops the network while a turn streams: the
// Conn reconnects and the turn's stream resumes from the chunks the server
// stored, each applied once, then ends live with the whole answer. Calls
// work on the new socket.
func TestReconnectResumesTurn(t *testing.T) {
	clk := clockwork.NewFakeClock()
	env := start(t, clk)
	ctx := testCtx(t)
	p := testenv.StartProxy(t, env.Host)
	o, lost, back := reconnecting(p, clockwork.NewFakeClock(), client.Options{Agent: "EchoChat", Name: "drop"})
	c, err := client.Dial(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := streamOnFakeClock(t, ctx, c, "survive a network drop")
	p.Cut()
	var ce *client.CloseError
	if err := recv(t, ctx, lost, "disconnect"); !errors.As(err, &ce) || ce.Terminal() {
		t.Fatalf("disconnect error %v, want a non-terminal CloseError", err)
	}
	recv(t, ctx, back, "reconnect") // the first attempt is immediate
	if c.Err() != nil {
		t.Fatalf("Err after a reconnect = %v", c.Err())
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		advance(ctx, clk, stop)
	}()
	r, err := s.Wait(ctx)
	close(stop)
	<-done
	if err != nil || r.Outcome != client.OutcomeCompleted {
		t.Fatalf("resumed turn = %+v, %v", r, err)
	}
	if got := chat.MessageText(r.Message); got != "You said: survive a network drop" {
		t.Fatalf("resumed text %q: chunks lost or applied twice", got)
	}
	if tr := c.Chat().Transcript(); len(tr) != 2 || tr[1].ID != r.Message.ID {
		t.Errorf("transcript after the resumed turn = %+v", tr)
	}
	if _, err := c.Call(ctx, "nope"); err == nil || errors.As(err, &ce) {
		t.Errorf("call on the new socket: %v, want the server's RPC error", err)
	}
}

// TestReconnectAfterTurnEnded: the turn finishes while the client is away
// (the first attempt is refused, the next waits on the clock); on the new
// socket its stream replays from storage to its stored outcome.
func TestReconnectAfterTurnEnded(t *testing.T) {
	clk := clockwork.NewFakeClock()
	env := start(t, clk)
	ctx := testCtx(t)
	ended := make(chan struct{}, 4)
	unsub := env.RT.Diag().Subscribe(diag.ChannelChat, func(e diag.Event) {
		if e.Type == "turn" {
			ended <- struct{}{}
		}
	})
	defer unsub()
	p := testenv.StartProxy(t, env.Host)
	rclk := clockwork.NewFakeClock()
	o, lost, back := reconnecting(p, rclk, client.Options{Agent: "EchoChat", Name: "away"})
	c, err := client.Dial(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := streamOnFakeClock(t, ctx, c, "finish without me")
	p.SetRefuse(true)
	p.Cut()
	recv(t, ctx, lost, "disconnect")
	// The immediate attempt fails; the next one waits a second of rclk.
	if err := rclk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if c.Connected() {
		t.Fatal("connected through a proxy that refuses")
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		advance(ctx, clk, stop)
	}()
	recv(t, ctx, ended, "end of the turn")
	close(stop)
	<-done
	if _, ok := s.Result(); ok {
		t.Fatal("the stream ended while the client was away")
	}
	p.SetRefuse(false)
	rclk.Advance(time.Second)
	recv(t, ctx, back, "reconnect")
	r, err := s.Wait(ctx)
	if err != nil || r.Outcome != client.OutcomeCompleted || chat.MessageText(r.Message) != "You said: finish without me" {
		t.Fatalf("turn replayed from storage = %+v, %v", r, err)
	}
}

// TestReconnectResendsLostRequest: a turn whose request never reached the
// server (the network dropped it) is sent again on the new socket, once:
// the server runs it once and the stream ends with its answer.
func TestReconnectResendsLostRequest(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	p := testenv.StartProxy(t, env.Host)
	o, lost, back := reconnecting(p, clockwork.NewFakeClock(), client.Options{Agent: "EchoChat", Name: "lost-request"})
	c, err := client.Dial(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.SetDrop(true)
	s, err := c.Chat().Send(ctx, "did you get this?")
	if err != nil {
		t.Fatal(err)
	}
	recv(t, ctx, p.Dropped, "dropped request")
	p.SetDrop(false)
	p.Cut()
	recv(t, ctx, lost, "disconnect")
	recv(t, ctx, back, "reconnect")
	r, err := s.Wait(ctx)
	if err != nil || r.Outcome != client.OutcomeCompleted || chat.MessageText(r.Message) != "You said: did you get this?" {
		t.Fatalf("resent turn = %+v, %v", r, err)
	}
	msgs, err := c.Chat().Messages(ctx)
	if err != nil || len(msgs) != 2 {
		t.Fatalf("server transcript = %+v, %v; want the turn once", msgs, err)
	}
}

// TestReconnectRefused: a server that refuses the new socket for good (a
// 4xxx close code) ends the Conn with that error instead of retrying.
func TestReconnectRefused(t *testing.T) {
	var mu sync.Mutex
	refuse := false
	env := start(t, nil, func(o *testenv.Options) {
		o.Server.Authorize = func(r *http.Request, p agent.Path) error {
			mu.Lock()
			defer mu.Unlock()
			if refuse {
				return &agent.CloseError{Code: 4003, Reason: "forbidden"}
			}
			return nil
		}
	})
	ctx := testCtx(t)
	p := testenv.StartProxy(t, env.Host)
	o, lost, _ := reconnecting(p, clockwork.NewFakeClock(), client.Options{Agent: "Counter", Name: "refused"})
	c, err := client.Dial(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mu.Lock()
	refuse = true
	mu.Unlock()
	p.Cut()
	recv(t, ctx, lost, "disconnect")
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("the Conn kept retrying a refusal")
	}
	var ce *client.CloseError
	if err := c.Err(); !errors.As(err, &ce) || ce.Code != 4003 || !ce.Terminal() {
		t.Fatalf("Err = %v, want the terminal CloseError 4003", err)
	}
	if _, err := c.Call(ctx, "get"); !errors.As(err, &ce) {
		t.Errorf("call after the refusal: %v", err)
	}
}

// TestReconnectClose: Close during the wait between attempts stops the
// reconnect at once.
func TestReconnectClose(t *testing.T) {
	env := start(t, nil)
	ctx := testCtx(t)
	p := testenv.StartProxy(t, env.Host)
	rclk := clockwork.NewFakeClock()
	o, lost, _ := reconnecting(p, rclk, client.Options{Agent: "Counter", Name: "close"})
	c, err := client.Dial(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	p.SetRefuse(true)
	p.Cut()
	recv(t, ctx, lost, "disconnect")
	if err := rclk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// A call waits for the socket, and fails when the Conn is closed.
	called := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, "get")
		called <- err
	}()
	c.Close()
	if err := recv(t, ctx, called, "call result"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("call while reconnecting, then Close: %v, want ErrClosed", err)
	}
	if !errors.Is(c.Err(), client.ErrClosed) {
		t.Errorf("Err = %v", c.Err())
	}
}
