package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/wire"
)

// heapNow returns the live heap and the goroutine stacks (which are not on
// the heap) after two collections.
func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}

// events collects diag events of one channel.
func events(t *testing.T, env *testenv.Env, channel string) chan diag.Event {
	t.Helper()
	ch := make(chan diag.Event, 1024)
	unsub := env.RT.Diag().Subscribe(channel, func(ev diag.Event) {
		select {
		case ch <- ev:
		default:
			t.Errorf("diag recorder for %s overflowed", channel)
		}
	})
	t.Cleanup(unsub)
	return ch
}

func waitEvent(t *testing.T, ch chan diag.Event, typ string) diag.Event {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case ev := <-ch:
			if ev.Type == typ {
				return ev
			}
		case <-deadline:
			t.Fatalf("timed out waiting for diag event %s", typ)
			return diag.Event{}
		}
	}
}

// rawDial opens a WebSocket that nothing reads until the test does.
func rawDial(t *testing.T, env *testenv.Env, path string) *websocket.Conn {
	t.Helper()
	return testenv.DialRaw(t, waitLimit, env.URL(path))
}

// pipelinedBound is the stated bound of the heap that 40,000 pipelined
// calls to an awaiting method on one socket may add (64 calls in flight
// and the refusals' response frames). Unbounded, they added about 670 MB.
const pipelinedBound = 8 << 20

// 40,000 RPCs pipelined on one socket to a method that waits at an await
// point: 64 (the default MaxCallsPerConn) are in flight, every other one
// is refused with an error response, and neither the server's heap nor its
// goroutines grow with the number of frames. The socket stays open and
// usable, and another client is served meanwhile.
func TestPipelinedRPCsBounded(t *testing.T) {
	release := make(chan struct{})
	parked := make(chan struct{}, agent.DefaultMaxCallsPerConn)
	env := testenv.Start(t, testenv.Options{Classes: []agent.Class{testenv.ParkerClass(release, parked)}})
	const total = 40_000
	const inFlight = agent.DefaultMaxCallsPerConn

	c := rawDial(t, env, "/agents/parker/flood")
	for range 2 { // identity, MCP servers
		if _, _, err := c.Read(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	heap0, goroutines0 := heapNow(), runtime.NumGoroutine()

	type result struct{ refused, succeeded int }
	refusedAll := make(chan struct{})
	results := make(chan result, 1)
	go func() {
		var r result
		defer func() { results <- r }()
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				return
			}
			// Cheap checks: the flood's frames are many.
			switch {
			case bytes.Contains(data, []byte(`"success":true`)) && bytes.Contains(data, []byte(`"result":"released"`)):
				r.succeeded++
				if r.succeeded == inFlight {
					return
				}
			case bytes.Contains(data, []byte(`"success":false`)) && bytes.Contains(data, []byte("too many calls in flight")):
				r.refused++
				if r.refused == total-inFlight {
					close(refusedAll)
				}
			default:
				t.Errorf("unexpected response %s", data)
				return
			}
		}
	}()
	ctx := context.Background()
	for i := range total {
		frame := fmt.Appendf(nil, `{"type":%q,"id":"p%d","method":"park","args":[]}`, wire.RPC, i)
		if err := c.Write(ctx, websocket.MessageText, frame); err != nil {
			t.Fatalf("write call %d: %v", i, err)
		}
	}
	select {
	case <-refusedAll:
	case r := <-results:
		t.Fatalf("reader stopped early: %+v", r)
	case <-time.After(time.Minute):
		t.Fatal("the refusals did not all arrive")
	}
	for range inFlight {
		<-parked // every admitted call is waiting
	}
	heap1, goroutines1 := heapNow(), runtime.NumGoroutine()
	grown := int64(heap1) - int64(heap0)
	t.Logf("%d calls pipelined: heap +%.1f MiB, goroutines +%d", total, float64(grown)/(1<<20), goroutines1-goroutines0)
	if grown > pipelinedBound {
		t.Errorf("heap grew by %d bytes with %d pipelined calls, want at most %d", grown, total, pipelinedBound)
	}
	if g := goroutines1 - goroutines0; g > inFlight+16 {
		t.Errorf("%d more goroutines with %d calls in flight: one per frame?", g, inFlight)
	}

	// Another client, even of the same instance, is answered meanwhile.
	other := dial(t, env, "/agents/parker/flood")
	other.handshake()
	if got := other.ok("ping"); got != "pong" {
		t.Fatalf("ping = %v", got)
	}

	close(release)
	r := <-results
	if r.refused != total-inFlight || r.succeeded != inFlight {
		t.Fatalf("refused %d and succeeded %d, want %d and %d", r.refused, r.succeeded, total-inFlight, inFlight)
	}
	// The flooding socket itself was throttled, not closed.
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"`+wire.RPC+`","id":"last","method":"ping","args":[]}`)); err != nil {
		t.Fatal(err)
	}
	_, data, err := c.Read(ctx)
	if err != nil || !strings.Contains(string(data), `"result":"pong"`) {
		t.Fatalf("call after the flood = %s, %v", data, err)
	}
}

// budgetBound is the heap that the send queues may add beyond the budget
// itself: one frame being written per socket and the sockets' buffers.
const budgetBound = 16 << 20

// 30 clients that do not read their 20 MiB connect replay: the queues'
// total never passes the server's send budget (64 MiB here), the largest
// queues are closed with 1013 (and freed) while the rest are delivered
// complete and in order, and the heap stays within the budget.
func TestSlowReadersWithinSendBudget(t *testing.T) {
	const (
		clients    = 30
		frames     = 320
		frameBytes = 64 << 10 // 320 × 64 KiB = 20 MiB
		budget     = 64 << 20
	)
	sent := make(chan string, clients)
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{testenv.ReplayerClass(testenv.ReplayOptions{Frames: frames, FrameBytes: frameBytes, Sent: sent})},
		// A long write timeout: a shed socket's writer is finishing the
		// frame it was writing when the client starts reading again.
		Server: server.Options{SendBudgetBytes: budget, WriteTimeout: 5 * time.Minute},
	})
	shed := events(t, env, diag.ChannelServer)
	heap0 := heapNow()
	conns := make([]*websocket.Conn, clients)
	for i := range conns {
		conns[i] = rawDial(t, env, fmt.Sprintf("/agents/replayer/big?_pk=c%d", i))
		select {
		case <-sent:
		case <-time.After(waitLimit):
			t.Fatalf("replay %d was not queued", i)
		}
		if q := env.Server.QueuedBytes(); q > budget {
			t.Fatalf("send queues hold %d bytes, over the budget of %d", q, budget)
		}
	}
	grown := int64(heapNow()) - int64(heap0)
	t.Logf("%d slow readers of a %d MiB replay: heap +%.1f MiB, queued %.1f MiB", clients, frames*frameBytes>>20,
		float64(grown)/(1<<20), float64(env.Server.QueuedBytes())/(1<<20))
	if grown > budget+budgetBound {
		t.Errorf("heap grew by %d bytes, want at most the budget %d + %d", grown, budget, budgetBound)
	}

	// Now every client reads: each gets its replay complete and in order,
	// or an in-order prefix and then 1013.
	type outcome struct {
		got  int
		code websocket.StatusCode
		err  error
	}
	outcomes := make([]outcome, clients)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &outcomes[i]
			ctx := context.Background()
			for range 2 { // identity, MCP servers
				if _, _, err := c.Read(ctx); err != nil {
					o.code, o.err = websocket.CloseStatus(err), err
					return
				}
			}
			for o.got < frames {
				_, data, err := c.Read(ctx)
				if err != nil {
					o.code, o.err = websocket.CloseStatus(err), err
					return
				}
				want := fmt.Appendf(nil, `{"type":"replay","i":%d,"pad":"x`, o.got)
				if !bytes.HasPrefix(data, want) || len(data) != frameBytes-40+len(want)+1 || !bytes.HasSuffix(data, []byte(`x"}`)) {
					o.err = fmt.Errorf("frame %d: %.40s… (%d bytes)", o.got, data, len(data))
					return
				}
				o.got++
			}
		}()
	}
	wg.Wait()
	complete, closed := 0, 0
	for i, o := range outcomes {
		switch {
		case o.got == frames && o.err == nil:
			complete++
		case o.code == websocket.StatusTryAgainLater:
			closed++
		default:
			t.Errorf("client %d: %d frames, then %v", i, o.got, o.err)
		}
	}
	t.Logf("%d complete, %d closed with 1013", complete, closed)
	if complete == 0 || closed < clients-budget/(frames*frameBytes)-1 {
		t.Errorf("%d complete and %d closed with 1013; want some complete and the rest closed", complete, closed)
	}
	for range closed {
		waitEvent(t, shed, "shed")
	}
}

