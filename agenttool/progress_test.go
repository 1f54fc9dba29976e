package agenttool_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
)

// ReportProgress and milestones (spec §3.3, §3.7; scenarios 29–33 adapted
// to differences 2 and 4). The child is the commanded worker of
// detached_test.go: every step runs inside its turn, on a fake clock.

// detChunk is a decoded chunk body of a frame.
type detChunk struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	Transient *bool           `json:"transient"`
	Data      json.RawMessage `json:"data"`
}

type detProgressData struct {
	Fraction *float64        `json:"fraction"`
	Message  string          `json:"message"`
	Phase    string          `json:"phase"`
	Data     json.RawMessage `json:"data"`
}

// detChunks returns the chunk frames of run whose body has type typ.
func detChunks(fs []agenttool.Frame, runID, typ string) []agenttool.Frame {
	var out []agenttool.Frame
	for _, f := range fs {
		if f.Event.RunID != runID || f.Event.Kind != "chunk" {
			continue
		}
		var c detChunk
		if json.Unmarshal([]byte(f.Event.Body), &c) == nil && c.Type == typ {
			out = append(out, f)
		}
	}
	return out
}

func detBody(t *testing.T, f agenttool.Frame) detChunk {
	t.Helper()
	var c detChunk
	if err := json.Unmarshal([]byte(f.Event.Body), &c); err != nil {
		t.Fatalf("chunk body %s: %v", f.Event.Body, err)
	}
	return c
}

// detFractions returns the fractions of a run's progress frames.
func detFractions(t *testing.T, fs []agenttool.Frame, runID string) []float64 {
	t.Helper()
	var out []float64
	for _, f := range detChunks(fs, runID, "data-agent-progress") {
		var d detProgressData
		if err := json.Unmarshal(detBody(t, f).Data, &d); err != nil || d.Fraction == nil {
			t.Fatalf("progress frame %s", f.Event.Body)
		}
		out = append(out, *d.Fraction)
	}
	return out
}

// detBarrier writes a marker chunk into the worker's turn and waits until
// it reached the parent's client: every frame sent before it has arrived.
func detBarrier(t *testing.T, ctx context.Context, k *detKit, ws *detWS, runID, name string) []agenttool.Frame {
	t.Helper()
	if err := k.do(t, ctx, func(ctx context.Context) error {
		return chat.WriteChunk(ctx, message.Data("marker", name, json.RawMessage(`{}`), true))
	}); err != nil {
		t.Fatal(err)
	}
	return ws.waitFrames(ctx, "marker "+name, func(fs []agenttool.Frame) bool {
		for _, f := range detChunks(fs, runID, "data-marker") {
			if detBody(t, f).ID == name {
				return true
			}
		}
		return false
	})
}

func detReport(t *testing.T, ctx context.Context, k *detKit, p agenttool.Progress, persist ...bool) {
	t.Helper()
	if err := k.do(t, ctx, func(ctx context.Context) error { return agenttool.ReportProgress(ctx, p, persist...) }); err != nil {
		t.Fatalf("ReportProgress(%+v): %v", p, err)
	}
}

func detSnapshot(t *testing.T, parent agent.Agent, runID string) detProgressData {
	t.Helper()
	var d detProgressData
	in := detInspect(t, parent, runID)
	if err := json.Unmarshal(in.Progress, &d); err != nil {
		t.Fatalf("snapshot %s: %v", in.Progress, err)
	}
	return d
}

// TestReportProgressOutsideRun covers scenario 29: outside an agent-tool
// run ReportProgress is a no-op that returns nil, both with no turn at all
// and inside a chat turn that is not a run.
func TestReportProgressOutsideRun(t *testing.T) {
	if err := agenttool.ReportProgress(context.Background(), agenttool.Progress{Fraction: agenttool.Fraction(0.5)}); err != nil {
		t.Fatalf("no turn: %v", err)
	}
	k := newDetKit()
	errs := make(chan error, 2)
	k.work = func(ctx context.Context, w *detWorker, t *chat.Turn) error {
		errs <- agenttool.ReportProgress(ctx, agenttool.Progress{Fraction: agenttool.Fraction(0.5)})
		errs <- agenttool.ReportProgress(ctx, agenttool.Progress{Milestone: "m"})
		return t.WriteText("plain turn")
	}
	env := detStart(t, k, "")
	ctx := detCtx(t)
	w := detGet[*detWorker](t, env, agent.Root("DetWorker", "solo"))
	res, err := w.SaveMessages(ctx, []message.Message{{Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: "hi"}}}})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn = %+v, %v", res, err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("ReportProgress in a plain turn: %v", err)
		}
	}
	chunks, err := w.StreamChunks(ctx, res.ID, -1)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chunks {
		if strings.Contains(c.Body, "data-agent-") {
			t.Fatalf("a plain turn streamed %s", c.Body)
		}
	}
}

