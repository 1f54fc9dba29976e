package browser

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPlaygroundApprovals runs approvals.mjs: the page answers
// get_local_time, approves a helper's publish_findings inside its panel,
// and denies and approves delete_helper_runs.
func TestPlaygroundApprovals(t *testing.T) {
	requireBrowser(t)
	base := serve(t, 5*time.Millisecond, 0)
	shots := filepath.Join(dir(), "screenshots")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "approvals.mjs", base, shots)
	cmd.Dir = dir()
	cmd.Env = append(os.Environ(), "CHROMIUM="+chromiumPath)
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil || !strings.Contains(out.String(), "PASS approvals") {
		t.Fatalf("approvals.mjs: %v\n%s", err, out.String())
	}
	t.Logf("approvals.mjs:\n%s", out.String())
}
