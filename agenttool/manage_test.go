package agenttool_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/store"
)

// Group K (EX, OB): registry, drill-in gating, clear, observability.

// dialFails requires that a WebSocket to path is refused with 404.
func dialFails(t *testing.T, env *testenv.Env, path string) {
	t.Helper()
	_, resp, err := testenv.TryDialWS[testenv.WireFrame](t, waitLimit, env.URL("/agents/"+path), nil)
	if err == nil {
		t.Fatalf("dial %s succeeded", path)
	}
	if resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("dial %s: %v (response %v), want 404", path, err, resp)
	}
}

// TestRegistryAndDrillInGate covers scenarios 152 and 153 and deliberate
// difference 8: the registry row; a drill-in URL answers 404 for a guessed
// run id and creates nothing, works (HTTP and WebSocket) while the registry
// holds the run, and answers 404 again after ClearAgentToolRuns.
func TestRegistryAndDrillInGate(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "pk")
	childPath := func(id string) agent.Path { return agent.BaseOf(a).Path().Child("Researcher", id) }

	// Before any run: an agent-tool run id is never guessable.
	if code := httpStatus(t, env, "assistant/pk/sub/researcher/"+routeName("agent-tool:call_guess")+"/get-messages"); code != http.StatusNotFound {
		t.Fatalf("guessed agent-tool id: %d", code)
	}
	if _, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{
		Input: researchInput{Query: "gates"}, RunID: "visible-run", ParentToolCallID: "call_k", InputPreview: "gates"}); err != nil {
		t.Fatal(err)
	}
	row := getRun(t, a, "visible-run")
	if row.ParentToolCallID != "call_k" || row.AgentType != "Researcher" || string(row.InputPreview) != `"gates"` ||
		row.Summary != "Findings for gates" || row.DisplayOrder != 0 || row.CompletedAt == nil {
		t.Fatalf("row = %+v", row)
	}
	if has, _ := agenttool.HasAgentToolRun(ctx, a, "Researcher", "visible-run"); !has {
		t.Fatal("HasAgentToolRun = false")
	}
	if has, _ := agenttool.HasAgentToolRun(ctx, a, "Summarizer", "visible-run"); has {
		t.Fatal("HasAgentToolRun true for another class")
	}

	// A guessed id: 404, over HTTP and WebSocket, and nothing created.
	for _, id := range []string{"missing", "agent-tool:call_x"} {
		if code := httpStatus(t, env, "assistant/pk/sub/researcher/"+routeName(id)+"/get-messages"); code != http.StatusNotFound {
			t.Fatalf("guessed %s: %d", id, code)
		}
		dialFails(t, env, "assistant/pk/sub/researcher/"+routeName(id))
		if ok, _ := env.RT.Exists(ctx, childPath(id)); ok {
			t.Fatalf("guessed %s was created", id)
		}
	}
	// The run's child: reachable.
	msgs := getMessages(t, env, "assistant/pk/sub/researcher/visible-run")
	if len(msgs) != 2 || msgs[1].Parts[len(msgs[1].Parts)-1].Text != "Findings for gates" {
		t.Fatalf("drill-in transcript %+v", msgs)
	}
	c := dial(t, env, "assistant/pk/sub/researcher/visible-run")
	c.waitRaw(ctx, "transcript", func(s string) bool { return strings.Contains(s, "Findings for gates") })
	c.close()

	n, err := agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{})
	if err != nil || n != 1 {
		t.Fatalf("clear = %d, %v", n, err)
	}
	if code := httpStatus(t, env, "assistant/pk/sub/researcher/visible-run/get-messages"); code != http.StatusNotFound {
		t.Fatalf("after clear: %d", code)
	}
	if ok, _ := env.RT.Exists(ctx, childPath("visible-run")); ok {
		t.Fatal("the child survived the clear (or the gate re-created it)")
	}
	if has, _ := agenttool.HasAgentToolRun(ctx, a, "Researcher", "visible-run"); has {
		t.Fatal("HasAgentToolRun after clear")
	}
}

// TestOpenDrillIn: with Options.OpenDrillIn the parent's own gate
// decides; ordinary sub-agents are reachable.
func TestOpenDrillIn(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{OpenDrillIn: true})
	ctx := testCtx(t)
	a := getAssistant(t, env, "po")
	if _, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: "x", RunID: "r"}); err != nil {
		t.Fatal(err)
	}
	if code := httpStatus(t, env, "assistant/po/sub/researcher/other/get-messages"); code != http.StatusOK {
		t.Fatalf("open drill-in: %d", code)
	}
}

func routeName(id string) string { return routePath("x", id)[2:] }

