// Package recoverycrash kills a real server (SIGKILL) every time an
// agent-tool child's recovered turn has streamed a little, and checks that
// the child's chat recovery budget ends it: the child's turn is sealed with
// work_budget_exceeded within its budget, the terminal message is in its
// transcript, and its parent reports a structured failure at once (without
// waiting for its re-attach no-progress window).
package recoverycrash

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

// serverBin is test/recoverycrash/server, built once (with -race when the
// tests run with -race).
var serverBin = &testenv.Binary{Pkg: "github.com/agentry/agentry/test/recoverycrash/server", Race: testenv.Race}

func TestMain(m *testing.M) { testenv.Main(m, serverBin) }

// The Looper's budget and terminal message (server.WorkBudget,
// server.TerminalMessage).
const (
	workBudget      = 6
	terminalMessage = "The looper could not recover and stopped."
)

// waitLimit bounds every wait: a deadline for a broken test, never a way to
// let time pass.
const waitLimit = 30 * time.Second

func serve(t *testing.T, data string) *testenv.Process {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and kills a server")
	}
	return testenv.StartProcess(t, waitLimit, serverBin.Path(t), "--addr", "127.0.0.1:0", "--data", data, "--delay", "40ms")
}

type client struct {
	t  *testing.T
	ws *testenv.WSClient[agenttool.Frame]
}

func dial(t *testing.T, p *testenv.Process) *client {
	t.Helper()
	return &client{t: t, ws: testenv.DialWS[agenttool.Frame](t, waitLimit, "ws://"+p.Host+"/agents/chief/c")}
}

// wait waits until pred holds of every frame so far.
func (c *client) wait(what string, pred func([]testenv.Frame[agenttool.Frame]) bool) []testenv.Frame[agenttool.Frame] {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	fs, err := c.ws.Wait(ctx, pred)
	if err != nil {
		var b strings.Builder
		for _, f := range fs {
			b.Write(f.Raw)
			b.WriteByte('\n')
		}
		c.t.Fatalf("waiting for %s: %v; frames:\n%s", what, err, b.String())
	}
	return fs
}

// run is what a client saw of the agent-tool run: the text deltas of the
// child's model in parts not in known (each model call streams a new text
// part: so these are the deltas of lives after the ones known), every text
// part's id, and its terminal event.
type run struct {
	id     string
	deltas int
	parts  map[string]bool
	end    *agenttool.Event
}

func runOf(fs []testenv.Frame[agenttool.Frame], known map[string]bool) run {
	r := run{parts: map[string]bool{}}
	for _, f := range fs {
		if f.Value.Type != wire.AgentToolEvent {
			continue
		}
		ev := f.Value.Event
		if r.id == "" {
			r.id = ev.RunID
		}
		switch ev.Kind {
		case "chunk":
			var ch message.Chunk
			if json.Unmarshal([]byte(ev.Body), &ch) == nil && ch.Type == message.ChunkTextDelta && ch.Delta != terminalMessage {
				r.parts[ch.ID] = true
				if !known[ch.ID] {
					r.deltas++
				}
			}
		case "finished", "error", "aborted", "interrupted":
			e := ev
			r.end = &e
		}
	}
	return r
}

