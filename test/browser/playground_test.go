// Package browser runs the web playground in a real browser: Debian's
// Chromium, driven by playwright-core from playground.mjs, against the
// same server `agentry serve` runs (internal/demo).
package browser

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/internal/testkit/browsertest"
	"github.com/agentry/agentry/store/sqlite"
)

// serve starts the demo server (agents and playground) on 127.0.0.1 with
// the offline models streaming a chunk every delay and the Researcher's
// search taking search, and returns its base URL.
func serve(t *testing.T, delay, search time.Duration) string {
	t.Helper()
	return serveModels(t, agentsastools.Offline(delay, nil), search)
}

// serveModels starts the demo server with the given models.
func serveModels(t *testing.T, models *agentsastools.Models, search time.Duration) string {
	t.Helper()
	return serveDemo(t, demo.Options{Models: models, SearchTime: search})
}

// serveDemo starts the demo server with o (DB, Logger and IdleTimeout are
// filled in).
func serveDemo(t *testing.T, o demo.Options) string {
	t.Helper()
	return serveDemoWrapped(t, o, nil)
}

// serveDemoWrapped starts the demo server with o, its handler wrapped by
// wrap (nil: served as is).
func serveDemoWrapped(t *testing.T, o demo.Options, wrap func(*demo.Demo, http.Handler) http.Handler) string {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentry.db"))
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	o.DB, o.Logger, o.IdleTimeout = db, logger, -1
	d, err := demo.Start(ctx, o)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := d.Handler()
	if wrap != nil {
		h = wrap(d, h)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Agents.Close() // WebSockets first: Shutdown does not wait for hijacked connections
		if err := hs.Shutdown(sctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		db.Close()
	})
	return "http://" + ln.Addr().String()
}

// runNode runs a script of this folder with node against Chromium (in a
// profile of its own), within timeout, and returns what it printed.
func runNode(t *testing.T, timeout time.Duration, script string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Dir = browsertest.Dir()
	cmd.Env = browsertest.Env(t)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestPlayground runs playground.mjs: research that streams and survives a
// refresh, a comparison, drill-in with a follow-up, a background run that
// reports back, a cancelled background run, and Clear. Screenshots go to
// test/browser/screenshots/.
func TestPlayground(t *testing.T) {
	browsertest.Require(t)
	// The search's three phases 250 ms apart: more than the 200 ms in which
	// agenttool coalesces progress, so each one reaches the page.
	fast := serve(t, 5*time.Millisecond, 750*time.Millisecond)
	// Slow enough that a background run is still searching when the test
	// presses Cancel.
	slow := serve(t, 250*time.Millisecond, 10*time.Second)
	shots := filepath.Join(browsertest.Dir(), "screenshots")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}

	out, err := runNode(t, 4*time.Minute, "playground.mjs", fast, slow, shots)
	for line := range strings.Lines(out) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "SCREENSHOT "); ok {
			t.Logf("screenshot: %s", p)
		}
	}
	if err != nil || !strings.Contains(out, "PASS playground") {
		t.Fatalf("playground.mjs: %v\n%s", err, out)
	}
	t.Logf("playground.mjs:\n%s", out)
}

// TestPlaygroundToken runs token.mjs against a demo server that requires
// a token (`agentry serve --auth-token`): the page takes it from the URL
// fragment (and drops it from the address bar), chats, keeps it over a
// reload; a tab without it is refused and asks for it, refuses a wrong
// one, and works with the right one.
func TestPlaygroundToken(t *testing.T) {
	browsertest.Require(t)
	const token = "browser-s3cret"
	base := serveDemo(t, demo.Options{Models: agentsastools.Offline(5*time.Millisecond, nil), AuthToken: token})
	out, err := runNode(t, 2*time.Minute, "token.mjs", base, token, t.TempDir())
	if err != nil || !strings.Contains(out, "PASS token") {
		t.Fatalf("token.mjs: %v\n%s", err, out)
	}
	t.Logf("token.mjs:\n%s", out)
}

// TestDocsScreenshot retakes docs/playground.png, the README's picture of
// the playground mid-run. It runs only with AGENTRY_DOCS_SCREENSHOT=1.
func TestDocsScreenshot(t *testing.T) {
	if os.Getenv("AGENTRY_DOCS_SCREENSHOT") == "" {
		t.Skip("set AGENTRY_DOCS_SCREENSHOT=1 to retake docs/playground.png")
	}
	browsertest.Require(t)
	// A quick assistant and slow helpers: the panels are caught mid-stream.
	fast, slow := agentsastools.Offline(40*time.Millisecond, nil), agentsastools.Offline(250*time.Millisecond, nil)
	base := serveModels(t, &agentsastools.Models{Assistant: fast.Assistant, Researcher: slow.Researcher, Planner: slow.Planner}, 3*time.Second)
	png := filepath.Join(browsertest.Dir(), "..", "..", "docs", "playground.png")
	out, err := runNode(t, 4*time.Minute, "docs.mjs", base, png)
	if err != nil {
		t.Fatalf("docs.mjs: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
