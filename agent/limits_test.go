package agent_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/wire"
)

func rpcFrame(id, method string) []byte {
	return []byte(fmt.Sprintf(`{"type":"rpc","id":%q,"method":%q,"args":[]}`, id, method))
}

// Calls beyond MaxCallsPerConn on one connection are refused with an error
// response at once, while the reader goes on: the connection's later
// frames are handled, the calls in flight finish, and once they have, new
// calls are taken again. A client that waits for each response before its
// next call is never refused.
func TestCallsInFlightPerConnBounded(t *testing.T) {
	const max = 4
	h := newHooks()
	e := startRuntime(t, rtOptions{maxCalls: max, classes: []agent.Class{probeClass(h)}})
	ev := record(t, e.rt.Diag(), diag.ChannelRPC)
	ctx := context.Background()
	tr := newTransport()
	conn, err := e.rt.Connect(ctx, agent.Root("Probe", "calls"), "c1", nil, tr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Disconnect(1000, "")
	tr.next(t) // identity
	tr.next(t) // MCP servers

	// A client that waits for each response is never refused.
	for i := range 3 * max {
		conn.HandleFrame(ctx, rpcFrame(fmt.Sprintf("seq-%d", i), "echo"))
		if f := tr.next(t); f["success"] != true {
			t.Fatalf("sequential call %d: %v", i, f)
		}
	}

	for i := range max {
		conn.HandleFrame(ctx, rpcFrame(fmt.Sprintf("park-%d", i), "park"))
		select {
		case <-h.entered:
		case <-time.After(waitLimit):
			t.Fatalf("parked call %d never started", i)
		}
	}
	const extra = 10
	for i := range extra {
		conn.HandleFrame(ctx, rpcFrame(fmt.Sprintf("over-%d", i), "echo"))
		ev.wait(t, "refuse", "Probe/calls")
	}
	// The reader was not held up: a frame after the refused calls is
	// handled (answered after their refusals).
	conn.HandleFrame(ctx, []byte(`{"type":"later"}`))
	for i := range extra {
		f := tr.next(t)
		if f["type"] != wire.RPC || f["id"] != fmt.Sprintf("over-%d", i) || f["success"] != false {
			t.Fatalf("response %d = %v, want a refusal of over-%d", i, f, i)
		}
		if msg, _ := f["error"].(string); !strings.Contains(msg, "too many calls in flight") || !strings.Contains(msg, "4") {
			t.Fatalf("refusal error %q", msg)
		}
	}
	if f := tr.next(t); f["type"] != wire.Error || f["code"] != "unknown_type" {
		t.Fatalf("frame after the refusals = %v, want the later frame's error", f)
	}
	close(h.release)
	got := map[string]bool{}
	for range max {
		f := tr.next(t)
		if f["success"] != true || f["result"] != "parked" {
			t.Fatalf("parked call ended with %v", f)
		}
		got[f["id"].(string)] = true
	}
	if len(got) != max {
		t.Fatalf("parked responses %v", got)
	}
	// Slots were given back: a full set of parallel calls is taken again.
	for i := range max {
		conn.HandleFrame(ctx, rpcFrame(fmt.Sprintf("again-%d", i), "park"))
	}
	for i := range max {
		if f := tr.next(t); f["success"] != true {
			t.Fatalf("call %d after the slots were freed: %v", i, f)
		}
	}
}

// With MaxInstances resident, hydrating one more evicts the least recently
// used idle instance (not the oldest created), with an evict event.
func TestMaxInstancesEvictsLeastRecentlyUsed(t *testing.T) {
	h := newHooks()
	e := newRuntime(t, rtOptions{maxInstances: 3, classes: []agent.Class{probeClass(h)}})
	ev := record(t, e.rt.Diag(), diag.ChannelAgent)
	e.start()
	ctx := context.Background()
	a, b, c, d := agent.Root("Probe", "a"), agent.Root("Probe", "b"), agent.Root("Probe", "c"), agent.Root("Probe", "d")
	for _, p := range []agent.Path{a, b, c} {
		if _, err := e.rt.Call(ctx, p, "bump", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.rt.Call(ctx, a, "bump", 1); err != nil { // a is used again: b is now the LRU
		t.Fatal(err)
	}
	ev.drain()
	if _, err := e.rt.Call(ctx, d, "bump", 1); err != nil {
		t.Fatal(err)
	}
	got := ev.wait(t, "evict", "")
	if got.Agent != b.String() || got.Attrs["reason"] != "max_instances" {
		t.Fatalf("evicted %s (%v), want %s for max_instances", got.Agent, got.Attrs, b)
	}
	if n := e.rt.ResidentCount(); n != 3 {
		t.Fatalf("ResidentCount = %d, want 3", n)
	}
	for _, p := range []agent.Path{a, c, d} {
		if !e.rt.Resident(p) {
			t.Errorf("%s not resident", p)
		}
	}
	// b comes back with its state, evicting c (now the LRU).
	res, err := e.rt.Call(ctx, b, "bump", 1)
	if err != nil || string(res) != "2" {
		t.Fatalf("bump b after eviction = %s, %v; want 2", res, err)
	}
	if got := ev.wait(t, "evict", ""); got.Agent != c.String() {
		t.Fatalf("evicted %s, want %s", got.Agent, c)
	}
}

// When every resident instance is in use (a connection, a pin, a call in
// flight), hydrating another fails at once with ErrTooManyInstances, and
// nothing in use is evicted; once one is idle again, the hydration works.
func TestMaxInstancesAllInUse(t *testing.T) {
	h := newHooks()
	e := startRuntime(t, rtOptions{maxInstances: 3, classes: []agent.Class{probeClass(h)}})
	ctx := context.Background()
	conn, err := e.rt.Connect(ctx, agent.Root("Probe", "connected"), "c1", nil, newTransport())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Disconnect(1000, "")
	_, release, err := e.rt.Acquire(ctx, agent.Root("Probe", "pinned"))
	if err != nil {
		t.Fatal(err)
	}
	callDone := make(chan error, 1)
	go func() {
		_, err := e.rt.Call(ctx, agent.Root("Probe", "calling"), "wait")
		callDone <- err
	}()
	select {
	case <-h.entered:
	case <-time.After(waitLimit):
		t.Fatal("the call never started")
	}

	_, err = e.rt.Call(ctx, agent.Root("Probe", "extra"), "echo", 1)
	if !errors.Is(err, agent.ErrTooManyInstances) {
		t.Fatalf("Call with every instance in use = %v, want ErrTooManyInstances", err)
	}
	if _, err := e.rt.Connect(ctx, agent.Root("Probe", "extra"), "c2", nil, newTransport()); !errors.Is(err, agent.ErrTooManyInstances) {
		t.Fatalf("Connect with every instance in use = %v, want ErrTooManyInstances", err)
	}
	for _, n := range []string{"connected", "pinned", "calling"} {
		if !e.rt.Resident(agent.Root("Probe", n)) {
			t.Fatalf("%s was evicted while in use", n)
		}
	}
	if e.rt.Resident(agent.Root("Probe", "extra")) || e.rt.ResidentCount() != 3 {
		t.Fatalf("refused instance resident, count %d", e.rt.ResidentCount())
	}

	release()
	if res, err := e.rt.Call(ctx, agent.Root("Probe", "extra"), "echo", 7); err != nil || string(res) != "7" {
		t.Fatalf("Call after a release = %s, %v", res, err)
	}
	if e.rt.Resident(agent.Root("Probe", "pinned")) {
		t.Fatal("the released instance was not the one evicted")
	}
	close(h.release)
	if err := <-callDone; err != nil {
		t.Fatal(err)
	}
}

// A schedule that comes due while its instance cannot be hydrated (every
// resident instance in use) is not lost: it fires once there is room,
// scheduleRetry (1 s) later.
func TestScheduleWaitsForRoom(t *testing.T) {
	h := newHooks()
	e := newRuntime(t, rtOptions{maxInstances: 1, classes: []agent.Class{probeClass(h)}})
	ev := record(t, e.rt.Diag(), diag.ChannelSchedule)
	e.start()
	ctx := context.Background()
	path := agent.Root("Probe", "sched")
	p := getProbe(t, e.rt, path)
	if _, err := p.ScheduleAfter(ctx, time.Minute, "Tick", Payload{N: 1}); err != nil {
		t.Fatal(err)
	}
	_, release, err := e.rt.Acquire(ctx, agent.Root("Probe", "pinned")) // evicts sched, takes the only room
	if err != nil {
		t.Fatal(err)
	}
	if e.rt.Resident(path) {
		t.Fatal("the scheduled instance is still resident")
	}
	e.blockUntil(1)
	e.clock.Advance(time.Minute)
	fire := ev.wait(t, "fire", path.String())
	if msg, _ := fire.Attrs["error"].(string); !strings.Contains(msg, "too many instances") {
		t.Fatalf("fire event %v, want the ErrTooManyInstances error", fire.Attrs)
	}
	select {
	case f := <-h.fired:
		t.Fatalf("%s ran without room", f.method)
	default:
	}
	release()
	e.blockUntil(1)
	e.clock.Advance(time.Second)
	if f := h.nextFired(t); f.method != "Tick" || f.payload.N != 1 || f.path != path.String() {
		t.Fatalf("fired %+v", f)
	}
	if fire := ev.wait(t, "fire", path.String()); fire.Attrs["error"] != nil {
		t.Fatalf("second fire %v", fire.Attrs)
	}
}
