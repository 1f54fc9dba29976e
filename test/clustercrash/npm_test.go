package clustercrash

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/internal/testkit/testenv"
)

// TestNPMFanOutThroughKill is the kill test with the real npm client: an
// AgentClient connected to node b, which does not own the parent, calls
// the parent's fanOut over RPC, and a node is killed (kill -9) once a
// quarter of the children finished. Killing the parent's node a: b closes
// the client's socket, the client reconnects and calls again with the
// same run ids, and the new owner answers. Killing a child's node c: the
// call goes on and answers once c's children were taken over. Either
// way every run completed, each finish hook fired once, and no finished
// child ran again.
func TestNPMFanOutThroughKill(t *testing.T) {
	testenv.RequireNode(t)
	t.Run("parent", func(t *testing.T) { npmKillDuring(t, "a") })
	t.Run("child", func(t *testing.T) { npmKillDuring(t, "c") })
}

func npmKillDuring(t *testing.T, victim string) {
	e := newEnv(t)
	e.start("a")
	b := e.start("b")
	e.start("c")
	e.balanced("a", "b", "c")
	n := fanOut()
	name := e.fanName("a") // owned by a
	const tag = "npm"

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "cluster-fanout.mjs", b.Host, name, strconv.Itoa(n), tag)
	cmd.Dir = testenv.NPMDir()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if t.Failed() {
			cancel()
			t.Logf("cluster-fanout.mjs printed:\n%s", out.String())
			e.dump(tag)
		}
	})

	e.until(120*time.Second, "a quarter of the children done", func() bool {
		select {
		case err := <-done:
			t.Fatalf("cluster-fanout.mjs ended before the kill: %v\n%s", err, out.String())
		default:
		}
		return e.childrenDone(tag) >= n/4
	})
	_ = e.nodes[victim].Kill()
	delete(e.nodes, victim)
	t.Logf("killed %s with %d of %d children done", victim, e.childrenDone(tag), n)

	if err := <-done; err != nil {
		t.Fatalf("cluster-fanout.mjs: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "PASS fanout") {
		t.Fatalf("script did not pass:\n%s", out.String())
	}
	if victim == "a" && !strings.Contains(out.String(), "socket closed 1012") {
		t.Errorf("the client's socket was never closed by the kill:\n%s", out.String())
	}
	t.Logf("script:\n%s", out.String())
	e.check(b.Host, name, tag, n)
}
