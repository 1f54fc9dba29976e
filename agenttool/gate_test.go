package agenttool_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/wire"
)

// lister is a parent whose callables dispatch an awaited run and list its
// runs, each written without a lock of its own.
type lister struct {
	chat.Base
}

// Research runs a Researcher and waits for it.
func (l *lister) Research(ctx context.Context, runID string) (string, error) {
	res, err := agenttool.RunAgentTool(ctx, l, "Researcher", agenttool.RunOptions{RunID: runID, Input: "topic"})
	if err != nil {
		return "", err
	}
	return string(res.Status) + ": " + res.Summary, nil
}

// ListRuns lists the runs with their statuses.
func (l *lister) ListRuns(ctx context.Context) ([]string, error) {
	runs, err := agenttool.ListAgentToolRuns(ctx, l)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range runs {
		out = append(out, r.RunID+"="+string(r.Status))
	}
	return out, nil
}

// TestParentAnswersWhileAwaiting: over one WebSocket, a parent's RPC that
// awaits a child run (held on its model) does not hold the parent: an RPC
// sent after it on the same socket is answered while the run is in flight
// (the await is an await point), then the first one completes.
func TestParentAnswersWhileAwaiting(t *testing.T) {
	fake := clockwork.NewFakeClock()
	k := newKit()
	k.researcher = heldModel(fake, scripted.Always(scripted.Reply{scripted.Text("Findings about the topic")}))
	env := startEnv(t, testenv.Options{
		Postgres: &pg,
		Classes: []agent.Class{
			{Name: "Lister", New: func() agent.Agent { return &lister{} }, Callable: []string{"research", "listRuns"}, Public: true},
			{Name: "Researcher", New: func() agent.Agent { return &researcher{k: k} }},
		},
	}, chat.Config{}, agenttool.Options{}, nil)
	ctx := testCtx(t)
	w := dial(t, env, "lister/l1")
	w.send(map[string]any{"type": wire.RPC, "id": "research", "method": "research", "args": []any{"r1"}})
	waitHeld(t, ctx, fake, 1) // the child streams and waits on its model
	w.send(map[string]any{"type": wire.RPC, "id": "list", "method": "listRuns", "args": []any{}})
	type rpc struct {
		ID     string          `json:"id"`
		Result json.RawMessage `json:"result"`
		Done   bool            `json:"done"`
	}
	answer := func(id string) (rpc, bool) {
		for _, s := range w.rawFrames() {
			var r rpc
			if json.Unmarshal([]byte(s), &r) == nil && r.ID == id && r.Done {
				return r, true
			}
		}
		return rpc{}, false
	}
	w.waitRaw(ctx, "the list answer", func(s string) bool { return strings.Contains(s, `"id":"list"`) })
	list, _ := answer("list")
	if string(list.Result) != `["r1=running"]` {
		t.Fatalf("listRuns during the run = %s, want [\"r1=running\"]", list.Result)
	}
	if _, done := answer("research"); done {
		t.Fatal("the research call ended before its child")
	}
	stop := pump(fake)
	defer stop()
	w.waitRaw(ctx, "the research answer", func(s string) bool {
		return strings.Contains(s, `"id":"research"`) && strings.Contains(s, `"done":true`)
	})
	if r, _ := answer("research"); !strings.HasPrefix(string(r.Result), `"completed: Findings`) {
		t.Fatalf("research = %s", r.Result)
	}
}

// rawFrames returns every frame the client has received, as text.
func (w *wsClient) rawFrames() []string {
	var out []string
	for _, f := range w.ws.Frames() {
		out = append(out, string(f.Raw))
	}
	return out
}
