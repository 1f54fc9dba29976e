// Package toolcrash kills a real server (SIGKILL) while a parent awaits an
// agent-tool child, restarts it on the same data folder, and checks that the
// run ends completed, that the child does not redo its finished steps, and
// that clients see one consistent timeline (spec §9 L 156–160).
package toolcrash

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
	"github.com/agentry/agentry/wire"
)

// serverBin is test/toolcrash/server, built once (with -race when the tests
// run with -race).
var serverBin = &testenv.Binary{Pkg: "github.com/agentry/agentry/test/toolcrash/server", Race: testenv.Race}

func TestMain(m *testing.M) { testenv.Main(m, serverBin) }

// waitLimit bounds every wait: a deadline for a broken test, never a way to
// let time pass.
const waitLimit = 30 * time.Second

const steps = 6 // the Worker's tool steps (server.Steps)

// serve runs the server on the data folder and returns once it listens.
func serve(t *testing.T, data string) *testenv.Process {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and kills a server")
	}
	return testenv.StartProcess(t, waitLimit, serverBin.Path(t), "--addr", "127.0.0.1:0", "--data", data, "--delay", "40ms")
}

// ---------------------------------------------------------------------------
// WebSocket client of a Boss.

type client struct {
	t  *testing.T
	ws *testenv.WSClient[agenttool.Frame]
}

func dial(t *testing.T, p *testenv.Process, name string) *client {
	t.Helper()
	return &client{t: t, ws: testenv.DialWS[agenttool.Frame](t, waitLimit, "ws://"+p.Host+"/agents/boss/"+name)}
}

func (c *client) send(v any) {
	c.t.Helper()
	c.ws.Send(v)
}

// until waits until pred holds for the frames of the run (all runs when
// runID is "") and returns them.
func (c *client) until(what, runID string, pred func([]agenttool.Frame) bool) []agenttool.Frame {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var fs []agenttool.Frame
	_, err := c.ws.Wait(ctx, func(all []testenv.Frame[agenttool.Frame]) bool {
		fs = nil
		for _, f := range all {
			if f.Value.Type == wire.AgentToolEvent && (runID == "" || f.Value.Event.RunID == runID) {
				fs = append(fs, f.Value)
			}
		}
		return pred(fs)
	})
	if err != nil {
		c.t.Fatalf("waiting for %s: %v; frames:\n%s", what, err, dump(fs))
	}
	return fs
}

// rpc calls a Boss method and returns its result.
func (c *client) rpc(id, method string, args ...any) json.RawMessage {
	c.t.Helper()
	c.send(map[string]any{"type": wire.RPC, "id": id, "method": method, "args": args})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	type answer struct {
		Type    string          `json:"type"`
		ID      string          `json:"id"`
		Success bool            `json:"success"`
		Result  json.RawMessage `json:"result"`
		Error   string          `json:"error"`
		Done    *bool           `json:"done"`
	}
	var hit *answer
	_, err := c.ws.Wait(ctx, func(all []testenv.Frame[agenttool.Frame]) bool {
		for _, r := range all {
			var f answer
			if json.Unmarshal(r.Raw, &f) == nil && f.Type == wire.RPC && f.ID == id && (f.Done == nil || *f.Done) {
				hit = &f
				return true
			}
		}
		return false
	})
	if err != nil {
		c.t.Fatalf("waiting for rpc %s: %v", method, err)
	}
	if !hit.Success {
		c.t.Fatalf("rpc %s: %s", method, hit.Error)
	}
	return hit.Result
}

func terminal(kind string) bool {
	switch kind {
	case "finished", "error", "aborted", "interrupted":
		return true
	}
	return false
}

func hasTerminal(fs []agenttool.Frame) bool {
	return len(fs) > 0 && terminal(fs[len(fs)-1].Event.Kind)
}

func chunks(fs []agenttool.Frame) int {
	n := 0
	for _, f := range fs {
		if f.Event.Kind == "chunk" {
			n++
		}
	}
	return n
}

