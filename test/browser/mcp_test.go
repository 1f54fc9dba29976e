package browser

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/internal/testkit/browsertest"
)

// TestPlaygroundShowsMCPRuns: a research run started by an MCP client
// (the Go SDK, on /mcp/{name}) appears in the playground of that instance
// as a background run, replayed when the page connects and then live, its
// progress moving, until it completes.
func TestPlaygroundShowsMCPRuns(t *testing.T) {
	browsertest.Require(t)
	base := serveDemo(t, demo.Options{Models: agentsastools.Offline(5*time.Millisecond, nil), SearchTime: 6 * time.Second})
	const name = "mcp-playground"
	c := mcp.NewClient(&mcp.Implementation{Name: "browser-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp/" + name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	done := make(chan error, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "research", Arguments: map[string]any{"query": "tide pools"}})
		if err == nil && res.IsError {
			err = os.ErrInvalid
		}
		done <- err
	}()
	shots := filepath.Join(browsertest.Dir(), "screenshots")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := runNode(t, 2*time.Minute, "mcp.mjs", base, name, shots)
	if err != nil || !strings.Contains(out, "PASS mcp") {
		t.Fatalf("mcp.mjs: %v\n%s", err, out)
	}
	if err := <-done; err != nil {
		t.Fatalf("the MCP call: %v", err)
	}
}
