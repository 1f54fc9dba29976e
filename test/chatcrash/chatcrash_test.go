// Package chatcrash kills the real agentry server (SIGKILL) during a slow
// scripted chat turn and checks that the restarted server completes the
// turn exactly once.
package chatcrash

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
	"github.com/agentry/agentry/wire"
)

// agentry is cmd/agentry, built once.
var agentry = &testenv.Binary{Pkg: "github.com/agentry/agentry/cmd/agentry"}

func TestMain(m *testing.M) { testenv.Main(m, agentry) }

// waitLimit bounds every wait: a deadline for a broken test, never a way to
// let time pass.
const waitLimit = 20 * time.Second

// serve runs `agentry serve` on the data folder and returns once it
// listens.
func serve(t *testing.T, data string) *testenv.Process {
	t.Helper()
	return testenv.StartProcess(t, waitLimit, agentry.Path(t), "serve", "--addr", "127.0.0.1:0", "--data", data, "--delay", "50ms")
}

// frame is a server frame as the tests read it: testenv.WireFrame,
// the tests' one frame type.
type frame = testenv.WireFrame

// content reports whether f is a chunk of a chat turn's stream.
func content(f frame) bool {
	return f.Type == wire.ChatResponse && !f.Ended() && !f.ReplayComplete && f.Body != "" && f.Seq != nil
}

// client reads the frames of one connection in order.
type client struct {
	t    *testing.T
	ws   *testenv.WSClient[frame]
	seen []string // the last frames received, for a failure's message
}

func dial(t *testing.T, url string) *client {
	t.Helper()
	return &client{t: t, ws: testenv.DialWS[frame](t, waitLimit, url)}
}

func (c *client) next() frame {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	f, err := c.ws.Next(ctx)
	if err != nil {
		c.t.Fatalf("waiting for a frame: %v; the last frames were:\n%s", err, strings.Join(c.seen, "\n"))
	}
	c.seen = append(c.seen, string(f.Raw))
	if len(c.seen) > 10 {
		c.seen = c.seen[1:]
	}
	if f.Err != nil {
		c.t.Fatalf("frame %s: %v", f.Raw, f.Err)
	}
	return f.Value
}

func (c *client) until(pred func(frame) bool) []frame {
	c.t.Helper()
	var out []frame
	for {
		f := c.next()
		out = append(out, f)
		if pred(f) {
			return out
		}
	}
}

func (c *client) send(v any) {
	c.t.Helper()
	c.ws.Send(v)
}

