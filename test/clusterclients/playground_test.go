package clusterclients

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

const chromiumPath = "/usr/bin/chromium"

// browserDir is test/browser, where the browser scripts and their npm
// packages are.
func browserDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "browser")
}

// requireBrowser skips the test when Node, Chromium or playwright-core is
// missing, except in CI (CI=true), where that is a failure.
func requireBrowser(t *testing.T) {
	t.Helper()
	var missing []string
	if _, err := exec.LookPath("node"); err != nil {
		missing = append(missing, "node")
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		missing = append(missing, chromiumPath+" (apt-get install chromium)")
	}
	if _, err := os.Stat(filepath.Join(browserDir(), "node_modules", "playwright-core")); err != nil {
		missing = append(missing, "test/browser/node_modules (make npm)")
	}
	if len(missing) == 0 {
		return
	}
	msg := "browser test needs " + strings.Join(missing, ", ")
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// TestPlaygroundThroughAnyNode runs test/browser/cluster.mjs: the
// playground is loaded from node b, which does not own the chat (a does);
// research answers stream while c (no part in the chat) is killed, then
// while a is killed: the page reconnects through b to the new owner, each
// answer completes and is shown once, and the chat goes on.
func TestPlaygroundThroughAnyNode(t *testing.T) {
	requireBrowser(t)
	// At 100 ms a chunk a research answer takes about 8 s: the kills fall
	// inside it.
	c := startCluster(t, 100*time.Millisecond, "a", "b", "c", "d")
	name := c.assistantName("a", "page")
	shots := filepath.Join(browserDir(), "screenshots")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "cluster.mjs", "http://"+c.nodes["b"].Host, name, shots)
	cmd.Dir = browserDir()
	cmd.Env = append(os.Environ(), "CHROMIUM="+chromiumPath, "CHROMIUM_USER_DATA_DIR="+t.TempDir())
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var mu sync.Mutex
	steps := make(chan string)
	go func() {
		defer close(steps)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			out.WriteString(line + "\n")
			mu.Unlock()
			if s, ok := strings.CutPrefix(line, "WAIT "); ok {
				steps <- s
			}
		}
	}()
	for s := range steps {
		switch s {
		case "kill-other":
			c.kill("c", name)
		case "kill-owner":
			c.kill("a", name)
		default:
			t.Errorf("unknown step %q", s)
		}
		if _, err := io.WriteString(stdin, "GO "+s+"\n"); err != nil {
			t.Errorf("step %s: %v", s, err)
		}
	}
	err = cmd.Wait()
	mu.Lock()
	text := out.String()
	mu.Unlock()
	if err != nil || !strings.Contains(text, "PASS cluster") {
		t.Fatalf("cluster.mjs: %v\n%s", err, text)
	}
	t.Logf("cluster.mjs:\n%s", text)
}
