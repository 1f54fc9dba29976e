// Package browsertest is what the tests that drive the web playground in a
// real browser share: the folder of the browser scripts (test/browser,
// with their npm packages), the Chromium they drive through
// playwright-core, the check that all of it is installed, and the
// environment a script runs in.
package browsertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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

// Chromium is the browser the scripts drive (Debian's chromium package).
const Chromium = "/usr/bin/chromium"

// Dir returns test/browser, where the browser scripts and their npm
// packages are.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "test", "browser")
}

// Require skips the test when Node, Chromium or playwright-core is
// missing, except in CI (CI=true), where that is a failure.
func Require(t testing.TB) {
	t.Helper()
	var missing []string
	if _, err := exec.LookPath("node"); err != nil {
		missing = append(missing, "node")
	}
	if _, err := os.Stat(Chromium); err != nil {
		missing = append(missing, Chromium+" (apt-get install chromium)")
	}
	if _, err := os.Stat(filepath.Join(Dir(), "node_modules", "playwright-core")); err != nil {
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

// Env is the environment of a browser script: this process's, with the
// Chromium to drive and a profile folder of the test's own.
func Env(t testing.TB) []string {
	return append(os.Environ(), "CHROMIUM="+Chromium, "CHROMIUM_USER_DATA_DIR="+t.TempDir())
}

// RunSteps runs the browser script of Dir with args, within limit, in the
// environment of Env. A script that needs the test to act prints
// "WAIT STEP": act is called with STEP, then "GO STEP" is written to the
// script's stdin. RunSteps returns what the script printed (its stdout and
// stderr together) and its exit error.
func RunSteps(t testing.TB, limit time.Duration, act func(step string), script string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Dir = Dir()
	cmd.Env = Env(t)
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", fmt.Errorf("browsertest: stdin of %s: %w", script, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", fmt.Errorf("browsertest: stdout of %s: %w", script, err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("browsertest: start %s: %w", script, err)
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
	var stepErr error
	for s := range steps {
		act(s)
		if _, err := io.WriteString(stdin, "GO "+s+"\n"); err != nil && stepErr == nil {
			stepErr = fmt.Errorf("browsertest: step %s: %w", s, err)
		}
	}
	err = cmd.Wait()
	mu.Lock()
	defer mu.Unlock()
	return out.String(), errors.Join(err, stepErr)
}
