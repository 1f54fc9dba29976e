package chat_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
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
	started := make(chan struct{}, 8)
	release := make(chan struct{})
	k := &kit{handle: func(ctx context.Context, tt *chat.Turn) error {
		started <- struct{}{}
		if err := agent.Await(ctx, func() error {
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}); err != nil {
			return err
		}
		return tt.WriteText("ok")
	}}
	env, _ := startEnv(t, "", clockwork.NewFakeClock(), chat.Config{MaxTurnsInFlight: 2}, handlerClass("Queue", k))
	a := dial(t, env, "/agents/queue/a")
	a.handshake()
	b := dial(t, env, "/agents/queue/b")
	b.handshake()
	c := dial(t, env, "/agents/queue/c")
	c.handshake()
	refused := func(ws *wsClient, id string) {
		t.Helper()
		fs := ws.until(isDone(id))
		if last := fs[len(fs)-1]; !last.Failed() || !strings.Contains(last.Body, "too many chat turns are in flight on this server") ||
			!strings.Contains(last.Body, "limit is 2") {
			t.Fatalf("%s ended with %s, want the turns-in-flight error", id, last.Raw)
		}
	}
	inFlight := func(want int) {
		t.Helper()
		if n := chat.InFlightTurns(env.RT); n != want {
			t.Fatalf("%d turns in flight, want %d", n, want)
		}
	}

	// Two running turns on two instances fill the node.
	a.request("r0", userMsgID("u0", "first"))
	<-started
	c.request("r1", userMsgID("w0", "second"))
	<-started
	inFlight(2)
	b.request("s0", userMsgID("v0", "one too many"))
	refused(b, "s0")

	// Cancelling a running turn frees its slot before its end frame.
	c.send(map[string]any{"type": wire.ChatCancel, "id": "r1"})
	if fs := c.until(isDone("r1")); fs[len(fs)-1].Outcome != "aborted" {
		t.Fatalf("r1 ended with %s, want aborted", fs[len(fs)-1].Raw)
	}
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
	inFlight(2)
	b.request("s1", userMsgID("v1", "still too many"))
	refused(b, "s1")
	a.send(map[string]any{"type": wire.ChatCancel, "id": "r2"})
	if fs := a.until(isDone("r2")); fs[len(fs)-1].Outcome != "aborted" {
		t.Fatalf("r2 ended with %s, want aborted", fs[len(fs)-1].Raw)
	}
	inFlight(1)
	b.request("s2", userMsgID("v2", "now there is room"))
	<-started

	close(release)
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