// TestKillDuringSlowTurn: SIGKILL during a slow scripted turn, restart on
// the same data folder: the turn completes once; the transcript holds
// exactly one assistant answer, whole; a client that reconnects sees it.
func TestKillDuringSlowTurn(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server")
	}
	data := t.TempDir()
	const path = "/agents/echo-chat/crash"
	const reqID = "crash-req-1"
	question := strings.TrimSpace(strings.Repeat("Tell me everything about durable agents. ", 9))
	want := "You said: " + question // 8 characters per chunk, 50 ms apart: about 2.5 s

	s1 := serve(t, data)
	c1 := dial(t, "ws://"+s1.Host+path)
	c1.until(func(f frame) bool { return f.Type == wire.ChatMessages && f.Connect })
	body, _ := json.Marshal(map[string]any{"trigger": "submit-message", "messages": []message.Message{{
		ID: "crash-user-1", Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: question}},
	}}})
	c1.send(map[string]any{"type": wire.ChatRequest, "id": reqID,
		"init": map[string]any{"method": "POST", "body": string(body)}})
	chunks := 0
	c1.until(func(f frame) bool {
		if f.Ended() {
			t.Fatalf("the turn ended before the kill: %s", f.Raw)
		}
		if content(f) && f.ID == reqID {
			chunks++
		}
		return chunks >= 20
	})
	s1.Kill()
	t.Logf("killed after %d chunks", chunks)

	s2 := serve(t, data)
	c2 := dial(t, "ws://"+s2.Host+path)
	c2.until(func(f frame) bool { return f.Type == wire.ChatMessages && f.Connect })
	c2.send(map[string]any{"type": wire.StreamResumeRequest, "probeId": "probe-1"})
	answer := c2.until(func(f frame) bool {
		return f.ProbeID == "probe-1" || f.Type == wire.StreamResuming
	})
	offer := answer[len(answer)-1]
	var resumed []frame
	switch offer.Type {
	case wire.StreamResuming, wire.StreamPending:
		if offer.Type == wire.StreamPending {
			offer = c2.until(func(f frame) bool { return f.Type == wire.StreamResuming })[0]
		}
		if offer.ID != reqID {
			t.Fatalf("offered stream %s, want %s", offer.ID, reqID)
		}
		c2.send(map[string]any{"type": wire.StreamResumeAck, "id": reqID})
		resumed = c2.until(func(f frame) bool { return f.Type == wire.ChatResponse && f.ID == reqID && f.Ended() })
	default:
		t.Fatalf("the restarted server offered nothing to resume: %s\n%s", offer.Raw, s2.Log())
	}
	done := resumed[len(resumed)-1]
	if done.Outcome != "completed" {
		t.Fatalf("terminal frame %s", done.Raw)
	}
	// The resumed stream is applied as the client applies it; its message
	// must be the stored one, part for part.
	built := message.NewBuilder("")
	var text strings.Builder
	last := -1
	for _, f := range resumed {
		if !content(f) || f.ID != reqID {
			continue
		}
		if *f.Seq <= last {
			t.Fatalf("seq %d after %d: the resumed stream is not strictly increasing", *f.Seq, last)
		}
		last = *f.Seq
		var ch message.Chunk
		if err := json.Unmarshal([]byte(f.Body), &ch); err != nil {
			t.Fatal(err)
		}
		if ch.Type == message.ChunkTextDelta {
			text.WriteString(ch.Delta)
		}
		if err := built.Apply(ch); err != nil {
			t.Fatalf("chunk %d does not apply: %v", *f.Seq, err)
		}
	}
	// What was cut by the kill is kept (it may have been shown) and
	// marked; the answer itself follows it whole.
	if !strings.HasSuffix(text.String(), want) {
		t.Fatalf("the resumed stream's text is %q, want it to end with %q", text.String(), want)
	}
	if got := chat.MessageText(built.Message()); got != want {
		t.Fatalf("the resumed stream's answer is %q, want %q", got, want)
	}

	msgs := getMessages(t, "http://"+s2.Host+path+"/get-messages")
	var answers []message.Message
	for _, m := range msgs {
		if m.Role == message.RoleAssistant {
			answers = append(answers, m)
		}
	}
	if len(msgs) != 2 || len(answers) != 1 {
		t.Fatalf("transcript has %d messages, %d answers; want the question and one answer", len(msgs), len(answers))
	}
	var stored strings.Builder
	for _, p := range answers[0].Parts {
		if p.Type == message.PartText {
			stored.WriteString(p.Text)
		}
	}
	if stored.String() != text.String() {
		t.Fatalf("stored parts' text %q, the resumed stream's %q", stored.String(), text.String())
	}
	if got := chat.MessageText(answers[0]); got != want {
		t.Fatalf("answer %q, want %q", got, want)
	}

	// Storage: one turn, finished once, completed, run twice in all.
	s2.Stop()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(data, "agentry.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var streams, attempts int
	var status, outcome string
	err = db.View(ctx, func(tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM chat_streams`).Scan(&streams); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT status, outcome, attempts FROM chat_streams WHERE id = ?`, reqID).Scan(&status, &outcome, &attempts)
	})
	if err != nil {
		t.Fatal(err)
	}
	if streams != 1 || status != "done" || outcome != "completed" || attempts != 2 {
		t.Fatalf("stored turns %d; %s %s after %d attempts; want one, done, completed, 2 attempts", streams, status, outcome, attempts)
	}
}

func getMessages(t *testing.T, url string) []message.Message {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var msgs []message.Message
	if err := json.NewDecoder(resp.Body).Decode(&msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}
