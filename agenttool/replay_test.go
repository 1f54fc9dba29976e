package agenttool_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/store"
)

// Groups C (server side of UH/WR) and D (RP): live and replay frames.

type frameKey struct {
	Seq  int64
	Kind string
	Body string
}

func keys(fs []agenttool.Frame) []frameKey {
	out := make([]frameKey, len(fs))
	for i, f := range fs {
		out[i] = frameKey{f.Sequence, f.Event.Kind, f.Event.Body}
	}
	return out
}

// TestReplayMatchesLive covers scenarios 41 and 42 (server side) and
// deliberate difference 1: a connection made after the run gets started
// (0, replay), every chunk with the sequence it had live, and the terminal
// frame, all marked replay; a client that deduplicates by (run, sequence)
// rebuilds exactly the live timeline.
func TestReplayMatchesLive(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p41")
	live := dial(t, env, "assistant/p41")
	if _, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "replay"}, RunID: "r", ParentToolCallID: "call_1"}); err != nil {
		t.Fatal(err)
	}
	lfs := framesOf(live.waitFrames(ctx, "live terminal", terminated("r")), "r")
	fresh := dial(t, env, "assistant/p41")
	rfs := framesOf(fresh.waitFrames(ctx, "replay terminal", terminated("r")), "r")
	checkSequences(t, rfs)
	jsonEq(t, keys(rfs), keys(replayOf(lfs)))
	for _, f := range rfs {
		if !f.Replay || f.ParentToolCallID != "call_1" {
			t.Fatalf("replay frame %+v", f)
		}
	}
	for _, f := range lfs {
		if f.Replay {
			t.Fatalf("live frame marked replay: %+v", f)
		}
	}
	if last := rfs[len(rfs)-1].Event; last.Kind != "finished" || *last.Summary != "Findings for replay" {
		t.Fatalf("replayed terminal %+v", last)
	}
	if textOf(rfs) != "Findings for replay" {
		t.Fatalf("replayed text %q", textOf(rfs))
	}
}

// TestConnectDuringRun: connections made while a run streams get the
// replay of what happened so far, then the live frames, with strictly
// increasing sequences per run, no gap and no duplicate; together they are
// exactly what a connection made before the run saw.
func TestConnectDuringRun(t *testing.T) {
	k, fake := heldKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p-mid")
	before := dial(t, env, "assistant/p-mid")
	out := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: "x", RunID: "m", ParentToolCallID: "call_m"})

	// Connect at several points of the stream, one tick at a time.
	var during []*wsClient
	for i := 0; i < 4; i++ {
		waitHeld(t, ctx, fake, 1)
		during = append(during, dial(t, env, "assistant/p-mid"))
		// The connection's replay is done once its started frame arrived;
		// move on so that the next connection sees a later point.
		during[i].waitFrames(ctx, "started", func(fs []agenttool.Frame) bool { return len(fs) > 0 })
		fake.Advance(tick)
	}
	stop := pump(fake)
	defer stop()
	if res := recv(t, ctx, out); res.Status != agenttool.StatusCompleted {
		t.Fatalf("result %+v", res)
	}
	want := keys(replayOf(framesOf(before.waitFrames(ctx, "terminal", terminated("m")), "m")))
	for i, c := range during {
		fs := framesOf(c.waitFrames(ctx, "terminal", terminated("m")), "m")
		checkSequences(t, fs)
		jsonEq(t, keys(replayOf(fs)), want)
		if !fs[0].Replay || fs[len(fs)-1].Replay {
			t.Fatalf("connection %d: want replay first and live last:\n%s", i, dumpFrames(fs))
		}
		// replay frames come first, then only live ones
		seenLive := false
		for _, f := range fs {
			if !f.Replay {
				seenLive = true
			} else if seenLive {
				t.Fatalf("connection %d: a replay frame after a live one:\n%s", i, dumpFrames(fs))
			}
		}
	}
}

