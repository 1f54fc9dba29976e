package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/wire"
)

// A connection made while the state changes gets the connect sequence
// first (identity, state, MCP) and never ends on a stale state: the last
// cf_agent_state it receives is the instance's final state.
func TestConnectDuringStateChanges(t *testing.T) {
	h := newHooks()
	e := startRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ctx := context.Background()
	path := agent.Root("Probe", "busy")
	p := getProbe(t, e.rt, path)
	if _, err := p.Bump(ctx, 1); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	setterDone := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				setterDone <- nil
				return
			default:
			}
			if _, err := p.Bump(ctx, 1); err != nil {
				setterDone <- err
				return
			}
		}
	}()
	type attached struct {
		tr   *fakeTransport
		conn *agent.Conn
	}
	var conns []attached
	for i := range 100 {
		tr := newTransport()
		c, err := e.rt.Connect(ctx, path, fmt.Sprint("c", i), nil, tr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, attached{tr, c})
		// Keep the queues from filling up.
		if i%10 == 9 {
			for _, a := range conns {
				drainInto(a.tr)
			}
		}
	}
	close(stop)
	if err := <-setterDone; err != nil {
		t.Fatal(err)
	}
	final := string(p.State())
	for i, a := range conns {
		frames := a.tr.all()
		if len(frames) < 2 {
			t.Fatalf("conn %d got %d frames", i, len(frames))
		}
		var types []string
		for _, f := range frames {
			types = append(types, f["type"].(string))
		}
		if types[0] != wire.Identity || types[1] != wire.State {
			t.Errorf("conn %d: frames start %v, want identity then state", i, types[:2])
		}
		var last json.RawMessage
		for _, f := range frames {
			if f["type"] == wire.State {
				last, _ = json.Marshal(f["state"])
			}
		}
		if string(last) != final {
			t.Errorf("conn %d ended on state %s, the instance has %s", i, last, final)
		}
		a.conn.Disconnect(1000, "")
	}
}
