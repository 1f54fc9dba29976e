package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	smokeUsers    = flag.Int("smoke-users", 10, "users of TestSmoke")
	smokeDuration = flag.Duration("smoke-duration", 10*time.Second, "duration of TestSmoke")
)

// TestSmoke runs the generator against the demo served in this process
// on a real SQLite file: every action of the mix, a shared instance, two
// sockets that never read, a heavy user's fan-outs of 20 (4 executing at once, the others waiting for a
// slot), and, when node and test/npm's packages are
// there, one npm user. It asserts
// correctness only (no error other than documented refusals, every
// transcript whole), never timing: the machine may be busy.
func TestSmoke(t *testing.T) {
	npmShare := 0.0
	npmDir := filepath.Join("..", "..", "test", "npm")
	if _, err := exec.LookPath("node"); err == nil {
		if _, err := os.Stat(filepath.Join(npmDir, "node_modules", "agents")); err == nil {
			npmShare = 1 / float64(*smokeUsers)
		}
	}
	if npmShare == 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("node or test/npm/node_modules missing: run `make npm`")
		}
		t.Log("node or test/npm/node_modules missing: no npm user")
	}
	mix, err := ParseMix(DefaultMix)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Serve: true, Data: t.TempDir(), Delay: 5 * time.Millisecond, Users: *smokeUsers, Duration: *smokeDuration,
		Mix: mix, Think: 100 * time.Millisecond, Shared: 0.4, Group: 2, TurnTimeout: 2 * time.Minute,
		NPMShare: npmShare, NPMDir: npmDir, Stuck: 2, Heavy: 20, HeavyRunning: 4, Seed: 1}
	rep := runChecked(t, cfg)
	// The run did work and the check looked at it.
	if rep.Turns == 0 || rep.Runs == 0 || rep.Check.Sent == 0 || rep.Check.Answers == 0 || rep.Check.Transcripts == 0 {
		t.Errorf("nothing done: %d turns, %d runs, check %+v", rep.Turns, rep.Runs, rep.Check)
	}
	if rep.DBBytes == 0 || rep.RSSPeak == 0 {
		t.Errorf("server figures missing: database %d bytes, RSS %d", rep.DBBytes, rep.RSSPeak)
	}
	if h := rep.Heavy; h == nil || h.FanOuts == 0 || h.Statuses["completed"] != 20*h.FanOuts {
		t.Errorf("heavy user: %v, want fan-outs of 20 completed runs", h)
	}
	if npmShare > 0 && rep.NPMUsers != 1 {
		t.Errorf("%d npm users, want 1", rep.NPMUsers)
	}
	// The npm user started its actions once the window opened, and its
	// transcript was checked.
	if npm := rep.Actions["npm research"] + rep.Actions["npm fanout"] + rep.Actions["npm reconnect"]; npmShare > 0 && npm == 0 {
		t.Errorf("the npm user did no turn: actions %v", rep.Actions)
	}
}

