package crash

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"

	_ "modernc.org/sqlite" // the test reads the server's database file directly
)

// agentry is cmd/agentry, built once (with -race when the tests run with
// -race, so that a data race in the server fails its clean exit).
var agentry = &testenv.Binary{Pkg: "github.com/agentry/agentry/cmd/agentry", Race: testenv.Race}

// server is one `agentry serve` subprocess.
type server struct {
	*testenv.Process
	t *testing.T
}

// startServer runs `agentry serve --addr 127.0.0.1:0 --data dir` and returns
// once the process logged the address it listens on.
func startServer(t *testing.T, dir string) *server {
	t.Helper()
	p := testenv.StartProcess(t, 30*time.Second, agentry.Path(t), "serve", "--addr", "127.0.0.1:0", "--data", dir, "-v")
	return &server{Process: p, t: t}
}

// kill SIGKILLs the process: no shutdown code runs.
func (s *server) kill() {
	s.t.Helper()
	err := s.Kill()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		s.t.Fatalf("after SIGKILL, Wait = %v; want killed by SIGKILL", err)
	}
}

// term sends SIGTERM and requires a clean exit with status 0 (a race
// report from a -race build would exit 66).
func (s *server) term() {
	s.t.Helper()
	start := time.Now()
	s.Stop()
	s.t.Logf("clean shutdown took %v", time.Since(start))
}

// frame is a server frame as the tests read it: testenv.WireFrame,
// the tests' one frame type.
type frame = testenv.WireFrame

type counterState struct {
	Count *int `json:"count"`
}

func countOf(t *testing.T, raw json.RawMessage) int {
	t.Helper()
	var s counterState
	if err := json.Unmarshal(raw, &s); err != nil || s.Count == nil {
		t.Fatalf("state %s is not {count:N} (%v)", raw, err)
	}
	return *s.Count
}

// client is a raw WebSocket client of one Counter instance.
type client struct {
	t      *testing.T
	c      *websocket.Conn
	nextID int
}

// dial connects to /agents/counter/{name} and returns the client and the
// count in the connect-time cf_agent_state frame (-1 when the instance has
// no state yet, which the identity frame announces with stateFollows).
func dial(t *testing.T, s *server, name string) (*client, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+s.Host+"/agents/counter/"+name, nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	cl := &client{t: t, c: c}
	t.Cleanup(func() { c.CloseNow() })

	id := cl.read(ctx)
	var head struct {
		frame
		StateFollows bool `json:"stateFollows"`
	}
	if err := json.Unmarshal(id.raw, &head); err != nil || head.Type != wire.Identity || head.Name != name || head.Agent != "counter" {
		t.Fatalf("first frame = %s; want cf_agent_identity of counter %q", id.raw, name)
	}
	count := -1
	if head.StateFollows {
		st := cl.read(ctx)
		if st.Type != wire.State {
			t.Fatalf("frame after identity with stateFollows = %s; want cf_agent_state", st.raw)
		}
		count = countOf(t, st.State)
	}
	if mcp := cl.read(ctx); mcp.Type != wire.MCPServers {
		t.Fatalf("connect frame = %s; want cf_agent_mcp_servers", mcp.raw)
	}
	return cl, count
}

// close closes the connection with the close handshake (1000), so that a
// clean shutdown of the server that follows does not wait for it.
func (cl *client) close() {
	cl.t.Helper()
	if err := cl.c.Close(websocket.StatusNormalClosure, ""); err != nil {
		cl.t.Fatalf("close: %v", err)
	}
}

type rawFrame struct {
	frame
	raw []byte
}

func (cl *client) read(ctx context.Context) rawFrame {
	cl.t.Helper()
	typ, data, err := cl.c.Read(ctx)
	if err != nil {
		cl.t.Fatalf("read: %v", err)
	}
	if typ != websocket.MessageText {
		cl.t.Fatalf("got a %v frame; want text", typ)
	}
	var f rawFrame
	if err := json.Unmarshal(data, &f.frame); err != nil {
		cl.t.Fatalf("frame %s is not JSON: %v", data, err)
	}
	f.raw = data
	return f
}

// call sends an rpc frame and returns the result of its final, successful
// response. Other frames read on the way (state broadcasts) are skipped.
func (cl *client) call(method string, args ...any) json.RawMessage {
	cl.t.Helper()
	cl.nextID++
	id := strconv.Itoa(cl.nextID)
	if args == nil {
		args = []any{}
	}
	req, _ := json.Marshal(map[string]any{"type": wire.RPC, "id": id, "method": method, "args": args})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.c.Write(ctx, websocket.MessageText, req); err != nil {
		cl.t.Fatalf("send %s: %v", req, err)
	}
	for {
		f := cl.read(ctx)
		if f.Type != wire.RPC || f.ID != id {
			continue
		}
		if !f.Success {
			cl.t.Fatalf("rpc %s failed: %s", req, f.raw)
		}
		if f.Done == nil || !*f.Done {
			cl.t.Fatalf("rpc %s: response %s is not final", req, f.raw)
		}
		return f.Result
	}
}

// waitCount reads frames until a cf_agent_state broadcast with count want
// arrives, within timeout. A count above want fails at once: an increment
// was applied twice.
func (cl *client) waitCount(want int, timeout time.Duration) {
	cl.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		typ, data, err := cl.c.Read(ctx)
		if err != nil {
			cl.t.Fatalf("waiting for count %d: %v", want, err)
		}
		if typ != websocket.MessageText {
			continue
		}
		var f frame
		if err := json.Unmarshal(data, &f); err != nil {
			cl.t.Fatalf("frame %s is not JSON: %v", data, err)
		}
		if f.Type != wire.State {
			continue
		}
		switch got := countOf(cl.t, f.State); {
		case got == want:
			return
		case got > want:
			cl.t.Fatalf("count went to %d, past %d: the schedule fired more than once", got, want)
		}
	}
}

// dbFacts is what the tests read from the server's SQLite file while the
// server is down.
type dbFacts struct {
	state     string    // instances.state of the instance
	schedules int       // rows in schedules (every instance)
	dueAt     time.Time // due time of the schedule with the asked id, if any
	found     bool      // whether that schedule exists
}

// readDB opens the server's database read-only (so that the next server
// start, not this reader, recovers a WAL left by a SIGKILL) and reads the
// instance's state and the schedules.
func readDB(t *testing.T, dir, path, scheduleID string) dbFacts {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "agentry.db")+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	var f dbFacts
	var state sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT state FROM instances WHERE path = ?`, path).Scan(&state); err != nil {
		t.Fatalf("read instance %s: %v", path, err)
	}
	f.state = state.String
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM schedules`).Scan(&f.schedules); err != nil {
		t.Fatalf("count schedules: %v", err)
	}
	if scheduleID != "" {
		var due int64
		err := db.QueryRowContext(ctx, `SELECT due_at FROM schedules WHERE id = ?`, scheduleID).Scan(&due)
		switch {
		case err == nil:
			f.dueAt, f.found = time.UnixMilli(due), true
		case !errors.Is(err, sql.ErrNoRows):
			t.Fatalf("read schedule %s: %v", scheduleID, err)
		}
	}
	return f
}