func dump(fs []agenttool.Frame) string {
	var b strings.Builder
	for _, f := range fs {
		data, _ := json.Marshal(f)
		b.Write(data)
		b.WriteByte('\n')
	}
	return b.String()
}

// timeline checks one client's frames of one run (replay and live): started
// once and first, sequences strictly increasing with no duplicate, no frame
// after a terminal one. It returns the text the chunks rebuild.
func timeline(t *testing.T, who string, fs []agenttool.Frame) string {
	t.Helper()
	if len(fs) == 0 || fs[0].Event.Kind != "started" {
		t.Fatalf("%s: the timeline does not begin with started:\n%s", who, dump(fs))
	}
	b := message.NewBuilder("")
	last := int64(-1)
	for i, f := range fs {
		if f.Sequence <= last {
			t.Fatalf("%s: frame %d has sequence %d after %d (duplicate or reordered):\n%s", who, i, f.Sequence, last, dump(fs))
		}
		last = f.Sequence
		if i > 0 && f.Event.Kind == "started" {
			t.Fatalf("%s: started twice:\n%s", who, dump(fs))
		}
		if terminal(f.Event.Kind) && i != len(fs)-1 {
			t.Fatalf("%s: a frame follows the terminal one:\n%s", who, dump(fs))
		}
		if f.Event.Kind == "chunk" {
			var ch message.Chunk
			if err := json.Unmarshal([]byte(f.Event.Body), &ch); err != nil {
				t.Fatalf("%s: chunk %d: %v", who, f.Sequence, err)
			}
			if err := b.Apply(ch); err != nil {
				t.Fatalf("%s: chunk %d does not apply: %v\n%s", who, f.Sequence, err, dump(fs))
			}
		}
	}
	return chat.MessageText(b.Message())
}

// childText reads the child's transcript through the parent's drill-in
// route and returns its last assistant message's text.
func childText(t *testing.T, p *testenv.Process, boss, runID string) string {
	t.Helper()
	var msgs []message.Message
	testenv.GetJSON(t, "http://"+p.Host+"/agents/boss/"+boss+"/sub/worker/"+runID+"/get-messages", &msgs)
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == message.RoleAssistant {
			return chat.MessageText(msgs[i])
		}
	}
	return ""
}

// registryRow reads a run's row through the Boss's run RPC.
func registryRow(t *testing.T, c *client, runID string) agenttool.Run {
	t.Helper()
	var out struct {
		Found bool          `json:"found"`
		Run   agenttool.Run `json:"run"`
	}
	if err := json.Unmarshal(c.rpc("row-"+runID+fmt.Sprint(time.Now().UnixNano()), "run", runID), &out); err != nil || !out.Found {
		t.Fatalf("run %s: found=%v err=%v", runID, out.Found, err)
	}
	return out.Run
}

// stepExecutions reads, from the database file, how often each step of the
// child ran (the child's own table).
func stepExecutions(t *testing.T, data, boss, runID string) (total int, distinct int) {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(data, "agentry.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(ctx, func(tx store.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `SELECT id FROM instances WHERE path = ?`, "Boss/"+boss+"/Worker/"+runID).Scan(&id); err != nil {
			return err
		}
		return tx.QueryRow(ctx, fmt.Sprintf(`SELECT COUNT(*), COUNT(DISTINCT n) FROM u%d_steps`, id)).Scan(&total, &distinct)
	})
	if err != nil {
		t.Fatal(err)
	}
	return total, distinct
}

// chatRequest submits a user message to the Boss's chat.
func chatRequest(c *client, text string) {
	body, _ := json.Marshal(map[string]any{"trigger": "submit-message", "messages": []message.Message{{
		ID: "u1", Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: text}}}}})
	c.send(map[string]any{"type": wire.ChatRequest, "id": "req-1",
		"init": map[string]any{"method": "POST", "body": string(body)}})
}

// ---------------------------------------------------------------------------
// L 156, 159: SIGKILL while the Boss's agent tool starts its child, and while
// the child runs; after a restart the run ends completed, with no error.

func TestKillWhileChildStarting(t *testing.T) { killDuringChatTool(t, 0) }

func TestKillWhileChildRunning(t *testing.T) { killDuringChatTool(t, 15) }