// TestClearFilters covers scenario 154 and §7.1: Status and OlderThan
// filters (both must match), deletion of the child instances, and no hook
// for runs that had already finished.
func TestClearFilters(t *testing.T) {
	k := newKit()
	k.researcher = failingResearcher()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "pc")
	old := env.RT.Clock().Now().Add(-8 * 24 * time.Hour)
	seed(t, env, a, seedRow{RunID: "old-done", AgentType: "Researcher", Status: "completed", Summary: "s", StartedAt: old, Marks: "[0]"})
	seed(t, env, a, seedRow{RunID: "old-err", AgentType: "Researcher", Status: "error", Error: "e", StartedAt: old.Add(time.Millisecond), Marks: "[0]"})
	for _, q := range []string{"ok", "please fail"} {
		id := q
		if q == "please fail" {
			id = "bad"
		}
		if _, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: q}, RunID: id}); err != nil {
			t.Fatal(err)
		}
	}
	hooks := len(k.rec.finishesOf("ok")) + len(k.rec.finishesOf("bad"))
	ids := func() []string {
		runs, _ := agenttool.ListAgentToolRuns(ctx, a)
		var out []string
		for _, r := range runs {
			out = append(out, r.RunID)
		}
		return out
	}
	exists := func(id string) bool {
		ok, _ := env.RT.Exists(ctx, agent.BaseOf(a).Path().Child("Researcher", id))
		return ok
	}
	if !exists("bad") || !exists("ok") {
		t.Fatal("children missing before the clear")
	}
	weekAgo := env.RT.Clock().Now().Add(-7 * 24 * time.Hour)

	// Both filters must match: nothing is completed and old but old-done.
	n, err := agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{Status: []agenttool.Status{agenttool.StatusError}, OlderThan: weekAgo})
	if err != nil || n != 1 {
		t.Fatalf("clear error+old = %d, %v", n, err)
	}
	jsonEq(t, ids(), []string{"old-done", "ok", "bad"})
	n, _ = agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{Status: []agenttool.Status{agenttool.StatusError, agenttool.StatusAborted}})
	if n != 1 || exists("bad") || !exists("ok") {
		t.Fatalf("clear error = %d; bad exists %v, ok exists %v", n, exists("bad"), exists("ok"))
	}
	jsonEq(t, ids(), []string{"old-done", "ok"})
	n, _ = agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{OlderThan: weekAgo})
	if n != 1 {
		t.Fatalf("clear old = %d", n)
	}
	jsonEq(t, ids(), []string{"ok"})
	n, _ = agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{})
	if n != 1 || exists("ok") || len(ids()) != 0 {
		t.Fatalf("clear all = %d", n)
	}
	if got := len(k.rec.finishesOf("ok")) + len(k.rec.finishesOf("bad")); got != hooks {
		t.Fatalf("clearing finished runs fired %d hooks", got-hooks)
	}
	// A fresh connection replays nothing.
	fresh := dial(t, env, "assistant/pc")
	fresh.sync(ctx)
	if fs := fresh.waitFrames(ctx, "", func([]agenttool.Frame) bool { return true }); len(fs) != 0 {
		t.Fatalf("replay after clear:\n%s", dumpFrames(fs))
	}
}

// TestClearCancelsInFlight covers §7.1 step 3 and deliberate difference
// 5: clearing a run in flight cancels it first (aborted is written, the
// clients get the aborted frame, the finish hook fires once), then deletes
// the child instance with its storage, and the row.
func TestClearCancelsInFlight(t *testing.T) {
	k, fake := heldKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "pcl")
	ws := dial(t, env, "assistant/pcl")
	out := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: "x", RunID: "live"})
	waitHeld(t, ctx, fake, 1)
	waitForwarding(t, ctx, ws, "live")
	child := childOf[*researcher](t, env, a, "Researcher", "live")
	childID := child.InstanceID()

	n, err := agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{})
	if err != nil || n != 1 {
		t.Fatalf("clear = %d, %v", n, err)
	}
	res := recv(t, ctx, out)
	if res.Status != agenttool.StatusAborted || res.Error != "clearing agent tool run" {
		t.Fatalf("result = %+v", res)
	}
	if fin := k.rec.finishesOf("live"); len(fin) != 1 || fin[0].Result.Status != agenttool.StatusAborted {
		t.Fatalf("finish hooks = %+v", fin)
	}
	fs := framesOf(ws.waitFrames(ctx, "aborted", terminated("live")), "live")
	checkSequences(t, fs)
	if last := fs[len(fs)-1].Event; last.Kind != "aborted" || last.Reason != "clearing agent tool run" {
		t.Fatalf("terminal %+v", last)
	}
	if ok, _ := env.RT.Exists(ctx, agent.BaseOf(a).Path().Child("Researcher", "live")); ok {
		t.Fatal("child instance survived")
	}
	if _, ok, _ := agenttool.GetAgentToolRun(ctx, a, "live"); ok {
		t.Fatal("row survived")
	}
	for _, table := range []string{"agent_tool_child_runs", "chat_streams", "chat_chunks", "chat_messages"} {
		var c int
		err := env.RT.DB().View(ctx, func(tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+table+` WHERE instance_id = ?`, childID).Scan(&c)
		})
		if err != nil {
			t.Logf("%s: %v", table, err)
			continue
		}
		if c != 0 {
			t.Fatalf("%d rows of the child left in %s", c, table)
		}
	}
}

// TestObservability covers §8 in Go terms: the agentTool channel gets a
// start and a finish event for every run.
func TestObservability(t *testing.T) {
	k := newKit()
	k.researcher = failingResearcher()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "pob")
	events := make(chan diag.Event, 16)
	unsub := env.RT.Diag().Subscribe(diag.ChannelAgentTool, func(e diag.Event) { events <- e })
	defer unsub()
	if _, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "ok"}, RunID: "o1", ParentToolCallID: "call_o"}); err != nil {
		t.Fatal(err)
	}
	if _, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "fail"}, RunID: "o2"}); err != nil {
		t.Fatal(err)
	}
	want := []struct{ typ, run, status string }{{"start", "o1", ""}, {"finish", "o1", "completed"}, {"start", "o2", ""}, {"finish", "o2", "error"}}
	for _, w := range want {
		var e diag.Event
		select {
		case e = <-events:
		case <-ctx.Done():
			t.Fatalf("no %s event", w.typ)
		}
		if e.Channel != diag.ChannelAgentTool || e.Type != w.typ || e.Attrs["runId"] != w.run || e.Agent != agent.BaseOf(a).Path().String() {
			t.Fatalf("event %+v, want %+v", e, w)
		}
		if w.status != "" && e.Attrs["status"] != w.status {
			t.Fatalf("event %+v, want status %s", e, w.status)
		}
		if w.typ == "start" && e.Attrs["agentType"] != "Researcher" {
			t.Fatalf("event %+v", e)
		}
	}
}