// TestConnectDuringRunStress connects many clients while runs stream
// freely, to catch a connection that misses or repeats a frame.
func TestConnectDuringRunStress(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p-stress")
	const runs = 3
	outs := make([]chan runOut, runs)
	for i := range outs {
		outs[i] = goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: strings.Repeat("long query ", 20)}, RunID: fmt.Sprint("s", i)})
	}
	var clients []*wsClient
	for i := 0; i < 12; i++ {
		clients = append(clients, dial(t, env, "assistant/p-stress"))
	}
	for _, o := range outs {
		recv(t, ctx, o)
	}
	ref := dial(t, env, "assistant/p-stress")
	for i := 0; i < runs; i++ {
		id := fmt.Sprint("s", i)
		want := keys(framesOf(ref.waitFrames(ctx, "replay", terminated(id)), id))
		for j, c := range clients {
			fs := framesOf(c.waitFrames(ctx, "terminal", terminated(id)), id)
			if len(fs) == 0 {
				continue
			}
			// A client connected before the run started sees it all live.
			checkSequences(t, fs)
			if got := keys(replayOf(fs)); len(got) != len(want) {
				t.Fatalf("client %d run %s: %d frames, want %d:\n%s", j, id, len(got), len(want), dumpFrames(fs))
			}
			jsonEq(t, keys(replayOf(fs)), want)
		}
	}
}

// TestFanOutUnderOneToolCall: two runs in parallel under one tool call,
// with display orders 0 and 1, both live and in the replay.
func TestFanOutUnderOneToolCall(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p-fan")
	live := dial(t, env, "assistant/p-fan")
	o1 := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "HTTP/3"}, ParentToolCallID: "call_cmp", DisplayOrder: 0, RunID: "fan-b"})
	o2 := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "gRPC"}, ParentToolCallID: "call_cmp", DisplayOrder: 1, RunID: "fan-a"})
	r1, r2 := recv(t, ctx, o1), recv(t, ctx, o2)
	if r1.Summary != "Findings for HTTP/3" || r2.Summary != "Findings for gRPC" {
		t.Fatalf("results %+v %+v", r1, r2)
	}
	check := func(fs []agenttool.Frame, replay bool) {
		t.Helper()
		for id, order := range map[string]int{"fan-b": 0, "fan-a": 1} {
			rfs := framesOf(fs, id)
			checkSequences(t, rfs)
			if st := rfs[0]; st.ParentToolCallID != "call_cmp" || *st.Event.Order != order || st.Replay != replay {
				t.Fatalf("started of %s = %+v", id, st)
			}
		}
	}
	check(live.waitFrames(ctx, "live", terminated("fan-a", "fan-b")), false)
	fresh := dial(t, env, "assistant/p-fan")
	fs := fresh.waitFrames(ctx, "replay", terminated("fan-a", "fan-b"))
	check(fs, true)
	// The replay goes run by run in start order, each run complete.
	runs, _ := agenttool.ListAgentToolRuns(ctx, a)
	if len(runs) != 2 {
		t.Fatalf("runs = %+v", runs)
	}
	var order []string
	for _, f := range fs {
		if len(order) == 0 || order[len(order)-1] != f.Event.RunID {
			order = append(order, f.Event.RunID)
		}
	}
	jsonEq(t, order, []string{runs[0].RunID, runs[1].RunID})
	if runs[0].DisplayOrder+runs[1].DisplayOrder != 1 {
		t.Fatalf("display orders %+v", runs)
	}
}

