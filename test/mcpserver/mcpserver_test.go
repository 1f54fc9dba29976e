// Package mcpserver drives the /mcp endpoint of the real agentry server
// (cmd/agentry, built once per run) with the official TypeScript MCP SDK
// client (test/mcp/server-e2e.mjs): tools, progress, cancellation, and a
// task that outlives a SIGKILL of the server.
package mcpserver

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

var agentry = &testenv.Binary{Pkg: "github.com/agentry/agentry/cmd/agentry", Race: testenv.Race}

func TestMain(m *testing.M) { testenv.Main(m, agentry) }

// script runs test/mcp/server-e2e.mjs (testenv.MCPScript).
func script(t *testing.T, out any, args ...string) (finish func()) {
	t.Helper()
	return testenv.MCPScript(t, out, "server-e2e.mjs", args...)
}

func serve(t *testing.T, dir string) *testenv.Process {
	t.Helper()
	return testenv.StartProcess(t, 30*time.Second, agentry.Path(t), "serve", "--addr", "127.0.0.1:0", "--data", dir, "--delay", "100ms")
}

type callResult struct {
	IsError    bool   `json:"isError"`
	Text       string `json:"text"`
	Structured struct {
		RunID  string `json:"runId"`
		Status string `json:"status"`
	} `json:"structured"`
}

func TestTypeScriptClient(t *testing.T) {
	testenv.RequireMCP(t)
	srv := serve(t, t.TempDir())
	base := "http://" + srv.Host

	// A Go client on the same instance sees the runs' events as the
	// playground does: the MCP calls are runs of the default Assistant.
	var mu sync.Mutex
	ends := map[string]string{} // run id → terminal event kind
	ended := make(chan struct{}, 16)
	conn, err := client.Dial(context.Background(), client.Options{Host: srv.Host, Agent: "Assistant", Name: "default",
		OnFrame: func(f client.Frame) {
			if f.Type != wire.AgentToolEvent {
				return
			}
			var fr agenttool.Frame
			if json.Unmarshal(f.Data, &fr) != nil {
				return
			}
			switch fr.Event.Kind {
			case "finished", "aborted", "error", "interrupted":
				mu.Lock()
				ends[fr.Event.RunID] = fr.Event.Kind
				mu.Unlock()
				ended <- struct{}{}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	var live struct {
		Tools                []string   `json:"tools"`
		ResearchTaskSupport  string     `json:"researchTaskSupport"`
		ProgressBeforeResult int        `json:"progressBeforeResult"`
		ProgressIncreasing   bool       `json:"progressIncreasing"`
		Milestone            bool       `json:"milestone"`
		Result               callResult `json:"result"`
		Cancelled            bool       `json:"cancelled"`
	}
	finish := script(t, &live, base+"/mcp", "live")
	if !slices.Contains(live.Tools, "research") || !slices.Contains(live.Tools, "plan") || live.ResearchTaskSupport != "optional" {
		t.Fatalf("tools %v (research taskSupport %q)", live.Tools, live.ResearchTaskSupport)
	}
	if live.ProgressBeforeResult < 3 || !live.ProgressIncreasing || !live.Milestone {
		t.Fatalf("progress: %d notifications before the result (want ≥ 3), increasing %v, milestone %v",
			live.ProgressBeforeResult, live.ProgressIncreasing, live.Milestone)
	}
	if live.Result.IsError || live.Result.Structured.Status != "completed" || live.Result.Text == "" {
		t.Fatalf("research result %+v", live.Result)
	}
	if !live.Cancelled {
		t.Fatal("the cancelled call returned a result")
	}
	// Both runs end: the first finished, the cancelled one aborted.
	for {
		mu.Lock()
		n := len(ends)
		mu.Unlock()
		if n >= 2 {
			break
		}
		select {
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Fatalf("runs ended: %v; want two", ends)
		}
	}
	var aborted string
	for id, kind := range ends {
		if id == live.Result.Structured.RunID {
			if kind != "finished" {
				t.Fatalf("run %s ended %s", id, kind)
			}
			continue
		}
		if kind != "aborted" {
			t.Fatalf("cancelled run %s ended %s, want aborted", id, kind)
		}
		aborted = id
	}
	finish()
	// What `agentry runs list` shows (the Assistant's listHelperRuns): both
	// runs, unbound (the playground lists them among its background runs).
	raw, err := conn.Call(context.Background(), "listHelperRuns")
	if err != nil {
		t.Fatal(err)
	}
	var runs []agenttool.Run
	if err := json.Unmarshal(raw, &runs); err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].ParentToolCallID != "" || runs[1].ParentToolCallID != "" {
		t.Fatalf("listHelperRuns: %+v; want the two MCP runs, unbound", runs)
	}
	raw, err = conn.Call(context.Background(), "inspectHelperRun", aborted)
	if err != nil {
		t.Fatal(err)
	}
	var detail struct {
		Run        agenttool.Run         `json:"run"`
		Inspection *agenttool.Inspection `json:"inspection"`
	}
	if err := json.Unmarshal(raw, &detail); err != nil {
		t.Fatal(err)
	}
	if detail.Run.Status != agenttool.StatusAborted || detail.Inspection == nil || detail.Inspection.Status != agenttool.StatusAborted {
		t.Fatalf("cancelled run: registry %s, child %+v; want both aborted", detail.Run.Status, detail.Inspection)
	}
}

func TestTypeScriptTaskSurvivesSIGKILL(t *testing.T) {
	testenv.RequireMCP(t)
	dir := t.TempDir()
	srv := serve(t, dir)
	var started struct {
		TaskID string `json:"taskId"`
		Status string `json:"status"`
	}
	script(t, &started, "http://"+srv.Host+"/mcp", "start-task")()
	if started.TaskID == "" || started.Status != "working" {
		t.Fatalf("task %+v", started)
	}
	// The run is in flight (its child searches for 4 s): kill the server.
	_ = srv.Kill() // its error is the kill's
	srv = serve(t, dir)
	var got struct {
		StatusBefore string     `json:"statusBefore"`
		Result       callResult `json:"result"`
		StatusAfter  string     `json:"statusAfter"`
		Listed       bool       `json:"listed"`
	}
	script(t, &got, "http://"+srv.Host+"/mcp", "result", started.TaskID)()
	if got.Result.IsError || got.Result.Structured.Status != "completed" || got.StatusAfter != "completed" || !got.Listed {
		t.Fatalf("after SIGKILL and restart: %+v", got)
	}
}
