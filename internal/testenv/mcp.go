package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// MCPDir returns test/mcp, the npm folder of the MCP tests (the official
// TypeScript SDK, server-everything and the conformance suite).
func MCPDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "test", "mcp")
}

// RequireMCPNode skips the test when Node or test/mcp's npm packages are
// missing, except in CI (CI=true), where that is a failure.
func RequireMCPNode(t testing.TB) {
	t.Helper()
	_, errNode := exec.LookPath("node")
	_, errMods := os.Stat(filepath.Join(MCPDir(), "node_modules", "@modelcontextprotocol", "sdk"))
	if errNode == nil && errMods == nil {
		return
	}
	msg := "node or test/mcp/node_modules missing: run `make npm`"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
