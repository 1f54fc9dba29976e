package agent_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/wire"
)

// An idle instance leaves memory once the idle timeout passed on the clock
// (by the background loop, not before), and the next use rehydrates it: a
// new OnStart, with state, KV and private SQL tables intact.
func TestEvictionRehydratesWithStorageIntact(t *testing.T) {
	const idle = time.Minute
	h, e, ev := startProbes(t, idle)
	ctx := context.Background()
	path := agent.Root("Probe", "idle")

	p := getProbe(t, e.rt, path)
	if got := h.starts.Load(); got != 1 {
		t.Fatalf("OnStart ran %d times on first use, want 1", got)
	}
	if _, err := p.Bump(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if err := p.Storage().Put(ctx, "greeting", map[string]string{"hi": "there"}); err != nil {
		t.Fatal(err)
	}
	writeNote(t, p, "remember me")
	ev.wait(t, "start", path.String())

	e.blockUntil(1) // the eviction ticker
	e.clock.Advance(idle / 2)
	if n := e.rt.EvictIdle(); n != 0 {
		t.Fatalf("EvictIdle evicted %d instances before the idle timeout", n)
	}
	if !e.rt.Resident(path) {
		t.Fatal("instance left memory before the idle timeout")
	}

	e.clock.Advance(idle / 2)
	got := ev.wait(t, "evict", path.String())
	if !got.Time.Equal(epoch.Add(idle)) {
		t.Errorf("evict event time = %v, want the fake clock's %v", got.Time, epoch.Add(idle))
	}
	if e.rt.Resident(path) {
		t.Fatal("Resident is true after the evict event")
	}
	if n := e.rt.ResidentCount(); n != 0 {
		t.Fatalf("ResidentCount = %d after eviction, want 0", n)
	}
	if ok, err := e.rt.Exists(ctx, path); err != nil || !ok {
		t.Fatalf("Exists after eviction = %v, %v; eviction must keep storage", ok, err)
	}

	// The next request rehydrates it.
	res, err := e.rt.Call(ctx, path, "bump", 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(res) != "6" {
		t.Errorf("bump after rehydration = %s, want 6 (state survived eviction)", res)
	}
	if got := h.starts.Load(); got != 2 {
		t.Errorf("OnStart ran %d times, want 2 (first use and rehydration)", got)
	}
	ev.wait(t, "start", path.String())
	if !e.rt.Resident(path) {
		t.Error("instance not resident after rehydration")
	}
	p2 := getProbe(t, e.rt, path)
	if p2 == p {
		t.Fatal("rehydration returned the evicted agent value")
	}
	var kv map[string]string
	if ok, err := p2.Storage().Get(ctx, "greeting", &kv); err != nil || !ok || kv["hi"] != "there" {
		t.Errorf("KV after rehydration = %v, %v, %v", kv, ok, err)
	}
	if notes := readNotes(t, p2); !slices.Equal(notes, []string{"remember me"}) {
		t.Errorf("SQL rows after rehydration = %q", notes)
	}
	if keys, err := p2.Storage().Keys(ctx, "g"); err != nil || !slices.Equal(keys, []string{"greeting"}) {
		t.Errorf("Keys = %q, %v", keys, err)
	}
}

// An instance with an open connection or an RPC in flight stays in memory
// however long it was idle; it is evicted once the connection closed and
// the call returned and the timeout passed again.
func TestEvictionSparesConnectionsAndInFlightCalls(t *testing.T) {
	const idle = time.Minute
	h, e, ev := startProbes(t, idle)
	ctx := context.Background()
	connected := agent.Root("Probe", "connected")
	calling := agent.Root("Probe", "calling")

	tr := newTransport()
	conn, err := e.rt.Connect(ctx, connected, "c1", nil, tr)
	if err != nil {
		t.Fatal(err)
	}

	callDone := make(chan string, 1)
	go func() {
		res, err := e.rt.Call(ctx, calling, "wait")
		if err != nil {
			res = json.RawMessage(err.Error())
		}
		callDone <- string(res)
	}()
	select {
	case <-h.entered:
	case <-time.After(waitLimit):
		t.Fatal("the RPC never started")
	}

	e.blockUntil(1)
	e.clock.Advance(3 * idle)
	if n := e.rt.EvictIdle(); n != 0 {
		t.Fatalf("EvictIdle evicted %d busy instances", n)
	}
	if e.rt.Evict(connected) || e.rt.Evict(calling) {
		t.Fatal("Evict removed a busy instance")
	}
	if !e.rt.Resident(connected) || !e.rt.Resident(calling) {
		t.Fatal("a connected or busy instance left memory")
	}

	close(h.release)
	select {
	case res := <-callDone:
		if res != `"released"` {
			t.Fatalf("call result = %s", res)
		}
	case <-time.After(waitLimit):
		t.Fatal("the RPC never returned")
	}
	conn.Disconnect(1000, "bye")

	// Idle time counts from the end of the work, not from before it.
	if n := e.rt.EvictIdle(); n != 0 {
		t.Fatalf("EvictIdle evicted %d instances that just went idle", n)
	}
	e.clock.Advance(idle)
	ev.waitAll(t, "evict", connected.String(), calling.String())
	if e.rt.Resident(connected) || e.rt.Resident(calling) {
		t.Fatal("instances still resident after the evict events")
	}
	if h.starts.Load() != 2 {
		t.Fatalf("OnStart ran %d times, want 2", h.starts.Load())
	}

	// A new connection rehydrates it, with a new OnStart.
	tr2 := newTransport()
	conn2, err := e.rt.Connect(ctx, connected, "c2", nil, tr2)
	if err != nil {
		t.Fatal(err)
	}
	if f := tr2.next(t); f["type"] != wire.Identity || f["name"] != "connected" {
		t.Fatalf("first frame after rehydration = %v", f)
	}
	if h.starts.Load() != 3 {
		t.Fatalf("OnStart ran %d times after rehydration, want 3", h.starts.Load())
	}
	conn2.Disconnect(1000, "")
}

// Evict removes an idle instance at once, regardless of the timeout.
func TestEvictNowAndRehydrate(t *testing.T) {
	h := newHooks()
	e := startRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	path := agent.Root("Probe", "now")
	getProbe(t, e.rt, path)
	if !e.rt.Evict(path) {
		t.Fatal("Evict of an idle instance returned false")
	}
	if e.rt.Resident(path) {
		t.Fatal("still resident after Evict")
	}
	if e.rt.Evict(path) {
		t.Fatal("Evict of a non-resident instance returned true")
	}
	getProbe(t, e.rt, path)
	if h.starts.Load() != 2 {
		t.Fatalf("OnStart ran %d times, want 2", h.starts.Load())
	}
}

// startProbes starts a runtime of Probe instances evicted after idle, with
// a recorder of its agent events (subscribed before the start).
func startProbes(t *testing.T, idle time.Duration) (*probeHooks, *rtEnv, *recorder) {
	t.Helper()
	h := newHooks()
	e := newRuntime(t, rtOptions{idle: idle, classes: []agent.Class{probeClass(h)}})
	ev := record(t, e.rt.Diag(), diag.ChannelAgent)
	e.start()
	return h, e, ev
}