// TestProgressCoalescing covers scenarios 30 and 32 with difference 2:
// within the 200 ms window the latest signal wins and a trailing send
// closes the window (a burst 0.1, 0.2, 0.3 sends 0.1 at once and 0.3 when
// the window ends, never 0.2); a fraction of 1 goes out at once and drops
// what the window held. Each progress frame has its own id, so a client
// that deduplicates (useAgentToolEvents) keeps every one.
func TestProgressCoalescing(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	ctx := detCtx(t)
	p := detParentOf(t, env, "pp")
	ws := detDial(t, env, "det-parent/pp")
	detDispatch(t, ctx, p, "DetWorker", "c1", agenttool.DetachedOptions{OnFinish: "OnDone"})

	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(0.1), Message: "a"})
	if s := detSnapshot(t, p, "c1"); s.Fraction == nil || *s.Fraction != 0.1 || s.Message != "a" {
		t.Fatalf("snapshot = %+v", s)
	}
	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(0.2), Message: "b"})
	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(0.3), Message: "c"})
	fs := detBarrier(t, ctx, k, ws, "c1", "m1")
	detEq(t, "fractions within the window", detFractions(t, fs, "c1"), []float64{0.1})
	if s := detSnapshot(t, p, "c1"); *s.Fraction != 0.1 {
		t.Fatalf("a coalesced signal was stored: %+v", s)
	}

	k.clock.Advance(200 * time.Millisecond) // the window closes: trailing send
	fs = ws.waitFrames(ctx, "the trailing 0.3", func(fs []agenttool.Frame) bool { return len(detFractions(t, fs, "c1")) == 2 })
	detEq(t, "fractions after the window", detFractions(t, fs, "c1"), []float64{0.1, 0.3})
	last := detChunks(fs, "c1", "data-agent-progress")[1]
	var d detProgressData
	_ = json.Unmarshal(detBody(t, last).Data, &d)
	if d.Message != "c" {
		t.Fatalf("trailing send = %+v, want the latest signal", d)
	}

	// Within the new window: 0.5 is held, then 1 goes out at once and
	// replaces it; nothing trails.
	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(0.5)})
	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(1), Phase: "done"})
	detBarrier(t, ctx, k, ws, "c1", "m2")
	k.clock.Advance(time.Second)
	fs = detBarrier(t, ctx, k, ws, "c1", "m3")
	detEq(t, "fractions", detFractions(t, fs, "c1"), []float64{0.1, 0.3, 1})
	if s := detSnapshot(t, p, "c1"); *s.Fraction != 1 || s.Phase != "done" {
		t.Fatalf("snapshot = %+v", s)
	}

	ids := map[string]bool{}
	for _, f := range detChunks(fs, "c1", "data-agent-progress") {
		b := detBody(t, f)
		if b.Transient == nil || !*b.Transient {
			t.Fatalf("progress frame is not transient: %s", f.Event.Body)
		}
		if b.ID == "" || ids[b.ID] {
			t.Fatalf("progress frames share the id %q: a deduplicating client drops all but the first", b.ID)
		}
		ids[b.ID] = true
	}
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")
}