// TestReplayInterruptedCause covers scenarios 43–47: the cause of an
// interrupted run (reason, childStillRunning) is in the stored result and
// in the replayed terminal frame, and absent fields stay absent.
func TestReplayInterruptedCause(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p44")
	now := env.RT.Clock().Now()
	rows := []seedRow{
		{RunID: "i1", Reason: "no-progress", Still: ptr(true)},
		{RunID: "i2", Reason: "window-exceeded", Still: ptr(false)},
		{RunID: "i3", Reason: "recovery-deadline"},
		{RunID: "i4"}, // legacy: no cause
	}
	for i, r := range rows {
		r.AgentType, r.Status, r.Error, r.ToolCall, r.Marks = "Researcher", "interrupted", "parent restarted", "call_i", "[0]"
		r.StartedAt = now.Add(time.Duration(i) * time.Millisecond)
		seed(t, env, a, r)
	}
	want := map[string]string{
		"i1": `{"kind":"interrupted","runId":"i1","error":"parent restarted","reason":"no-progress","childStillRunning":true}`,
		"i2": `{"kind":"interrupted","runId":"i2","error":"parent restarted","reason":"window-exceeded","childStillRunning":false}`,
		"i3": `{"kind":"interrupted","runId":"i3","error":"parent restarted","reason":"recovery-deadline"}`,
		"i4": `{"kind":"interrupted","runId":"i4","error":"parent restarted"}`,
	}
	wantResult := map[string]string{
		"i1": `{"runId":"i1","agentType":"Researcher","status":"interrupted","error":"parent restarted","reason":"no-progress","childStillRunning":true}`,
		"i2": `{"runId":"i2","agentType":"Researcher","status":"interrupted","error":"parent restarted","reason":"window-exceeded","childStillRunning":false}`,
		"i3": `{"runId":"i3","agentType":"Researcher","status":"interrupted","error":"parent restarted","reason":"recovery-deadline"}`,
		"i4": `{"runId":"i4","agentType":"Researcher","status":"interrupted","error":"parent restarted"}`,
	}
	c := dial(t, env, "assistant/p44")
	fs := c.waitFrames(ctx, "replay", terminated("i1", "i2", "i3", "i4"))
	for id, w := range want {
		rfs := framesOf(fs, id)
		checkSequences(t, rfs)
		got, _ := json.Marshal(rfs[len(rfs)-1].Event)
		if string(got) != w {
			t.Errorf("%s terminal = %s\nwant %s", id, got, w)
		}
		res, _ := json.Marshal(getRun(t, a, id).Result())
		if string(res) != wantResult[id] {
			t.Errorf("%s result = %s\nwant %s", id, res, wantResult[id])
		}
	}
}