// TestChildSealedAcrossKills: the Looper child dies during every recovery
// attempt of its turn (SIGKILL once its recovered turn streamed a few
// deltas), each attempt making progress. Its work budget seals the turn
// with work_budget_exceeded within a bounded number of kills; the Chief
// reports a structured failure (an error run, and the failure envelope as
// its tool result) well inside its hour-long re-attach window; the
// Looper's transcript holds its text once (every life went on where the
// previous was cut) and ends with the terminal message.
func TestChildSealedAcrossKills(t *testing.T) {
	data := t.TempDir()
	s := serve(t, data)
	c := dial(t, s)
	c.wait("the chat transcript", func(fs []testenv.Frame[agenttool.Frame]) bool {
		return len(fs) > 0 && fs[len(fs)-1].Value.Type == wire.ChatMessages
	})
	body, _ := json.Marshal(map[string]any{"trigger": "submit-message", "messages": []message.Message{{
		ID: "u1", Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: "loop forever"}}}}})
	c.ws.Send(map[string]any{"type": wire.ChatRequest, "id": "req-1",
		"init": map[string]any{"method": "POST", "body": string(body)}})

	// Every life the child's turn streams at least two units (a text part
	// starts, its first delta), so the budget is spent after at most
	// WorkBudget/2+1 recoveries; a few more kills than that fail the test.
	const maxKills = workBudget/2 + 3
	known := map[string]bool{}
	var r run
	kills := 0
	for {
		// Killed once this life's model call streamed three deltas (in
		// a text part no earlier life had).
		fs := c.wait("the child streaming or ending", func(fs []testenv.Frame[agenttool.Frame]) bool {
			r = runOf(fs, known)
			return r.end != nil || r.deltas >= 3
		})
		r = runOf(fs, known)
		if r.end != nil {
			break
		}
		if kills == maxKills {
			t.Fatalf("the child was still recovering after %d kills", kills)
		}
		known = r.parts
		s.Kill()
		kills++
		t.Logf("kill %d after %d text parts of the child", kills, len(known))
		s = serve(t, data)
		c = dial(t, s)
	}
	if kills < 2 {
		t.Fatalf("the run ended after %d kills: %+v", kills, r.end)
	}
	end := r.end
	if end.Kind != "error" || !strings.Contains(end.Error, string(chat.ExhaustWorkBudget)) || !strings.Contains(end.Error, terminalMessage) {
		t.Fatalf("the run's end %+v, want an error naming work_budget_exceeded and the terminal message", end)
	}
	if end.Reason != "" || end.ChildStillRunning != nil {
		t.Fatalf("the run's end %+v is an interruption, want a hard failure", end)
	}

	// The Chief's model got the failure envelope and answered.
	fs := c.wait("the Chief's answer", func(fs []testenv.Frame[agenttool.Frame]) bool {
		return chiefAnswer(fs) != nil
	})
	answer := chiefAnswer(fs)
	var failure agenttool.Failure
	for _, p := range answer.Parts {
		if p.IsTool() {
			if err := json.Unmarshal(p.Output, &failure); err != nil {
				t.Fatalf("tool output %s: %v", p.Output, err)
			}
		}
	}
	if failure.OK || failure.Status != agenttool.StatusError || failure.Retryable || failure.Error != end.Error {
		t.Fatalf("the Chief's tool result %+v, want the error envelope of %q", failure, end.Error)
	}

	// The child's transcript: its answer keeps what it streamed and ends
	// with the terminal message.
	var msgs []message.Message
	testenv.GetJSON(t, "http://"+s.Host+"/agents/chief/c/sub/looper/"+r.id+"/get-messages", &msgs)
	last := msgs[len(msgs)-1]
	if last.Role != message.RoleAssistant || len(last.Parts) < 2 {
		t.Fatalf("the child's last message %+v", last)
	}
	if p := last.Parts[len(last.Parts)-1]; p.Text != terminalMessage || chat.ExhaustedReasonOf(p) != chat.ExhaustWorkBudget {
		t.Fatalf("the child's answer ends with %+v, want the terminal message", p)
	}
	// Each life went on from where the previous one was cut (the scripted
	// model continues a cut answer), so the answer is the text streamed so
	// far, said once, and the terminal message.
	said, sealed := strings.CutSuffix(chat.MessageText(last), terminalMessage)
	if !sealed || !strings.HasPrefix(strings.Repeat("The loop goes on and on. ", 200), said) {
		t.Fatalf("the child's visible answer %q, want the looper's text, said once, then the terminal message", chat.MessageText(last))
	}
	s.Stop()

	// Storage: the child's incident is sealed within its budget (the
	// sealing attempt saw at most one life's work past it), the run is an
	// error, the Chief's turn completed.
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(data, "agentry.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var status, reason string
	var work, attempt int
	var runStatus, chiefOutcome string
	err = db.View(ctx, func(tx store.Tx) error {
		// The only incident left: the Chief's turn completed (its
		// incident, if it had one, went with it).
		var n int
		if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM chat_recovery_incidents`).Scan(&n); err != nil || n != 1 {
			return fmt.Errorf("%d incidents (%v), want the child's", n, err)
		}
		if err := tx.QueryRow(ctx, `SELECT i.status, i.reason, i.progress - i.work_baseline, i.attempt FROM chat_recovery_incidents i
			JOIN instances ON instances.id = i.instance_id WHERE instances.path = ?`, "Chief/c/Looper/"+r.id).Scan(&status, &reason, &work, &attempt); err != nil {
			return fmt.Errorf("incident: %w", err)
		}
		if err := tx.QueryRow(ctx, `SELECT status FROM agent_tool_runs WHERE run_id = ?`, r.id).Scan(&runStatus); err != nil {
			return fmt.Errorf("run: %w", err)
		}
		return tx.QueryRow(ctx, `SELECT outcome FROM chat_streams WHERE id = ?`, "req-1").Scan(&chiefOutcome)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sealed after %d kills at work %d", kills, work)
	if status != "exhausted" || reason != string(chat.ExhaustWorkBudget) || work <= workBudget || work > 2*workBudget {
		t.Fatalf("incident %s %s at work %d, want exhausted work_budget_exceeded just past %d", status, reason, work, workBudget)
	}
	if runStatus != string(agenttool.StatusError) || chiefOutcome != chat.OutcomeCompleted {
		t.Fatalf("run %s, Chief's turn %s; want error and completed", runStatus, chiefOutcome)
	}
}

// chiefAnswer returns the Chief's answer in the last transcript frame once
// its tool call has a result and its text follows, else nil.
func chiefAnswer(fs []testenv.Frame[agenttool.Frame]) *message.Message {
	for i := len(fs) - 1; i >= 0; i-- {
		if fs[i].Value.Type != wire.ChatMessages {
			continue
		}
		// The client decodes agent-tool events; a transcript frame is
		// read again as testenv.WireFrame and its messages as messages.
		var f testenv.WireFrame
		var msgs []message.Message
		if json.Unmarshal(fs[i].Raw, &f) != nil || json.Unmarshal(f.Messages, &msgs) != nil {
			return nil
		}
		for _, m := range msgs {
			if m.Role == message.RoleAssistant && strings.Contains(chat.MessageText(m), "did not finish") {
				return &m
			}
		}
		return nil
	}
	return nil
}
