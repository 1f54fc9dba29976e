// Package chatcrash kills the real agentry server (SIGKILL) during a slow
// scripted chat turn and checks that the restarted server completes the
// turn exactly once.
package chatcrash

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait: a deadline for a broken test, never a way to
// let time pass.
const waitLimit = 20 * time.Second

func moduleRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func buildAgentry(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agentry")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/agentry")
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// server is a running `agentry serve` process.
type server struct {
	cmd    *exec.Cmd
	addr   string // host:port
	logs   chan string
	readen chan struct{} // stderr fully read
}

var listenRe = regexp.MustCompile(`addr=http://(\S+)`)

func serve(t *testing.T, bin, data string) *server {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--data", data, "--delay", "50ms")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, logs: make(chan string, 1<<12), readen: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(s.readen)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, "agentry listening") {
				if m := listenRe.FindStringSubmatch(line); m != nil {
					addr <- m[1]
				}
			}
			select {
			case s.logs <- line:
			default:
			}
		}
	}()
	t.Cleanup(func() { s.kill(t) })
	select {
	case s.addr = <-addr:
	case <-s.readen:
		t.Fatalf("agentry exited before listening:\n%s", s.log())
	case <-time.After(waitLimit):
		t.Fatalf("agentry did not report its address:\n%s", s.log())
	}
	return s
}

func (s *server) log() string {
	var b strings.Builder
	for {
		select {
		case l := <-s.logs:
			b.WriteString(l + "\n")
		default:
			return b.String()
		}
	}
}

// kill sends SIGKILL (if the process still runs) and reaps it.
func (s *server) kill(t *testing.T) {
	if s.cmd.ProcessState != nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.readen
	s.cmd.Wait()
}

// stop asks the server to shut down (SIGTERM) and waits for it.
func (s *server) stop(t *testing.T) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.readen:
	case <-time.After(waitLimit):
		t.Fatal("agentry did not stop on SIGTERM")
	}
	if err := s.cmd.Wait(); err != nil {
		t.Fatalf("agentry exited with %v:\n%s", err, s.log())
	}
}

type frame struct {
	Type           string   `json:"type"`
	ID             string   `json:"id"`
	Body           string   `json:"body"`
	Done           bool     `json:"done"`
	Replay         bool     `json:"replay"`
	ReplayComplete bool     `json:"replayComplete"`
	Seq            *int     `json:"seq"`
	Outcome        string   `json:"outcome"`
	MessageIDs     []string `json:"messageIds"`
	ProbeID        string   `json:"probeId"`
	Connect        bool     `json:"connect"`
	raw            string
}

func (f frame) content() bool {
	return f.Type == "cf_agent_use_chat_response" && !f.Done && !f.ReplayComplete && f.Body != "" && f.Seq != nil
}

type client struct {
	t      *testing.T
	c      *websocket.Conn
	frames chan []byte
	done   chan struct{}
	err    error
}

func dial(t *testing.T, url string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, nil)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.SetReadLimit(1 << 24)
	cl := &client{t: t, c: c, frames: make(chan []byte, 1<<14), done: make(chan struct{})}
	go func() {
		defer close(cl.done)
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				cl.err = err
				return
			}
			cl.frames <- data
		}
	}()
	t.Cleanup(func() { c.CloseNow(); <-cl.done })
	return cl
}

