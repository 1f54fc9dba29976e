package clustercrash

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/internal/testkit/testenv"
)

// TestPostgresRestartDuringFanOut (issue 24, item 1): PostgreSQL restarts
// at once (pg_ctl restart -m immediate) while a fan-out of awaited runs is
// in flight on three nodes, and then stops again for a few seconds, longer
// than the nodes' leases. The nodes stay up on their ports; while the
// database is down a request for an agent not in memory gets 503 with
// Retry-After and a WebSocket to one is refused (503) or closed with 1013,
// never left hanging; once the database is back, the client's repeated
// request completes every run, each finish hook fired once and no child
// ran a second turn (nothing acknowledged lost, nothing finished redone).
//
// It failed 3 of about 30 runs in the ways RELIABILITY.md explains (a
// write refused while the node's lease had lapsed and was then renewed
// under the same epoch; a child start on another node that timed out and
// ended the run); after their fixes it passed 40 of 40, and it runs in
// make test. Under -race it failed 1 of 10 (RELIABILITY.md, "an end taken
// by a stale copy": the end that the child's fuse recorded for the
// parent's new hydration was taken by the dropped copy following the same
// child run, whose hook the fence refused, and the new hydration
// delivered nothing); fixed in agenttool, it runs under -race too.
func TestPostgresRestartDuringFanOut(t *testing.T) {
	e := newEnv(t)
	e.start("a")
	b := e.start("b")
	e.start("c")
	e.balanced("a", "b", "c")
	t.Cleanup(func() {
		if t.Failed() {
			e.dump("r")
		}
	})
	n := fanOut() / 2
	name := e.fanName("a")
	// Read before the restart: right after it the test's own pool may
	// hold a dead connection, and a failed read of the owners finds none.
	fresh := e.fanNameFrom("a", 200000)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var st map[string]int
		err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=r", name, n), &st)
		t.Logf("fan-out request across the restarts: %v %v", st, err)
	}()
	e.until(60*time.Second, "a quarter of the children done", func() bool { return e.childrenDone("r") >= n/4 })
	if err := pg.Restart(true); err != nil {
		t.Fatal(err)
	}
	done := e.childrenDone("r")
	t.Logf("restarted PostgreSQL (immediate) with %d of %d children done", done, n)
	e.until(60*time.Second, "a child done after the restart", func() bool { return e.childrenDone("r") > done })

	// Down for a while: longer than a lease.
	if err := pg.StopServer(true); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	down := true
	defer func() {
		if down {
			pg.StartServer()
		}
	}()
	c := &http.Client{Timeout: 30 * time.Second}
	t0 := time.Now()
	resp, err := c.Get("http://" + b.Host + "/agents/fan/" + fresh + "/finishes")
	if err != nil {
		t.Fatalf("GET during the outage: %v (the node must answer)", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("GET during the outage: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	t.Logf("GET during the outage: 503 after %v", time.Since(t0).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	ws, wresp, err := testenv.TryDialWS[frame](t, 30*time.Second, "ws://"+b.Host+"/agents/fan/"+fresh+"x", nil)
	switch {
	case err != nil && wresp != nil && wresp.StatusCode == http.StatusServiceUnavailable:
		t.Logf("WebSocket during the outage: refused with 503")
	case err != nil:
		t.Fatalf("WebSocket during the outage: %v", err)
	default:
		ce, cerr := ws.CloseError(ctx)
		if fs := ws.Frames(); cerr != nil || ce.Code != websocket.StatusTryAgainLater || len(fs) != 0 {
			t.Fatalf("WebSocket during the outage: %d frames, then %v %v, want a close with 1013", len(fs), ce, cerr)
		}
		t.Logf("WebSocket during the outage: closed with 1013 (%s)", ce.Reason)
	}
	cancel()
	// Keep it down past the nodes' leases.
	if wait := 2*leaseDuration() - time.Since(stopped); wait > 0 {
		time.Sleep(wait) // an outage has a length; nothing to wait for but time
	}
	if err := pg.StartServer(); err != nil {
		t.Fatal(err)
	}
	down = false
	t.Logf("PostgreSQL back after %v", time.Since(stopped).Round(time.Millisecond))
	for id, p := range e.nodes {
		if p.Signal(syscall.Signal(0)) != nil {
			t.Fatalf("node %s exited during the outage:\n%s", id, p.Log())
		}
	}
	// The client repeats its request (same run ids) until every run of it
	// completed: a run refused while its shard changed hands (the nodes
	// rebalance after the outage) is asked again; one that completed
	// returns its stored result.
	var st map[string]int
	asked := 0
	e.until(120*time.Second, "the repeated fan-out completed", func() bool {
		st = nil
		asked++
		return get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=%d&tag=r", name, n), &st) == nil && st["completed"] == n
	})
	t.Logf("fan-out asked again %d times: %v", asked, st)
	if st["completed"] != n {
		t.Errorf("repeated fan-out: %v, want %d completed", st, n)
	}
	e.check(b.Host, name, "r", n)
	wg.Wait()
}

// leaseDuration is lease() as a duration.
func leaseDuration() time.Duration {
	d, _ := time.ParseDuration(lease())
	return d
}
