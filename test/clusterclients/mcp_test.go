package clusterclients

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/internal/testkit/testenv"
)

// TestMCPThroughAnyNode: the official TypeScript MCP client talks to a node
// that does not own its instance: the router sends the session to the
// owner, so tools, progress and cancellation work as on one node; a task
// started there survives the owner's SIGKILL and its result is fetched
// through a third node.
func TestMCPThroughAnyNode(t *testing.T) {
	testenv.RequireMCP(t)
	c := startCluster(t, 100*time.Millisecond, "a", "b", "c")
	name := c.assistantName("a", "mcp-")
	endpoint := func(node string) string {
		return "http://" + c.nodes[node].Host + "/mcp/" + url.PathEscape(name)
	}

	var live struct {
		Tools                []string `json:"tools"`
		ProgressBeforeResult int      `json:"progressBeforeResult"`
		Result               struct {
			IsError    bool `json:"isError"`
			Structured struct {
				Status string `json:"status"`
			} `json:"structured"`
		} `json:"result"`
		Cancelled bool `json:"cancelled"`
	}
	testenv.MCPScript(t, &live, "server-e2e.mjs", endpoint("b"), "live")()
	if live.ProgressBeforeResult < 3 || live.Result.IsError || live.Result.Structured.Status != "completed" || !live.Cancelled {
		t.Fatalf("through node b: %+v", live)
	}

	var started struct {
		TaskID string `json:"taskId"`
	}
	testenv.MCPScript(t, &started, "server-e2e.mjs", endpoint("b"), "start-task")()
	if started.TaskID == "" {
		t.Fatal("no task")
	}
	_ = c.nodes["a"].Kill() // the owner of the instance, mid-run; its exit status is "killed"
	var got struct {
		Result struct {
			IsError    bool   `json:"isError"`
			Text       string `json:"text"`
			Structured struct {
				Status string `json:"status"`
			} `json:"structured"`
		} `json:"result"`
		StatusAfter string `json:"statusAfter"`
	}
	// Through c, while the shard moves (the router answers 503 with
	// Retry-After until a node owns it; the script asks again).
	testenv.MCPScript(t, &got, "server-e2e.mjs", endpoint("c"), "result", started.TaskID)()
	if got.Result.IsError || got.Result.Structured.Status != "completed" || got.StatusAfter != "completed" || strings.TrimSpace(got.Result.Text) == "" {
		t.Fatalf("after the owner's kill, through node c: %+v", got)
	}
}
