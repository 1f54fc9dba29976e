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

// client is a WebSocket client (testenv.WSClient) of one Counter instance.
type client struct {
	t      *testing.T
	ws     *testenv.WSClient[frame]
	c      *websocket.Conn // ws's connection, to drop it without a close
	nextID int
}

// dial connects to /agents/counter/{name} and returns the client and the
// count in the connect-time cf_agent_state frame (-1 when the instance has
// no state yet, which the identity frame announces with stateFollows).
func dial(t *testing.T, s *server, name string) (*client, int) {
	t.Helper()
	ws := testenv.DialWS[frame](t, 10*time.Second, "ws://"+s.Host+"/agents/counter/"+name)
	cl := &client{t: t, ws: ws, c: ws.Conn()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	id := cl.read(ctx)
	var head wire.IdentityFrame
	if err := json.Unmarshal(id.Raw, &head); err != nil || head.Type != wire.Identity || head.Name != name || head.Agent != "counter" {
		t.Fatalf("first frame = %s; want cf_agent_identity of counter %q", id.Raw, name)
	}
	count := -1
	if head.StateFollows {
		st := cl.read(ctx)
		if st.Value.Type != wire.State {
			t.Fatalf("frame after identity with stateFollows = %s; want cf_agent_state", st.Raw)
		}
		count = countOf(t, st.Value.State)
	}
	if mcp := cl.read(ctx); mcp.Value.Type != wire.MCPServers {
		t.Fatalf("connect frame = %s; want cf_agent_mcp_servers", mcp.Raw)
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

// read returns the next frame, which must be a JSON text frame.
func (cl *client) read(ctx context.Context) testenv.Frame[frame] {
	cl.t.Helper()
	f, err := cl.ws.Next(ctx)
	if err != nil {
		cl.t.Fatalf("read: %v", err)
	}
	if f.MessageType != websocket.MessageText {
		cl.t.Fatalf("got a %v frame; want text", f.MessageType)
	}
	if f.Err != nil {
		cl.t.Fatalf("frame %s is not JSON: %v", f.Raw, f.Err)
	}
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
	req := map[string]any{"type": wire.RPC, "id": id, "method": method, "args": args}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.ws.SendContext(ctx, req); err != nil {
		cl.t.Fatalf("send %v: %v", req, err)
	}
	for {
		f := cl.read(ctx)
		if f.Value.Type != wire.RPC || f.Value.ID != id {
			continue
		}
		if !f.Value.Success {
			cl.t.Fatalf("rpc %v failed: %s", req, f.Raw)
		}
		if f.Value.Done == nil || !*f.Value.Done {
			cl.t.Fatalf("rpc %v: response %s is not final", req, f.Raw)
		}
		return f.Value.Result
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
		f, err := cl.ws.Next(ctx)
		if err != nil {
			cl.t.Fatalf("waiting for count %d: %v", want, err)
		}
		if f.MessageType != websocket.MessageText {
			continue
		}
		if f.Err != nil {
			cl.t.Fatalf("frame %s is not JSON: %v", f.Raw, f.Err)
		}
		if f.Value.Type != wire.State {
			continue
		}
		switch got := countOf(cl.t, f.Value.State); {
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