// Beyond MaxConnections, an upgrade is refused with 503 and Retry-After;
// once a connection closed, a new one is accepted.
func TestMaxConnections(t *testing.T) {
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{counter.Class()},
		Server:  server.Options{MaxConnections: 3},
	})
	ev := events(t, env, diag.ChannelServer)
	var open []*client
	for i := range 3 {
		c := dial(t, env, fmt.Sprintf("/agents/counter/c%d", i))
		c.handshake()
		open = append(open, c)
	}
	_, resp, err := tryDial(t, env, "/agents/counter/over")
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("fourth upgrade: %v, %+v; want 503 with Retry-After", err, resp)
	}
	waitEvent(t, ev, "refuse")
	if n := env.Server.Connections(); n != 3 {
		t.Fatalf("Connections = %d, want 3", n)
	}
	// The open ones still work.
	if got := open[0].ok("get"); got != 0.0 {
		t.Fatalf("get = %v", got)
	}
	open[1].c.Close(websocket.StatusNormalClosure, "")
	if n := waitEvent(t, ev, "close").Attrs["connections"]; n != 2 {
		t.Fatalf("connections after a close = %v, want 2", n)
	}
	c := dial(t, env, "/agents/counter/over")
	c.handshake()
}

// With every resident instance in use, a WebSocket to another one is
// closed with 1013 (try again later) and an HTTP request answers 503;
// once an instance is idle again, both work.
func TestMaxInstancesOverWebSocket(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Classes: []agent.Class{counter.Class()}, MaxInstances: 1})
	ev := events(t, env, diag.ChannelServer)
	a := dial(t, env, "/agents/counter/a")
	a.handshake()
	b := dial(t, env, "/agents/counter/b")
	if code, reason := b.closed(); code != websocket.StatusTryAgainLater {
		t.Fatalf("connection beyond MaxInstances closed with %v %q, want 1013", code, reason)
	}
	waitEvent(t, ev, "close")
	if status, _ := get(t, env, "/agents/counter/b"); status != http.StatusServiceUnavailable {
		t.Fatalf("HTTP beyond MaxInstances = %d, want 503", status)
	}
	a.c.Close(websocket.StatusNormalClosure, "")
	waitEvent(t, ev, "close")
	b = dial(t, env, "/agents/counter/b")
	b.handshake()
	if got := b.ok("get"); got != 0.0 {
		t.Fatalf("get = %v", got)
	}
}
