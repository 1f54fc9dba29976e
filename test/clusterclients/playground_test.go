package clusterclients

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/internal/testkit/browsertest"
)

// TestPlaygroundThroughAnyNode runs test/browser/cluster.mjs: the
// playground is loaded from node b, which does not own the chat (a does);
// research answers stream while c (no part in the chat) is killed, then
// while a is killed: the page reconnects through b to the new owner, each
// answer completes and is shown once, and the chat goes on.
func TestPlaygroundThroughAnyNode(t *testing.T) {
	browsertest.Require(t)
	// At 100 ms a chunk a research answer takes about 8 s: the kills fall
	// inside it.
	c := startCluster(t, 100*time.Millisecond, "a", "b", "c", "d")
	name := c.assistantName("a", "page")
	shots := filepath.Join(browsertest.Dir(), "screenshots")
	text, err := browsertest.RunSteps(t, 5*time.Minute, func(step string) {
		switch step {
		case "kill-other":
			c.kill("c", name)
		case "kill-owner":
			c.kill("a", name)
		default:
			t.Errorf("unknown step %q", step)
		}
	}, "cluster.mjs", "http://"+c.nodes["b"].Host, name, shots)
	if err != nil || !strings.Contains(text, "PASS cluster") {
		t.Fatalf("cluster.mjs: %v\n%s", err, text)
	}
	t.Logf("cluster.mjs:\n%s", text)
}
