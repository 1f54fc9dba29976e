package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
)

// The runtime publishes its lifecycle on the diag channels: agent (start,
// connect, close, evict, destroy), rpc (call) and schedule (create, fire,
// cancel), each naming the instance and stamped with the runtime's clock.
func TestDiagEvents(t *testing.T) {
	h := newHooks()
	e := newRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	agentEv := record(t, e.rt.Diag(), diag.ChannelAgent)
	rpcEv := record(t, e.rt.Diag(), diag.ChannelRPC)
	schedEv := record(t, e.rt.Diag(), diag.ChannelSchedule)
	all := record(t, e.rt.Diag(), "*")
	e.start()
	ctx := context.Background()
	path := agent.Root("Probe", "observed")
	key := path.String()

	tr := newTransport()
	conn, err := e.rt.Connect(ctx, path, "conn-1", nil, tr)
	if err != nil {
		t.Fatal(err)
	}
	if ev := agentEv.wait(t, "start", key); ev.Attrs["class"] != "Probe" || !ev.Time.Equal(epoch) {
		t.Errorf("start event %+v", ev)
	}
	if ev := agentEv.wait(t, "connect", key); ev.Attrs["connection"] != "conn-1" {
		t.Errorf("connect event %+v", ev)
	}

	// RPCs over the connection; they run concurrently, so their events
	// arrive in either order.
	conn.HandleFrame(ctx, []byte(`{"type":"rpc","id":"r1","method":"bump","args":[2]}`))
	conn.HandleFrame(ctx, []byte(`{"type":"rpc","id":"r2","method":"echo","args":[{"bad":`))
	conn.HandleFrame(ctx, []byte(`{"type":"rpc","id":"r3","method":"bump","args":["x"]}`))
	var okCalls, failedCalls int
	for range 2 {
		ev := rpcEv.wait(t, "call", key)
		if ev.Attrs["method"] != "bump" {
			t.Errorf("rpc call event %+v", ev)
		}
		if ev.Attrs["error"] == nil {
			okCalls++
		} else {
			failedCalls++
		}
	}
	if okCalls != 1 || failedCalls != 1 {
		t.Errorf("rpc events: %d ok, %d failed; want 1 and 1", okCalls, failedCalls)
	}

	p := getProbe(t, e.rt, path)
	sc, err := p.ScheduleAfter(ctx, time.Minute, "Tick", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ev := schedEv.wait(t, "create", key); ev.Attrs["id"] != sc.ID || ev.Attrs["kind"] != agent.ScheduleDelayed {
		t.Errorf("create event %+v", ev)
	}
	e.blockUntil(1)
	e.clock.Advance(time.Minute)
	h.nextFired(t)
	if ev := schedEv.wait(t, "fire", key); ev.Attrs["id"] != sc.ID || ev.Attrs["method"] != "Tick" {
		t.Errorf("fire event %+v", ev)
	}
	sc2, err := p.ScheduleAfter(ctx, time.Hour, "Tick", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.CancelSchedule(ctx, sc2.ID); err != nil {
		t.Fatal(err)
	}
	if ev := schedEv.wait(t, "cancel", key); ev.Attrs["id"] != sc2.ID {
		t.Errorf("cancel event %+v", ev)
	}

	conn.Disconnect(4000, "done")
	if ev := agentEv.wait(t, "close", key); ev.Attrs["code"] != 4000 || ev.Attrs["connection"] != "conn-1" {
		t.Errorf("close event %+v", ev)
	}
	if !e.rt.Evict(path) {
		t.Fatal("Evict failed")
	}
	agentEv.wait(t, "evict", key)
	if err := e.rt.Destroy(ctx, path); err != nil {
		t.Fatal(err)
	}
	agentEv.wait(t, "destroy", key)

	// The "*" subscription saw events of all three channels.
	chans := map[string]bool{}
	for _, ev := range all.drain() {
		chans[ev.Channel] = true
	}
	for _, c := range []string{diag.ChannelAgent, diag.ChannelRPC, diag.ChannelSchedule} {
		if !chans[c] {
			t.Errorf("wildcard subscriber saw nothing on %s", c)
		}
	}
}
