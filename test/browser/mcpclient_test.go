package browser

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/chat"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/internal/testkit/browsertest"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/mcpclient"
)

// TestPlaygroundMCP runs mcpclient.mjs against the demo with
// @modelcontextprotocol/server-everything attached over stdio: the
// playground shows an MCP tool's call as a tool card, its image as a file
// part, and approves a call that needs it.
func TestPlaygroundMCP(t *testing.T) {
	browsertest.Require(t)
	testenv.RequireMCP(t)
	everything := filepath.Join(testenv.MCPDir(), "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")
	base := serveDemo(t, demo.Options{Models: agentsastools.Offline(time.Millisecond, nil), MCPServers: []mcpclient.Server{{
		Name: "ev", Command: "node", Args: []string{everything, "stdio"},
		ToolApproval: map[string]chat.ApprovalFunc{"get-sum": chat.RequireApproval},
	}}})
	shots := filepath.Join(browsertest.Dir(), "screenshots")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := runNode(t, 3*time.Minute, "mcpclient.mjs", base, shots)
	if err != nil || !strings.Contains(out, "PASS mcp") {
		t.Fatalf("mcpclient.mjs: %v\n%s", err, out)
	}
	t.Logf("mcpclient.mjs:\n%s", out)
}
