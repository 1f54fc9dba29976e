// Package detachedcrash kills a real server process (SIGKILL) while two
// detached agent-tool runs stream, restarts it on the same data folder,
// and checks that each run's end is delivered exactly once: one OnFinish
// (logged in the parent's own table) and one chat notification.
package detachedcrash

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

// serverBin is test/detachedcrash/server, built once.
var serverBin = &testenv.Binary{Pkg: "github.com/agentry/agentry/test/detachedcrash/server"}

func TestMain(m *testing.M) { testenv.Main(m, serverBin) }

// waitLimit bounds every wait: a deadline for a broken test, never a way to
// let time pass.
const waitLimit = 40 * time.Second

const (
	runOnFinish = "bg-onfinish"
	runNotify   = "bg-notify"
)

// start runs the server on the data folder and returns once it listens.
func start(t *testing.T, data string) *testenv.Process {
	t.Helper()
	return testenv.StartProcess(t, waitLimit, serverBin.Path(t), "--addr", "127.0.0.1:0", "--data", data, "--delay", "100ms")
}

// frame is a server frame as the tests read it: testenv.WireFrame,
// the tests' one frame type.
type frame = testenv.WireFrame

// client is a WebSocket connection to the parent that records frames.
type client struct {
	t      *testing.T
	ws     *testenv.WSClient[frame]
	nextID int
}

func dial(t *testing.T, host string) *client {
	t.Helper()
	return &client{t: t, ws: testenv.DialWS[frame](t, waitLimit, "ws://"+host+"/agents/crash-parent/p1")}
}

func (c *client) close() { c.ws.Close() }

// call makes an RPC call and decodes its result into out.
func (c *client) call(ctx context.Context, method string, out any) {
	c.t.Helper()
	c.nextID++
	id := fmt.Sprint("call-", c.nextID)
	if err := c.ws.SendContext(ctx, map[string]any{"type": wire.RPC, "id": id, "method": method, "args": []any{}}); err != nil {
		c.t.Fatalf("rpc %s: %v", method, err)
	}
	var hit *frame
	_, err := c.ws.Wait(ctx, func(fs []testenv.Frame[frame]) bool {
		for i := range fs {
			if f := fs[i].Value; fs[i].Err == nil && f.Type == wire.RPC && f.ID == id {
				hit = &f
			}
		}
		return hit != nil
	})
	if err != nil {
		c.t.Fatalf("rpc %s: %v", method, err)
	}
	if !hit.Success {
		c.t.Fatalf("rpc %s failed: %s", method, hit.Error)
	}
	if err := json.Unmarshal(hit.Result, out); err != nil {
		c.t.Fatalf("rpc %s result %s: %v", method, hit.Result, err)
	}
}

// events counts the frames that are not RPC answers: every state change.
func events(fs []testenv.Frame[frame]) int {
	n := 0
	for _, f := range fs {
		if f.Err == nil && f.Value.Type != wire.RPC {
			n++
		}
	}
	return n
}

// until re-evaluates cond every time a state-changing frame arrives.
func (c *client) until(ctx context.Context, what string, cond func() bool) {
	c.t.Helper()
	seen := -1
	for {
		_, err := c.ws.Wait(ctx, func(fs []testenv.Frame[frame]) bool {
			n := events(fs)
			if n == seen {
				return false
			}
			seen = n
			return true
		})
		if err != nil {
			c.t.Fatalf("waiting for %s: %v", what, err)
		}
		if cond() {
			return
		}
	}
}

// chunks counts a run's agent-tool chunk frames.
func (c *client) chunks(runID string) int {
	n := 0
	for _, fr := range c.ws.Frames() {
		if f := fr.Value; fr.Err == nil && f.Type == wire.AgentToolEvent && f.Event.RunID == runID && f.Event.Kind == "chunk" {
			n++
		}
	}
	return n
}

type delivery struct {
	RunID, Status, Summary string
}

type runState struct {
	RunID, Status string
}

func messages(t *testing.T, host string) []message.Message {
	t.Helper()
	var msgs []message.Message
	testenv.GetJSON(t, "http://"+host+"/agents/crash-parent/p1/get-messages", &msgs)
	return msgs
}

// TestDetachedDeliveryAfterKill: two detached runs stream; the server is
// SIGKILLed mid-stream and restarted on the same data folder; the runs
// finish (their children resume), the OnFinish run is delivered once with
// completed, the notify run adds its message to the parent's chat once (and
// the parent's model answers it), and both registry rows are completed.
func TestDetachedDeliveryAfterKill(t *testing.T) {
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLimit)
	defer cancel()

	s1 := start(t, data)
	c1 := dial(t, s1.Host)
	var ids []string
	c1.call(ctx, "dispatch", &ids)
	if strings.Join(ids, ",") != runOnFinish+","+runNotify {
		t.Fatalf("dispatch = %v", ids)
	}
	c1.until(ctx, "a few chunks of both runs", func() bool { return c1.chunks(runOnFinish) >= 3 && c1.chunks(runNotify) >= 3 })
	var before []delivery
	c1.call(ctx, "finishLog", &before)
	if len(before) != 0 {
		t.Fatalf("delivered before the kill: %+v", before)
	}
	s1.Kill()
	c1.close()

	s2 := start(t, data)
	c2 := dial(t, s2.Host)
	notifyID := "detached-finish:" + runNotify + ":completed"
	var log []delivery
	var runs []runState
	var msgs []message.Message
	c2.until(ctx, "both runs delivered", func() bool {
		c2.call(ctx, "finishLog", &log)
		c2.call(ctx, "runs", &runs)
		msgs = messages(t, s2.Host)
		for _, r := range runs {
			if r.Status != "completed" {
				return false
			}
		}
		replied := false
		for i, m := range msgs {
			if m.ID == notifyID && i+1 < len(msgs) && msgs[i+1].Role == message.RoleAssistant {
				replied = true
			}
		}
		return len(runs) == 2 && len(log) > 0 && replied
	})
	if len(log) != 1 || log[0].RunID != runOnFinish || log[0].Status != "completed" || log[0].Summary != strings.Repeat("finding ", 40) {
		t.Fatalf("OnFinish deliveries = %+v, want exactly one completed for %s", log, runOnFinish)
	}
	var notices []message.Message
	for _, m := range msgs {
		if strings.HasPrefix(m.ID, "detached-finish:") {
			notices = append(notices, m)
		}
	}
	if len(notices) != 1 || notices[0].ID != notifyID || notices[0].Role != message.RoleUser {
		t.Fatalf("notifications = %+v, want exactly one %s", notices, notifyID)
	}
	var meta map[string]any
	_ = json.Unmarshal(notices[0].Metadata, &meta)
	if meta["source"] != "crash-test" || meta["runId"] != runNotify || meta["status"] != "completed" {
		t.Fatalf("notification metadata = %v", meta)
	}
	s2.Stop()
}
