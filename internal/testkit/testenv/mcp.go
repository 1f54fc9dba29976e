package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// MCPDir returns the npm folder of the MCP tests (test/mcp): the official
// TypeScript SDK, the reference servers and the conformance suite.
func MCPDir() string {
	return filepath.Join(moduleRoot(), "test", "mcp")
}

// RequireMCP skips the test when Node or the MCP npm packages are
// missing, except in CI (CI=true), where that is a failure.
func RequireMCP(t testing.TB) {
	t.Helper()
	requireNodeModule(t, MCPDir(), "test/mcp", "@modelcontextprotocol", "sdk")
}

// MCPScript runs a script of test/mcp with args, decodes the first line
// it prints into out, and returns a function that closes the script's
// stdin and waits for it to exit (a script may wait for its stdin to
// close before it ends its session); the test's cleanup calls it too. A
// script that fails fails the test with its stderr.
func MCPScript(t testing.TB, out any, script string, args ...string) (finish func()) {
	t.Helper()
	RequireMCP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Dir = MCPDir()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	finish = sync.OnceFunc(func() {
		stdin.Close()
		err := cmd.Wait()
		cancel()
		if err != nil {
			t.Errorf("node %s %v: %v\n%s", script, args, err, stderr.String())
		}
	})
	t.Cleanup(finish)
	line, readErr := bufio.NewReader(stdout).ReadBytes('\n')
	if err := json.Unmarshal(line, out); err != nil {
		finish()
		t.Fatalf("node %s %v printed %q (read: %v): %v\n%s", script, args, line, readErr, err, stderr.String())
	}
	return finish
}
