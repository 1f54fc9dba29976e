// Package crash kills the real agentry server (cmd/agentry, built once per
// run) with SIGKILL and checks what survives on its SQLite file: every write
// acknowledged to a client, and durable schedules, which fire exactly once
// after the restart — whether they come due while the server is up again or
// while it is down.
package crash

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/agentry/agentry/internal/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, agentry) }

const instancePath = "Counter/crash" // the storage key of /agents/counter/crash

// scheduleAcked runs the common first life of the server: a new instance
// gets increment(5) and incrementLater(seconds, 10), and the server is
// SIGKILLed as soon as the second call was acknowledged. It returns the
// schedule id.
func scheduleAcked(t *testing.T, dir string, seconds float64) string {
	t.Helper()
	s := startServer(t, dir)
	c, count := dial(t, s, "crash")
	if count != -1 {
		t.Fatalf("new instance connected with count %d; want no state", count)
	}
	if got := string(c.call("increment", 5)); got != "5" {
		t.Fatalf("increment(5) = %s; want 5", got)
	}
	var id string
	if err := json.Unmarshal(c.call("incrementLater", seconds, 10), &id); err != nil || id == "" {
		t.Fatalf("incrementLater returned no schedule id (%v)", err)
	}
	s.kill()
	c.c.CloseNow()
	return id
}

// TestKillAfterAck: SIGKILL right after the acknowledgements loses nothing,
// and the pending schedule fires exactly once, at its due time, after the
// restart.
func TestKillAfterAck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	id := scheduleAcked(t, dir, 2)

	// Both acknowledged writes are in the file the killed process left.
	f := readDB(t, dir, instancePath, id)
	if !f.found || f.schedules != 1 {
		t.Fatalf("after SIGKILL: schedule %s found=%v, %d schedules; want it, alone", id, f.found, f.schedules)
	}
	due := f.dueAt

	s := startServer(t, dir)
	c, count := dial(t, s, "crash")
	if count != 5 {
		t.Fatalf("after SIGKILL and restart, connect state count = %d; want 5 (acknowledged increment lost)", count)
	}
	c.waitCount(15, 20*time.Second)
	if now := time.Now(); now.Before(due) {
		t.Fatalf("schedule fired at %v, before its due time %v", now, due)
	}
	checkFired(t, c, s, dir, id)
}

// TestScheduleDueWhileDown: the schedule comes due while the server is
// down; it fires once when the server starts again.
func TestScheduleDueWhileDown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	id := scheduleAcked(t, dir, 1)

	f := readDB(t, dir, instancePath, id)
	if !f.found {
		t.Fatalf("after SIGKILL: schedule %s is not in the database", id)
	}
	// The server is down; let the due time (stored in the file) pass on the
	// real clock the server uses.
	wait := time.Until(f.dueAt) + 20*time.Millisecond
	if wait > 3*time.Second {
		t.Fatalf("schedule due in %v; the test keeps it under 3s", wait)
	}
	time.Sleep(wait)

	s := startServer(t, dir)
	c, count := dial(t, s, "crash")
	switch count {
	case 15: // fired before we connected
	case 5:
		c.waitCount(15, 20*time.Second)
	default:
		t.Fatalf("after restart past the due time, connect state count = %d; want 5 or 15", count)
	}
	checkFired(t, c, s, dir, id)
}

// checkFired checks, once schedule id fired, that get() answers 15 on c;
// then it stops s cleanly and checks that the database holds the count and
// no schedule, and that the next start keeps them.
func checkFired(t *testing.T, c *client, s *server, dir, id string) {
	t.Helper()
	if got := string(c.call("get")); got != "15" {
		t.Fatalf("get() after the schedule fired = %s; want 15", got)
	}
	c.close()
	s.term()

	f := readDB(t, dir, instancePath, id)
	if f.state != `{"count":15}` || f.schedules != 0 {
		t.Fatalf("after the fire and a clean shutdown: state %s, %d schedules; want {\"count\":15} and none", f.state, f.schedules)
	}
	restartAndCheck(t, dir, 15)
}

// restartAndCheck starts the server once more on dir and checks that the
// count is still want: no schedule is left to fire a second time.
func restartAndCheck(t *testing.T, dir string, want int) {
	t.Helper()
	s := startServer(t, dir)
	c, count := dial(t, s, "crash")
	if count != want {
		t.Fatalf("after another restart, connect state count = %d; want %d", count, want)
	}
	if got := string(c.call("get")); got != fmt.Sprint(want) {
		t.Fatalf("get() after another restart = %s; want %d", got, want)
	}
	s.kill()
	c.c.CloseNow()
	if f := readDB(t, dir, instancePath, ""); f.state != fmt.Sprintf(`{"count":%d}`, want) || f.schedules != 0 {
		t.Fatalf("after another restart: state %s, %d schedules; want count %d and none", f.state, f.schedules, want)
	}
}