// TestCheckTranscript shows that the final check catches what it is for:
// a lost, doubled or unanswered message, a duplicate tool call id, a
// missing background notice.
func TestCheckTranscript(t *testing.T) {
	user := func(id string) message.Message {
		return message.Message{ID: id, Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: "q " + id}}}
	}
	answer := func(id, call string) message.Message {
		m := message.Message{ID: id, Role: message.RoleAssistant, Parts: []message.Part{{Type: message.PartText, Text: "a"}}}
		if call != "" {
			m.Parts = append(m.Parts, message.Part{Type: "tool-research", ToolCallID: call, State: message.StateOutputAvailable})
		}
		return m
	}
	good := []message.Message{user("u1"), answer("a1", "c1"),
		{ID: "detached-ms:r1:sources", Role: message.RoleAssistant},
		user("detached-finish:r1:completed"), answer("a2", ""), user("u2"), answer("a3", "c2")}
	exp := expect{sent: []string{"u1", "u2"}, answers: []string{"a1", "a3"}, notices: []string{"r1"}}
	if p := checkTranscript("t", good, exp); len(p) != 0 {
		t.Fatalf("a good transcript fails: %v", p)
	}
	for _, c := range []struct {
		name string
		ms   []message.Message
		want string
	}{
		{"lost message", []message.Message{user("u1"), answer("a1", "c1"), user("detached-finish:r1:completed"), answer("a2", "")}, "sent message u2 appears 0 times"},
		{"lost answer", []message.Message{user("u1"), answer("a1", "c1"), user("detached-finish:r1:completed"), answer("a2", ""), user("u2"), answer("a9", "c2")}, "answer a3 appears 0 times"},
		{"doubled message", append(append([]message.Message{}, good...), user("u2"), answer("a4", "")), "message id u2 appears 2 times"},
		{"answered twice", []message.Message{user("u1"), answer("a1", "c1"), answer("a5", ""), user("detached-finish:r1:completed"), answer("a2", ""), user("u2"), answer("a3", "c2")}, "is answered 2 times"},
		{"unanswered", []message.Message{user("u1"), answer("a1", "c1"), user("detached-finish:r1:completed"), user("u2"), answer("a3", "c2")}, "is answered 0 times"},
		{"tool call twice", []message.Message{user("u1"), answer("a1", "c1"), user("detached-finish:r1:completed"), answer("a2", ""), user("u2"), answer("a3", "c1")}, "tool call id c1 appears 2 times"},
		{"notice missing", []message.Message{user("u1"), answer("a1", "c1"), user("u2"), answer("a3", "c2")}, "background run r1 has 0 completion notices"},
	} {
		p := checkTranscript("t", c.ms, exp)
		if !strings.Contains(strings.Join(p, "\n"), c.want) {
			t.Errorf("%s: problems %q, want %q", c.name, p, c.want)
		}
	}
}

// TestParseMix refuses unknown actions and bad weights.
func TestParseMix(t *testing.T) {
	m, err := ParseMix("research=2, fanout=1")
	if err != nil || m[ActResearch] != 2 || m[ActFanout] != 1 || m.total() != 3 || m.pick(2) != ActFanout {
		t.Fatalf("ParseMix: %v %v", m, err)
	}
	for _, bad := range []string{"research", "dance=1", "research=-1", "research=x"} {
		if _, err := ParseMix(bad); err == nil {
			t.Errorf("ParseMix(%q) accepted", bad)
		}
	}
}

// TestFailureKinds counts the documented refusals (docs/limits.md) apart
// from errors.
func TestFailureKinds(t *testing.T) {
	g := &gen{rec: newRecorder(nil)}
	g.failure("dial", fmt.Errorf("dial x: %w", &client.HTTPError{StatusCode: 503, Status: "503 Service Unavailable"}))
	g.failure("stream", &client.CloseError{Code: 1013})
	g.failure("turn-error", &client.TurnError{ID: "r", Message: "too many chat turns are in flight on this server (the limit is 2); send it again later"})
	g.failure("turn-error", &client.TurnError{ID: "r", Message: "too many chat requests are queued on this agent (the limit is 16)"})
	g.failure("stream", &client.CloseError{Code: 1006})
	g.failure("turn-error", &client.TurnError{ID: "r", Message: "model failed"})
	rep := g.rec.report(time.Second)
	want := map[string]int{"upgrade-503": 1, "close-1013": 1, "turns-in-flight": 1, "chat-queue-full": 1}
	if fmt.Sprint(rep.Refusals) != fmt.Sprint(want) {
		t.Errorf("refusals %v, want %v", rep.Refusals, want)
	}
	wantErr := map[string]int{"stream: closed 1006": 1, "turn-error": 1}
	if fmt.Sprint(rep.Errors) != fmt.Sprint(wantErr) {
		t.Errorf("errors %v, want %v", rep.Errors, wantErr)
	}
	if rep.OK() {
		t.Error("a report with errors is OK")
	}
}

