package browser

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/internal/testkit/browsertest"
)

// TestPlaygroundApprovals runs approvals.mjs: the page answers
// get_local_time, approves a helper's publish_findings inside its panel,
// and denies and approves delete_helper_runs.
func TestPlaygroundApprovals(t *testing.T) {
	browsertest.Require(t)
	base := serve(t, 5*time.Millisecond, 0)
	shots := filepath.Join(browsertest.Dir(), "screenshots")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := runNode(t, 3*time.Minute, "approvals.mjs", base, shots)
	if err != nil || !strings.Contains(out, "PASS approvals") {
		t.Fatalf("approvals.mjs: %v\n%s", err, out)
	}
	t.Logf("approvals.mjs:\n%s", out)
}