// TestInterruptedRepairedByRedispatch covers scenarios 48 and 93 and
// deliberate difference 1: a run sealed interrupted while its child went on
// to complete is repaired by dispatching its id again: the row becomes
// completed without the interrupted cause, the clients get the terminal
// under a sequence never used before, and a replay holds exactly one
// terminal frame.
func TestInterruptedRepairedByRedispatch(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p48")
	live := dial(t, env, "assistant/p48")
	first, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "fix"}, RunID: "fix"})
	if err != nil {
		t.Fatal(err)
	}
	before := framesOf(live.waitFrames(ctx, "terminal", terminated("fix")), "fix")
	// A recovery sealed the run interrupted (what a restart leaves).
	if err := env.RT.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET status = 'interrupted', interrupted_reason = 'no-progress', child_still_running = 1,
			summary = NULL, error_message = 'gave up' WHERE run_id = 'fix'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: "ignored", RunID: "fix"})
	if err != nil {
		t.Fatal(err)
	}
	jsonEq(t, res, first)
	row := getRun(t, a, "fix")
	if row.Status != agenttool.StatusCompleted || row.Reason != "" || row.ChildStillRunning != nil || row.Error != "" {
		t.Fatalf("row = %+v", row)
	}
	all := framesOf(live.waitFrames(ctx, "second terminal", func(fs []agenttool.Frame) bool {
		n := 0
		for _, f := range framesOf(fs, "fix") {
			if isTerminal(f.Event.Kind) {
				n++
			}
		}
		return n == 2
	}), "fix")
	used := map[int64]frameKey{}
	for _, f := range before {
		used[f.Sequence] = frameKey{f.Sequence, f.Event.Kind, f.Event.Body}
	}
	// What the re-attach sent: frames a deduplicating client already has
	// are identical; the terminal has a new sequence.
	var newTerm *agenttool.Frame
	for i, f := range all[len(before):] {
		if old, ok := used[f.Sequence]; ok {
			if old != (frameKey{f.Sequence, f.Event.Kind, f.Event.Body}) {
				t.Fatalf("sequence %d reused for a different frame: %+v vs %+v", f.Sequence, old, f)
			}
			continue
		}
		if isTerminal(f.Event.Kind) {
			newTerm = &all[len(before)+i]
		}
	}
	if newTerm == nil || newTerm.Event.Kind != "finished" {
		t.Fatalf("no terminal frame with a new sequence:\n%s", dumpFrames(all))
	}
	fresh := dial(t, env, "assistant/p48")
	rfs := framesOf(fresh.waitFrames(ctx, "replay", terminated("fix")), "fix")
	terms := 0
	for _, f := range rfs {
		if isTerminal(f.Event.Kind) {
			terms++
			raw, _ := json.Marshal(f.Event)
			if f.Event.Kind != "finished" || strings.Contains(string(raw), "reason") || strings.Contains(string(raw), "childStillRunning") {
				t.Fatalf("replayed terminal %s", raw)
			}
		}
	}
	if terms != 1 {
		t.Fatalf("%d terminal frames in the replay:\n%s", terms, dumpFrames(rfs))
	}
	// Replay sequences strictly increase and end with the new terminal.
	for i := 1; i < len(rfs); i++ {
		if rfs[i].Sequence <= rfs[i-1].Sequence {
			t.Fatalf("replay not increasing:\n%s", dumpFrames(rfs))
		}
	}
	if rfs[len(rfs)-1].Sequence != newTerm.Sequence {
		t.Fatalf("replay terminal %d, live %d", rfs[len(rfs)-1].Sequence, newTerm.Sequence)
	}
}

// TestReplayPastTheFirstRuns: a registry longer than the replay's first
// read (it sends a few runs, then reads the rest) replays every run once,
// in start order, each with exactly the frames it had live. The runs are
// dispatched at once, so many share a start time and the rest is found by
// run id among them.
func TestReplayPastTheFirstRuns(t *testing.T) {
	k := newKit()
	env := startKit(t, k, agenttool.Options{MaxRunningAgentTools: 100})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p-many")
	live := dial(t, env, "assistant/p-many")
	const n = 75
	ids := make([]string, n)
	outs := make([]chan runOut, n)
	for i := range outs {
		// Run ids sort in the reverse of their dispatch order.
		ids[i] = fmt.Sprintf("many-%02d", n-i)
		outs[i] = goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: ids[i]}, RunID: ids[i], ParentToolCallID: "call_many", DisplayOrder: i})
	}
	for _, o := range outs {
		if res := recv(t, ctx, o); res.Status != agenttool.StatusCompleted {
			t.Fatalf("result %+v", res)
		}
	}
	lfs := live.waitFrames(ctx, "live", terminated(ids...))
	fs := dial(t, env, "assistant/p-many").waitFrames(ctx, "replay", terminated(ids...))
	runs, err := agenttool.ListAgentToolRuns(ctx, a)
	if err != nil || len(runs) != n {
		t.Fatalf("runs = %d, %v", len(runs), err)
	}
	var order, want []string
	for _, f := range fs {
		if len(order) == 0 || order[len(order)-1] != f.Event.RunID {
			order = append(order, f.Event.RunID)
		}
	}
	for _, r := range runs {
		want = append(want, r.RunID)
	}
	jsonEq(t, order, want)
	for _, id := range ids {
		rfs := framesOf(fs, id)
		checkSequences(t, rfs)
		jsonEq(t, keys(rfs), keys(replayOf(framesOf(lfs, id))))
		if textOf(rfs) != "Findings for "+id {
			t.Fatalf("run %s replayed the text %q", id, textOf(rfs))
		}
	}
}