// TestProgressDataAndMilestones covers scenarios 31 and 33 and the parent's
// OnProgress hook: data travels live and is stored only with persist; a
// milestone goes out at once (even inside the window, which it restarts),
// durably, with the next per-run sequence, as a non-transient
// data-agent-milestone part; inspection lists the milestones in order.
func TestProgressDataAndMilestones(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	ctx := detCtx(t)
	p := detParentOf(t, env, "pd")
	ws := detDial(t, env, "det-parent/pd")
	detDispatch(t, ctx, p, "DetWorker", "m1", agenttool.DetachedOptions{OnFinish: "OnDone"})

	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(0.4), Phase: "reading", Message: "Reading…", Data: map[string]int{"secret": 1}})
	fs := detBarrier(t, ctx, k, ws, "m1", "b1")
	pf := detChunks(fs, "m1", "data-agent-progress")
	if len(pf) != 1 {
		t.Fatalf("%d progress frames", len(pf))
	}
	var live detProgressData
	_ = json.Unmarshal(detBody(t, pf[0]).Data, &live)
	if live.Phase != "reading" || live.Message != "Reading…" || string(live.Data) != `{"secret":1}` {
		t.Fatalf("live progress = %+v", live)
	}
	if s := detSnapshot(t, p, "m1"); s.Data != nil || s.Phase != "reading" {
		t.Fatalf("snapshot without persist = %+v", s)
	}

	// A milestone right away: not coalesced.
	detReport(t, ctx, k, agenttool.Progress{Milestone: "sources-gathered", Data: map[string]int{"sources": 2}})
	// Progress right after it is inside the window the milestone opened.
	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(0.6)})
	detReport(t, ctx, k, agenttool.Progress{Milestone: "synthesized", Fraction: agenttool.Fraction(0.8), Phase: "synthesizing"})
	fs = detBarrier(t, ctx, k, ws, "m1", "b2")
	detEq(t, "fractions", detFractions(t, fs, "m1"), []float64{0.4})
	mf := detChunks(fs, "m1", "data-agent-milestone")
	if len(mf) != 2 {
		t.Fatalf("%d milestone frames", len(mf))
	}
	for i, f := range mf {
		b := detBody(t, f)
		if b.Transient != nil {
			t.Fatalf("milestone frame is transient: %s", f.Event.Body)
		}
		var m agenttool.Milestone
		if err := json.Unmarshal(b.Data, &m); err != nil || m.Sequence != i || m.At != k.clock.Now().UnixMilli() {
			t.Fatalf("milestone frame %d: %s", i, f.Event.Body)
		}
	}
	var m0 agenttool.Milestone
	_ = json.Unmarshal(detBody(t, mf[0]).Data, &m0)
	if m0.Name != "sources-gathered" || string(m0.Data) != `{"sources":2}` {
		t.Fatalf("milestone 0 = %+v", m0)
	}

	// fraction 1 with persist: out at once, data stored.
	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(1), Data: map[string]string{"report": "r.md"}}, true)
	if s := detSnapshot(t, p, "m1"); string(s.Data) != `{"report":"r.md"}` || *s.Fraction != 1 {
		t.Fatalf("snapshot with persist = %+v", s)
	}
	in := detInspect(t, p, "m1")
	if len(in.Milestones) != 2 || in.Milestones[0].Name != "sources-gathered" || in.Milestones[0].Sequence != 0 ||
		in.Milestones[1].Name != "synthesized" || in.Milestones[1].Sequence != 1 || string(in.Milestones[0].Data) != `{"sources":2}` ||
		in.LastSignalAt == nil {
		t.Fatalf("inspection = %+v", in)
	}

	// The parent's OnProgress saw the progress and both milestones.
	var seen []string
	for len(seen) < 4 {
		select {
		case e := <-k.progress:
			if e.Run.RunID != "m1" {
				continue
			}
			switch {
			case e.Ev.Milestone != nil:
				seen = append(seen, "milestone:"+e.Ev.Milestone.Name)
			case e.Ev.Fraction != nil:
				seen = append(seen, "progress")
			}
		case <-ctx.Done():
			t.Fatalf("OnProgress saw only %v", seen)
		}
	}
	detEq(t, "OnProgress", seen, []string{"progress", "milestone:sources-gathered", "milestone:synthesized", "progress"})

	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")
	// The child's message keeps the milestones as parts; progress is
	// transient.
	w := detGet[*detWorker](t, env, agent.Root("DetParent", "pd").Child("DetWorker", "m1"))
	msgs := w.Messages()
	var types []string
	for _, part := range msgs[len(msgs)-1].Parts {
		if strings.HasPrefix(part.Type, "data-agent") {
			types = append(types, part.Type)
		}
	}
	detEq(t, "child message data parts", types, []string{"data-agent-milestone", "data-agent-milestone"})
}

// TestProgressReplay (difference 4): a client that connects later gets,
// per run, the latest progress and every milestone, with the sequences the
// live frames had — while the run is in flight and after it ended.
func TestProgressReplay(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	ctx := detCtx(t)
	p := detParentOf(t, env, "pr")
	ws := detDial(t, env, "det-parent/pr")
	detDispatch(t, ctx, p, "DetWorker", "r1", agenttool.DetachedOptions{OnFinish: "OnDone"})
	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(0.25)})
	k.clock.Advance(time.Second)
	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(0.5)})
	detReport(t, ctx, k, agenttool.Progress{Milestone: "a"})
	detReport(t, ctx, k, agenttool.Progress{Milestone: "b"})
	k.clock.Advance(time.Second)
	detReport(t, ctx, k, agenttool.Progress{Fraction: agenttool.Fraction(0.75), Message: "late"})
	liveFrames := detBarrier(t, ctx, k, ws, "r1", "b1")

	check := func(name string, replay []agenttool.Frame) {
		t.Helper()
		bySeq := map[int64]string{}
		for _, f := range liveFrames {
			if f.Event.RunID == "r1" && f.Event.Kind == "chunk" {
				bySeq[f.Sequence] = f.Event.Body
			}
		}
		detEq(t, name+" progress", detFractions(t, replay, "r1"), []float64{0.75})
		ms := detChunks(replay, "r1", "data-agent-milestone")
		if len(ms) != 2 {
			t.Fatalf("%s: %d milestones", name, len(ms))
		}
		for _, f := range append(ms, detChunks(replay, "r1", "data-agent-progress")...) {
			if !f.Replay || bySeq[f.Sequence] != f.Event.Body {
				t.Fatalf("%s: replayed %d %s, live had %q", name, f.Sequence, f.Event.Body, bySeq[f.Sequence])
			}
		}
		for i, f := range ms {
			var m agenttool.Milestone
			_ = json.Unmarshal(detBody(t, f).Data, &m)
			if m.Sequence != i {
				t.Fatalf("%s: milestone %d has sequence %d", name, i, m.Sequence)
			}
		}
	}
	ws2 := detDial(t, env, "det-parent/pr")
	check("in flight", ws2.waitFrames(ctx, "replay", func(fs []agenttool.Frame) bool { return len(detFractions(t, fs, "r1")) > 0 }))

	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")
	ws3 := detDial(t, env, "det-parent/pr")
	check("finished", ws3.waitFrames(ctx, "replay", detHasTerminal("r1")))
}