func killDuringChatTool(t *testing.T, afterChunks int) {
	data := t.TempDir()
	s1 := serve(t, data)
	c1 := dial(t, s1, "b")
	chatRequest(c1, "write the report")
	fs := c1.until(fmt.Sprintf("started and %d chunks", afterChunks), "", func(fs []agenttool.Frame) bool {
		return len(fs) > 0 && chunks(fs) >= afterChunks
	})
	s1.Kill()
	runID := fs[0].Event.RunID
	t.Logf("killed after %d agent-tool frames of %s", len(fs), runID)

	s2 := serve(t, data)
	c2 := dial(t, s2, "b")
	got := c2.until("the run's terminal frame", runID, hasTerminal)
	last := got[len(got)-1]
	if last.Event.Kind != "finished" {
		t.Fatalf("terminal frame %+v, want finished:\n%s", last, dump(got))
	}
	r := registryRow(t, c2, runID)
	if r.Status != agenttool.StatusCompleted || r.Error != "" || r.Reason != "" {
		t.Fatalf("registry row %+v, want completed without error", r)
	}
	text := timeline(t, "client after the restart", got)
	if want := childText(t, s2, "b", runID); text != want || !strings.Contains(want, "task is complete") {
		t.Fatalf("the client rebuilt %q; the child's answer is %q", text, want)
	}
	s2.Stop()
	total, distinct := stepExecutions(t, data, "b", runID)
	if distinct != steps || total >= 2*steps {
		t.Fatalf("%d step executions (%d distinct) for %d steps", total, distinct, steps)
	}
}

// ---------------------------------------------------------------------------
// L 157, 158 and the timeline: three rapid restarts (SIGKILL each time while
// the child works) with a stable run id. The child completes, re-executes far
// fewer steps than it has, and a client connected after each restart sees one
// consistent timeline.

func TestRapidRestartsStableRunID(t *testing.T) {
	const runID = "stable-1"
	data := t.TempDir()
	s := serve(t, data)
	c := dial(t, s, "r")
	c.send(map[string]any{"type": wire.RPC, "id": "dispatch", "method": "dispatch", "args": []any{runID, "the long task"}})
	seen := 0
	for i := range 3 {
		// Let the child make progress in this life, then kill.
		fs := c.until("progress before kill", runID, func(fs []agenttool.Frame) bool {
			return hasTerminal(fs) || chunks(fs) >= seen+10
		})
		if hasTerminal(fs) {
			t.Fatalf("the run ended before kill %d:\n%s", i+1, dump(fs))
		}
		timeline(t, fmt.Sprintf("client %d", i), fs)
		seen = chunks(fs)
		s.Kill()
		t.Logf("kill %d after %d chunks", i+1, seen)
		s = serve(t, data)
		c = dial(t, s, "r")
	}
	fs := c.until("the terminal frame", runID, hasTerminal)
	if last := fs[len(fs)-1]; last.Event.Kind != "finished" {
		t.Fatalf("terminal %+v:\n%s", last, dump(fs))
	}
	text := timeline(t, "client after the last restart", fs)
	want := childText(t, s, "r", runID)
	if text != want || !strings.HasSuffix(want, "All six steps are done; the task is complete.") {
		t.Fatalf("the client rebuilt %q; the child's answer is %q", text, want)
	}
	for n := 1; n <= steps; n++ {
		if c := strings.Count(want, fmt.Sprintf("Working on step %d of the task.", n)); c != 1 {
			t.Fatalf("step %d appears %d times in the final answer %q", n, c, want)
		}
	}
	r := registryRow(t, c, runID)
	if r.Status != agenttool.StatusCompleted || r.Error != "" {
		t.Fatalf("registry row %+v", r)
	}
	s.Stop()
	total, distinct := stepExecutions(t, data, "r", runID)
	t.Logf("%d step executions for %d steps", total, steps)
	if distinct != steps || total >= 2*steps {
		t.Fatalf("%d step executions (%d distinct) for %d steps; want every step, fewer than %d", total, distinct, steps, 2*steps)
	}
}
