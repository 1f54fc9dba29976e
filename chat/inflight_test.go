package chat_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

// TestTurnsInFlightBounded: the runtime counts the chat turns of every
// instance, running or queued, from acceptance to end; past
// Config.MaxTurnsInFlight a client's chat request is refused at once with
// an error response naming the limit, whichever instance it goes to. A
// cancelled turn (running or queued) and an ended one give their slot back
// before their terminal frame, so a client that waits for the end is not
// refused.
func TestTurnsInFlightBounded(t *testing.T) {
	q := startHeld(t, chat.Config{MaxTurnsInFlight: 2})
	a, b, c := q.client(t, "a"), q.client(t, "b"), q.client(t, "c")
	refused := func(ws *wsClient, id string) {
		t.Helper()
		fs := ws.until(isDone(id))
		if last := fs[len(fs)-1]; !last.Failed() || !strings.Contains(last.Body, "too many chat turns are in flight on this server") ||
			!strings.Contains(last.Body, "limit is 2") {
			t.Fatalf("%s ended with %s, want the turns-in-flight error", id, last.Raw)
		}
	}
	cancel := func(ws *wsClient, id string) {
		t.Helper()
		ws.send(map[string]any{"type": wire.ChatCancel, "id": id})
		if fs := ws.until(isDone(id)); fs[len(fs)-1].Outcome != "aborted" {
			t.Fatalf("%s ended with %s, want aborted", id, fs[len(fs)-1].Raw)
		}
	}
	inFlight := func(want int) {
		t.Helper()
		if n := chat.InFlightTurns(q.env.RT); n != want {
			t.Fatalf("%d turns in flight, want %d", n, want)
		}
	}
	// full: with two turns in flight, b's request id is refused.
	full := func(id string, msg message.Message) {
		t.Helper()
		inFlight(2)
		b.request(id, msg)
		refused(b, id)
	}

	// Two running turns on two instances fill the node.
	a.request("r0", userMsgID("u0", "first"))
	<-q.started
	c.request("r1", userMsgID("w0", "second"))
	<-q.started
	full("s0", userMsgID("v0", "one too many"))

	// Cancelling a running turn frees its slot before its end frame.
	cancel(c, "r1")
	inFlight(1)

	// A queued turn counts too: a's frames are handled in order, so once
	// the resume probe sent after r2 is answered, r2 is queued behind r0.
	// (The answer offers r0's stream; acknowledging it goes on with r0.)
	a.request("r2", userMsgID("u1", "queued"))
	a.probe("p")
	if f := a.until(func(f frame) bool { return f.ProbeID == "p" }); f[len(f)-1].ID != "r0" {
		t.Fatalf("probe answer %s, want the offer of r0", f[len(f)-1].Raw)
	}
	a.ack("r0")
	full("s1", userMsgID("v1", "still too many"))
	cancel(a, "r2")
	inFlight(1)
	b.request("s2", userMsgID("v2", "now there is room"))
	<-q.started

	close(q.release)
	for _, x := range []struct {
		ws *wsClient
		id string
	}{{a, "r0"}, {b, "s2"}} {
		fs := x.ws.until(isDone(x.id))
		if end := fs[len(fs)-1]; end.Failed() || end.Outcome != "completed" {
			t.Fatalf("%s ended with %s, want completed", x.id, end.Raw)
		}
	}
	inFlight(0)
}

// heldQueue is a runtime whose "Queue" class holds every turn: a turn
// signals started, then waits until release is closed (or its context
// ends) and answers "ok".
type heldQueue struct {
	env     *testenv.Env
	started chan struct{}
	release chan struct{}
}

func startHeld(t *testing.T, cfg chat.Config) *heldQueue {
	t.Helper()
	q := &heldQueue{started: make(chan struct{}, 8), release: make(chan struct{})}
	k := &kit{handle: func(ctx context.Context, tt *chat.Turn) error {
		q.started <- struct{}{}
		if err := agent.Await(ctx, func() error {
			select {
			case <-q.release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}); err != nil {
			return err
		}
		return tt.WriteText("ok")
	}}
	q.env, _ = startEnv(t, "", clockwork.NewFakeClock(), cfg, handlerClass("Queue", k))
	return q
}

// client dials the Queue instance named name and completes the handshake.
func (q *heldQueue) client(t *testing.T, name string) *wsClient {
	t.Helper()
	c := dialReady(t, q.env, "/agents/queue/"+name)
	return c
}