func (c *client) next() frame {
	c.t.Helper()
	var data []byte
	select {
	case data = <-c.frames:
	case <-c.done:
		select {
		case data = <-c.frames:
		default:
			c.t.Fatalf("connection closed while waiting for a frame: %v", c.err)
		}
	case <-time.After(waitLimit):
		c.t.Fatal("timed out waiting for a frame")
	}
	var f frame
	if err := json.Unmarshal(data, &f); err != nil {
		c.t.Fatalf("frame %s: %v", data, err)
	}
	f.raw = string(data)
	return f
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
	data, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := c.c.Write(ctx, websocket.MessageText, data); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// TestKillDuringSlowTurn: SIGKILL during a slow scripted turn, restart on
// the same data folder: the turn completes once; the transcript holds
// exactly one assistant answer, whole; a client that reconnects sees it.
func TestKillDuringSlowTurn(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server")
	}
	bin := buildAgentry(t)
	data := t.TempDir()
	const path = "/agents/echo-chat/crash"
	const reqID = "crash-req-1"
	question := strings.TrimSpace(strings.Repeat("Tell me everything about durable agents. ", 9))
	want := "You said: " + question // 8 characters per chunk, 50 ms apart: about 2.5 s

	s1 := serve(t, bin, data)
	c1 := dial(t, "ws://"+s1.addr+path)
	c1.until(func(f frame) bool { return f.Type == "cf_agent_chat_messages" && f.Connect })
	body, _ := json.Marshal(map[string]any{"trigger": "submit-message", "messages": []message.Message{{
		ID: "crash-user-1", Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: question}},
	}}})
	c1.send(map[string]any{"type": "cf_agent_use_chat_request", "id": reqID,
		"init": map[string]any{"method": "POST", "body": string(body)}})
	chunks := 0
	c1.until(func(f frame) bool {
		if f.Done {
			t.Fatalf("the turn ended before the kill: %s", f.raw)
		}
		if f.content() && f.ID == reqID {
			chunks++
		}
		return chunks >= 20
	})
	s1.kill(t)
	t.Logf("killed after %d chunks", chunks)

	s2 := serve(t, bin, data)
	c2 := dial(t, "ws://"+s2.addr+path)
	c2.until(func(f frame) bool { return f.Type == "cf_agent_chat_messages" && f.Connect })
	c2.send(map[string]any{"type": "cf_agent_stream_resume_request", "probeId": "probe-1"})
	answer := c2.until(func(f frame) bool {
		return f.ProbeID == "probe-1" || f.Type == "cf_agent_stream_resuming"
	})
	offer := answer[len(answer)-1]
	var resumed []frame
	switch offer.Type {
	case "cf_agent_stream_resuming", "cf_agent_stream_pending":
		if offer.Type == "cf_agent_stream_pending" {
			offer = c2.until(func(f frame) bool { return f.Type == "cf_agent_stream_resuming" })[0]
		}
		if offer.ID != reqID {
			t.Fatalf("offered stream %s, want %s", offer.ID, reqID)
		}
		c2.send(map[string]any{"type": "cf_agent_stream_resume_ack", "id": reqID})
		resumed = c2.until(func(f frame) bool { return f.Type == "cf_agent_use_chat_response" && f.ID == reqID && f.Done })
	default:
		t.Fatalf("the restarted server offered nothing to resume: %s\n%s", offer.raw, s2.log())
	}
	done := resumed[len(resumed)-1]
	if done.Outcome != "completed" {
		t.Fatalf("terminal frame %s", done.raw)
	}
	var text strings.Builder
	last := -1
	for _, f := range resumed {
		if !f.content() || f.ID != reqID {
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
	}
	if text.String() != want {
		t.Fatalf("the resumed stream's text is %q, want %q", text.String(), want)
	}

	msgs := getMessages(t, "http://"+s2.addr+path+"/get-messages")
	var answers []message.Message
	for _, m := range msgs {
		if m.Role == message.RoleAssistant {
			answers = append(answers, m)
		}
	}
	if len(msgs) != 2 || len(answers) != 1 {
		t.Fatalf("transcript has %d messages, %d answers; want the question and one answer", len(msgs), len(answers))
	}
	var got strings.Builder
	for _, p := range answers[0].Parts {
		if p.Type == message.PartText {
			got.WriteString(p.Text)
		}
	}
	if got.String() != want {
		t.Fatalf("answer %q, want %q", got.String(), want)
	}

	// Storage: one turn, finished once, completed, run twice in all.
	s2.stop(t)
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
