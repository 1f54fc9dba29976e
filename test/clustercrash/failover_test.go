package clustercrash

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/testenv"
)

// TestFailoverWithDefaultLease (issue 24, item 4): with the default lease
// (cluster.DefaultLease), an instance whose node is killed (kill -9) is
// served by another node again after at most a lease and a quarter (3.75
// s). The test measures the wall time from the kill to the first answer
// of the instance through the survivor and logs it (the bound itself is
// pinned on a fake clock by cluster's
// TestDefaultLeaseFailsOverWithinFiveSeconds); it asserts that the
// instance is served again and that its data survived.
func TestFailoverWithDefaultLease(t *testing.T) {
	e := newEnv(t)
	start := func(id string) *testenv.Process {
		p := testenv.StartProcess(t, 60*time.Second, bin.Path(t), "-postgres", e.url, "-node-id", id,
			"-lease", cluster.DefaultLease.String(), "-delay", "10ms")
		e.nodes[id] = p
		return p
	}
	start("a")
	b := start("b")
	e.balanced("a", "b")
	name := e.fanName("a")
	var st map[string]int
	if err := get(t, b.Host, fmt.Sprintf("/agents/fan/%s/fan-out?n=5&tag=f", name), &st); err != nil || st["completed"] != 5 {
		t.Fatalf("fan-out before the kill: %v %v", st, err)
	}
	_ = e.nodes["a"].Kill()
	delete(e.nodes, "a")
	killed := time.Now()
	c := &http.Client{Timeout: 10 * time.Second}
	var took time.Duration
	e.until(60*time.Second, "the instance served by the survivor", func() bool {
		resp, err := c.Get("http://" + b.Host + "/agents/fan/" + name + "/finishes")
		if err != nil {
			return false
		}
		resp.Body.Close()
		took = time.Since(killed)
		return resp.StatusCode == http.StatusOK
	})
	t.Logf("failover after kill -9 with the default lease %v: served again %v after the kill", cluster.DefaultLease, took.Round(10*time.Millisecond))
	e.check(b.Host, name, "f", 5)
}