// TestRefusals runs users against a node that takes one chat turn at a
// time (a research turn and its child are two): requests are refused with
// the documented error, and the generator counts them apart, forgets the
// refused messages (the server stored none) and still finds every
// transcript whole.
func TestRefusals(t *testing.T) {
	mix, err := ParseMix("research=1,fanout=1,reconnect=1,drill=1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Serve: true, Data: t.TempDir(), Delay: 5 * time.Millisecond, MaxTurns: 1, Users: 4, Duration: 3 * time.Second,
		Mix: mix, Think: 20 * time.Millisecond, Shared: 0.5, Group: 2, TurnTimeout: 2 * time.Minute, Seed: 1}
	rep := runChecked(t, cfg)
	// Four users 20 ms apart between actions overlap within 3 s: a
	// turn's search alone takes 200 ms.
	if rep.Refusals["turns-in-flight"] == 0 {
		t.Errorf("no request refused: %v", rep.Refusals)
	}
}

// runChecked runs cfg, logs its report and fails the test on a run error,
// on errors the run met and on a transcript check that found problems.
func runChecked(t *testing.T, cfg Config) *Report {
	t.Helper()
	var logs bytes.Buffer
	rep, err := Run(context.Background(), cfg, &logs)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	var out bytes.Buffer
	rep.Print(&out)
	t.Log("\n" + out.String())
	if len(rep.Errors) > 0 {
		t.Errorf("errors: %v\n%v", rep.Errors, rep.Samples)
	}
	if !rep.Check.OK() {
		t.Errorf("transcript check: %v", rep.Check.Problems)
	}
	return rep
}

// TestChunkEvent: the generator skips the agent-tool chunk events without
// decoding them, and only those: an event of another kind is applied even
// when its input or body holds the text of a chunk event.
func TestChunkEvent(t *testing.T) {
	decoy := `{"type":"agent-tool-event","sequence":1,"event":{"kind":"chunk","runId":"r"}}`
	for _, kind := range []string{"chunk", "started", "finished", "error", "progress"} {
		f := agenttool.Frame{Type: wire.AgentToolEvent, ParentToolCallID: "call-1", Sequence: 7, Replay: true,
			Event: agenttool.Event{Kind: kind, RunID: "run-1", InputPreview: json.RawMessage(decoy), Body: decoy}}
		data, err := json.Marshal(f) // what the server writes, byte for byte (agenttool's encodeFrame)
		if err != nil {
			t.Fatal(err)
		}
		if got := chunkEvent(data); got != (kind == "chunk") {
			t.Errorf("kind %q: chunkEvent = %v for %s", kind, got, data)
		}
	}
	if chunkEvent([]byte(`{"event":{"runId":"r","kind":"chunk"},"type":"agent-tool-event"}`)) {
		t.Error("a frame of another member order was taken for a chunk without decoding")
	}
}

// TestFirstByMinute: the report gives the time to the first chunk for each
// minute of the run apart, by the minute its turn ended in.
func TestFirstByMinute(t *testing.T) {
	r := newRecorder(nil)
	r.start = time.Now().Add(-150 * time.Second) // in the run's third minute
	r.turn(40*time.Millisecond, 0, time.Second, 0)
	r.turn(80*time.Millisecond, 0, time.Second, 0)
	rep := r.report(3 * time.Minute)
	if len(rep.FirstByMinute) != 3 {
		t.Fatalf("%d minutes, want 3: %v", len(rep.FirstByMinute), rep.FirstByMinute)
	}
	if rep.FirstByMinute[0] != ([3]time.Duration{}) || rep.FirstByMinute[2][0] != 40*time.Millisecond || rep.FirstByMinute[2][2] != 80*time.Millisecond {
		t.Fatalf("by minute %v", rep.FirstByMinute)
	}
	var out strings.Builder
	rep.Print(&out)
	if !strings.Contains(out.String(), "by minute: 1: 0/0/0, 2: 0/0/0, 3: 40/80/80") {
		t.Fatalf("report:\n%s", out.String())
	}
}
