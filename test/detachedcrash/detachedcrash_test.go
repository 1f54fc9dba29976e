// Package detachedcrash kills a real server process (SIGKILL) while two
// detached agent-tool runs stream, restarts it on the same data folder,
// and checks that each run's end is delivered exactly once: one OnFinish
// (logged in the parent's own table) and one chat notification.
package detachedcrash

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/chat/message"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait: a deadline for a broken test, never a way to
// let time pass.
const waitLimit = 40 * time.Second

const (
	runOnFinish = "bg-onfinish"
	runNotify   = "bg-notify"
)

func buildServer(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(t.TempDir(), "detachedcrash-server")
	cmd := exec.Command("go", "build", "-o", bin, "./server")
	cmd.Dir = filepath.Dir(file)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// proc is a running server process.
type proc struct {
	cmd    *exec.Cmd
	addr   string
	mu     sync.Mutex
	lines  []string
	readen chan struct{}
}

var listenRe = regexp.MustCompile(`agentry listening.* addr=http://(\S+)`)

func start(t *testing.T, bin, data string) *proc {
	t.Helper()
	cmd := exec.Command(bin, "--addr", "127.0.0.1:0", "--data", data, "--delay", "100ms")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, readen: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(p.readen)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.mu.Unlock()
			if m := listenRe.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			}
		}
	}()
	t.Cleanup(p.kill)
	select {
	case p.addr = <-addr:
	case <-p.readen:
		t.Fatalf("server exited before listening:\n%s", p.log())
	case <-time.After(waitLimit):
		t.Fatalf("server did not report its address:\n%s", p.log())
	}
	return p
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// kill sends SIGKILL (if the process still runs) and reaps it.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.readen
	p.cmd.Wait()
}

// stop shuts the server down with SIGTERM and waits for it.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.readen:
	case <-time.After(waitLimit):
		t.Fatal("server did not stop on SIGTERM")
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("server exited with %v:\n%s", err, p.log())
	}
}

// frame is what the test reads of a server frame.
type frame struct {
	Type     string          `json:"type"`
	ID       string          `json:"id"`
	Success  bool            `json:"success"`
	Result   json.RawMessage `json:"result"`
	Error    string          `json:"error"`
	Sequence int64           `json:"sequence"`
	Event    struct {
		Kind  string `json:"kind"`
		RunID string `json:"runId"`
	} `json:"event"`
}

// client is a WebSocket connection to the parent that records frames.
type client struct {
	t       *testing.T
	c       *websocket.Conn
	done    chan struct{}
	mu      sync.Mutex
	frames  []frame
	events  int // frames that are not RPC answers: every state change
	changed chan struct{}
	nextID  int
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+addr+"/agents/crash-parent/p1", nil)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.SetReadLimit(-1)
	cl := &client{t: t, c: c, done: make(chan struct{}), changed: make(chan struct{})}
	go func() {
		defer close(cl.done)
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				return
			}
			var f frame
			if json.Unmarshal(data, &f) != nil {
				continue
			}
			cl.mu.Lock()
			cl.frames = append(cl.frames, f)
			if f.Type != "rpc" {
				cl.events++
			}
			close(cl.changed)
			cl.changed = make(chan struct{})
			cl.mu.Unlock()
		}
	}()
	t.Cleanup(cl.close)
	return cl
}

func (c *client) close() {
	c.c.CloseNow()
	<-c.done
}

// call makes an RPC call and decodes its result into out.
func (c *client) call(ctx context.Context, method string, out any) {
	c.t.Helper()
	c.mu.Lock()
	c.nextID++
	id := fmt.Sprint("call-", c.nextID)
	c.mu.Unlock()
	req, _ := json.Marshal(map[string]any{"type": "rpc", "id": id, "method": method, "args": []any{}})
	if err := c.c.Write(ctx, websocket.MessageText, req); err != nil {
		c.t.Fatalf("rpc %s: %v", method, err)
	}
	for {
		c.mu.Lock()
		ch := c.changed
		var hit *frame
		for i := range c.frames {
			if f := c.frames[i]; f.Type == "rpc" && f.ID == id {
				hit = &f
			}
		}
		c.mu.Unlock()
		if hit != nil {
			if !hit.Success {
				c.t.Fatalf("rpc %s failed: %s", method, hit.Error)
			}
			if err := json.Unmarshal(hit.Result, out); err != nil {
				c.t.Fatalf("rpc %s result %s: %v", method, hit.Result, err)
			}
			return
		}
		select {
		case <-ch:
		case <-c.done:
			c.t.Fatalf("connection closed during rpc %s", method)
		case <-ctx.Done():
			c.t.Fatalf("rpc %s timed out", method)
		}
	}
}

// until re-evaluates cond every time a state-changing frame arrives.
func (c *client) until(ctx context.Context, what string, cond func() bool) {
	c.t.Helper()
	for {
		c.mu.Lock()
		seen := c.events
		c.mu.Unlock()
		if cond() {
			return
		}
		for {
			c.mu.Lock()
			n, ch := c.events, c.changed
			c.mu.Unlock()
			if n != seen {
				break
			}
			select {
			case <-ch:
			case <-ctx.Done():
				c.t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
}

// chunks counts a run's agent-tool chunk frames.
func (c *client) chunks(runID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, f := range c.frames {
		if f.Type == "agent-tool-event" && f.Event.RunID == runID && f.Event.Kind == "chunk" {
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

func messages(t *testing.T, addr string) []message.Message {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/agents/crash-parent/p1/get-messages")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("get-messages: %s", resp.Status)
	}
	var msgs []message.Message
	if err := json.NewDecoder(resp.Body).Decode(&msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// TestDetachedDeliveryAfterKill: two detached runs stream; the server is
// SIGKILLed mid-stream and restarted on the same data folder; the runs
// finish (their children resume), the OnFinish run is delivered once with
// completed, the notify run adds its message to the parent's chat once (and
// the parent's model answers it), and both registry rows are completed.
func TestDetachedDeliveryAfterKill(t *testing.T) {
	bin := buildServer(t)
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLimit)
	defer cancel()

	s1 := start(t, bin, data)
	c1 := dial(t, s1.addr)
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
	s1.kill()
	c1.close()

	s2 := start(t, bin, data)
	c2 := dial(t, s2.addr)
	notifyID := "detached-finish:" + runNotify + ":completed"
	var log []delivery
	var runs []runState
	var msgs []message.Message
	c2.until(ctx, "both runs delivered", func() bool {
		c2.call(ctx, "finishLog", &log)
		c2.call(ctx, "runs", &runs)
		msgs = messages(t, s2.addr)
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
	s2.stop(t)
}
