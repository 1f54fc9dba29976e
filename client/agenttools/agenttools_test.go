package agenttools_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/client/agenttools"
	"github.com/agentry/agentry/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var clock = time.UnixMilli(5000)

// frame builds an agent-tool-event frame under parent tool call "tool-1"
// unless parent says otherwise ("" for an unbound run).
func frame(seq int64, ev agenttool.Event, parent ...string) agenttool.Frame {
	p := "tool-1"
	if len(parent) > 0 {
		p = parent[0]
	}
	return agenttool.Frame{Type: wire.AgentToolEvent, ParentToolCallID: p, Sequence: seq, Event: ev}
}

func started(runID string, order int) agenttool.Event {
	return agenttool.Event{Kind: "started", RunID: runID, AgentType: "Researcher", Order: &order}
}

func chunk(runID string, body any) agenttool.Event {
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return agenttool.Event{Kind: "chunk", RunID: runID, Body: string(b)}
}

func ptr[T any](v T) *T { return &v }

func applyAll(s agenttools.State, fs ...agenttool.Frame) agenttools.State {
	for _, f := range fs {
		s = agenttools.ApplyAt(s, f, clock)
	}
	return s
}

func ids(rs []*agenttools.Run) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.RunID)
	}
	return out
}

func text(r *agenttools.Run) string {
	var s string
	for _, p := range r.Parts {
		if p.Type == message.PartText {
			s += p.Text
		}
	}
	return s
}

// TestReducer replicates scenarios 10–18 of the reference (spec §9 B).
func TestReducer(t *testing.T) {
	milestone := func(seq, msSeq int64, name string) agenttool.Frame {
		return frame(seq, chunk("r", map[string]any{
			"type": agenttools.MilestonePart,
			"data": map[string]any{"name": name, "sequence": msSeq, "at": 1000 + msSeq, "phase": name},
		}))
	}
	tests := []struct {
		name   string
		frames []agenttool.Frame
		check  func(t *testing.T, s agenttools.State)
	}{
		{
			name:   "10 groups runs by parent tool call in display order",
			frames: []agenttool.Frame{frame(0, started("b", 1)), frame(0, started("a", 0))},
			check: func(t *testing.T, s agenttools.State) {
				if got := ids(s.RunsByToolCallID["tool-1"]); !slices.Equal(got, []string{"a", "b"}) {
					t.Errorf("runs under tool-1 = %v, want [a b]", got)
				}
			},
		},
		{
			name: "11 applies chunk bodies to parts",
			frames: []agenttool.Frame{
				frame(0, started("r", 0)),
				frame(1, chunk("r", map[string]any{"type": "text-delta", "delta": "hello"})),
			},
			check: func(t *testing.T, s agenttools.State) {
				r := s.RunsByID["r"]
				if len(r.Parts) != 1 || r.Parts[0].Type != "text" || r.Parts[0].Text != "hello" {
					t.Errorf("parts = %+v, want one text part \"hello\"", r.Parts)
				}
			},
		},
		{
			name: "13 progress is projected, not stored as a part; latest wins",
			frames: []agenttool.Frame{
				frame(0, started("r", 0)),
				frame(1, chunk("r", map[string]any{"type": agenttools.ProgressPart, "transient": true,
					"data": map[string]any{"fraction": 0.6, "phase": "reading", "message": "Reading…"}})),
			},
			check: func(t *testing.T, s agenttools.State) {
				r := s.RunsByID["r"]
				if len(r.Parts) != 0 {
					t.Errorf("parts = %+v, want none", r.Parts)
				}
				p := r.Progress
				if p == nil || p.Fraction == nil || *p.Fraction != 0.6 || p.Phase != "reading" || p.Message != "Reading…" || !p.At.Equal(clock) {
					t.Fatalf("progress = %+v", p)
				}
				s = applyAll(s, frame(2, chunk("r", map[string]any{"type": agenttools.ProgressPart, "transient": true,
					"data": map[string]any{"fraction": 1, "phase": "done"}})))
				p = s.RunsByID["r"].Progress
				if p == nil || p.Fraction == nil || *p.Fraction != 1 || p.Phase != "done" {
					t.Errorf("progress after second signal = %+v", p)
				}
			},
		},
		{
			name: "14 milestones dedupe by sequence and set the progress",
			frames: []agenttool.Frame{
				frame(0, started("r", 0)),
				milestone(1, 0, "sources-gathered"),
				milestone(2, 1, "synthesized"),
				milestone(3, 0, "sources-gathered"),
			},
			check: func(t *testing.T, s agenttools.State) {
				r := s.RunsByID["r"]
				var got []string
				for _, m := range r.Milestones {
					got = append(got, m.Name)
					if m.At != time.UnixMilli(1000+m.Sequence) {
						t.Errorf("milestone %s at %v", m.Name, m.At)
					}
				}
				if !slices.Equal(got, []string{"sources-gathered", "synthesized"}) ||
					r.Milestones[0].Sequence != 0 || r.Milestones[1].Sequence != 1 {
					t.Errorf("milestones = %+v", r.Milestones)
				}
				if p := r.Progress; p == nil || p.Milestone != "synthesized" || p.Phase != "synthesized" {
					t.Errorf("progress = %+v", p)
				}
			},
		},
		{
			name:   "15 unbound runs",
			frames: []agenttool.Frame{frame(0, agenttool.Event{Kind: "started", RunID: "imperative", AgentType: "Planner", Order: ptr(0)}, "")},
			check: func(t *testing.T, s agenttools.State) {
				if got := ids(s.UnboundRuns); !slices.Equal(got, []string{"imperative"}) {
					t.Errorf("unbound = %v", got)
				}
				if len(s.RunsByToolCallID) != 0 {
					t.Errorf("runsByToolCallId = %v, want empty", s.RunsByToolCallID)
				}
			},
		},
		{
			name: "16 interrupted",
			frames: []agenttool.Frame{
				frame(0, started("r", 0)),
				frame(1, agenttool.Event{Kind: "interrupted", RunID: "r", Error: "parent restarted"}),
			},
			check: func(t *testing.T, s agenttools.State) {
				if r := s.RunsByID["r"]; r.Status != agenttool.StatusInterrupted || r.Error != "parent restarted" {
					t.Errorf("run = %+v", r)
				}
			},
		},
		{
			name: "17 interrupted no-progress, child still running",
			frames: []agenttool.Frame{
				frame(0, started("r", 0)),
				frame(1, agenttool.Event{Kind: "interrupted", RunID: "r", Error: "the parent gave up while the child kept advancing",
					Reason: "no-progress", ChildStillRunning: ptr(true)}),
			},
			check: func(t *testing.T, s agenttools.State) {
				r := s.RunsByID["r"]
				if r.Status != agenttool.StatusInterrupted || r.Reason != agenttool.ReasonNoProgress || r.ChildStillRunning == nil || !*r.ChildStillRunning {
					t.Errorf("run = %+v", r)
				}
			},
		},
		{
			name: "18 interrupted window-exceeded, child gone",
			frames: []agenttool.Frame{
				frame(0, started("r", 0)),
				frame(1, agenttool.Event{Kind: "interrupted", RunID: "r", Error: "the parent gave up at the hard re-attach ceiling",
					Reason: "window-exceeded", ChildStillRunning: ptr(false)}),
			},
			check: func(t *testing.T, s agenttools.State) {
				r := s.RunsByID["r"]
				if r.Status != agenttool.StatusInterrupted || r.Reason != agenttool.ReasonWindowExceeded || r.ChildStillRunning == nil || *r.ChildStillRunning {
					t.Errorf("run = %+v", r)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, applyAll(agenttools.State{}, tt.frames...))
		})
	}
}

// TestReducerPure is scenario 12: the same frame applied twice to the same
// state gives the same result and leaves the state alone.
func TestReducerPure(t *testing.T) {
	prev := applyAll(agenttools.State{},
		frame(0, started("r", 0)),
		frame(1, chunk("r", map[string]any{"type": "text-delta", "delta": "hello"})),
	)
	delta := frame(2, chunk("r", map[string]any{"type": "text-delta", "delta": " world"}))
	first := agenttools.ApplyAt(prev, delta, clock)
	second := agenttools.ApplyAt(prev, delta, clock)
	if got := text(first.RunsByID["r"]); got != "hello world" {
		t.Errorf("first = %q", got)
	}
	if got := text(second.RunsByID["r"]); got != "hello world" {
		t.Errorf("second = %q", got)
	}
	if got := text(prev.RunsByID["r"]); got != "hello" {
		t.Errorf("prev = %q, want it untouched", got)
	}
	// Both branches keep growing independently.
	a := agenttools.ApplyAt(first, frame(3, chunk("r", map[string]any{"type": "text-delta", "delta": "!"})), clock)
	b := agenttools.ApplyAt(second, frame(3, chunk("r", map[string]any{"type": "text-delta", "delta": "?"})), clock)
	if text(a.RunsByID["r"]) != "hello world!" || text(b.RunsByID["r"]) != "hello world?" || text(first.RunsByID["r"]) != "hello world" {
		t.Errorf("branches: %q %q %q", text(a.RunsByID["r"]), text(b.RunsByID["r"]), text(first.RunsByID["r"]))
	}
}

// TestReducerRules covers the rules of §3.8 that the scenarios do not.
func TestReducerRules(t *testing.T) {
	t.Run("chunk and terminal for an unknown run are dropped", func(t *testing.T) {
		s := applyAll(agenttools.State{},
			frame(1, chunk("x", map[string]any{"type": "text-delta", "delta": "hi"})),
			frame(2, agenttool.Event{Kind: "finished", RunID: "x", Summary: ptr("s")}),
		)
		if len(s.RunsByID) != 0 {
			t.Errorf("runs = %v", s.RunsByID)
		}
	})
	t.Run("started after a terminal does not resurrect", func(t *testing.T) {
		s := applyAll(agenttools.State{}, frame(0, started("r", 0)), frame(1, agenttool.Event{Kind: "error", RunID: "r", Error: "boom"}))
		s2 := agenttools.ApplyAt(s, frame(0, started("r", 3)), clock)
		if r := s2.RunsByID["r"]; r.Status != agenttool.StatusError || r.Order != 0 || r.Error != "boom" {
			t.Errorf("run = %+v", r)
		}
	})
	t.Run("started refreshes a running run and keeps its parts", func(t *testing.T) {
		s := applyAll(agenttools.State{},
			frame(0, started("r", 0)),
			frame(1, chunk("r", message.TextStart("t"))),
			frame(2, chunk("r", message.TextDelta("t", "abc"))),
			frame(0, agenttool.Event{Kind: "started", RunID: "r", AgentType: "Researcher", Order: ptr(2),
				InputPreview: json.RawMessage(`"q"`)}, "tool-2"),
		)
		r := s.RunsByID["r"]
		if text(r) != "abc" || r.Order != 2 || string(r.InputPreview) != `"q"` || r.ParentToolCallID != "tool-2" {
			t.Errorf("run = %+v", r)
		}
		if len(s.RunsByToolCallID["tool-1"]) != 0 || len(s.RunsByToolCallID["tool-2"]) != 1 {
			t.Errorf("index = %v", s.RunsByToolCallID)
		}
		if r.SubAgent != (agenttools.SubAgent{Agent: "Researcher", Name: "r"}) {
			t.Errorf("sub-agent = %+v", r.SubAgent)
		}
	})
	t.Run("bad bodies leave the run unchanged", func(t *testing.T) {
		s := applyAll(agenttools.State{}, frame(0, started("r", 0)), frame(1, chunk("r", message.TextStart("t"))))
		before := s.RunsByID["r"]
		for _, body := range []string{"{malformed", `{"type":"text-end","id":"nope"}`, `{"type":"tool-output-available","toolCallId":"c","output":1}`} {
			s2 := agenttools.ApplyAt(s, frame(2, agenttool.Event{Kind: "chunk", RunID: "r", Body: body}), clock)
			if !reflect.DeepEqual(s2.RunsByID["r"].Parts, before.Parts) {
				t.Errorf("body %s changed parts to %+v", body, s2.RunsByID["r"].Parts)
			}
		}
	})
	t.Run("tool and data parts follow the builder", func(t *testing.T) {
		s := applyAll(agenttools.State{},
			frame(0, started("r", 0)),
			frame(1, chunk("r", message.StartStep())),
			frame(2, chunk("r", message.ToolInputAvailable("c1", "search", json.RawMessage(`{"q":"x"}`)))),
			frame(3, chunk("r", message.ToolOutputAvailable("c1", json.RawMessage(`{"hits":3}`)))),
			frame(4, chunk("r", message.Data("note", "n1", json.RawMessage(`1`), false))),
			frame(5, chunk("r", message.Data("note", "n1", json.RawMessage(`2`), false))),
			frame(6, chunk("r", message.Data("tick", "", json.RawMessage(`1`), true))),
		)
		parts := s.RunsByID["r"].Parts
		if len(parts) != 3 || parts[1].Type != "tool-search" || parts[1].State != message.StateOutputAvailable ||
			parts[2].Type != "data-note" || string(parts[2].Data) != "2" {
			t.Errorf("parts = %+v", parts)
		}
	})
	t.Run("interrupted then finished completes", func(t *testing.T) {
		s := applyAll(agenttools.State{},
			frame(0, started("r", 0)),
			frame(1, agenttool.Event{Kind: "interrupted", RunID: "r", Error: "gone", Reason: "no-progress", ChildStillRunning: ptr(true)}),
			frame(2, agenttool.Event{Kind: "finished", RunID: "r", Summary: ptr("late")}),
		)
		if r := s.RunsByID["r"]; r.Status != agenttool.StatusCompleted || r.Summary != "late" || r.Error != "" {
			t.Errorf("run = %+v", r)
		}
	})
	t.Run("a milestone older than the progress does not replace it", func(t *testing.T) {
		s := applyAll(agenttools.State{},
			frame(0, started("r", 0)),
			frame(1, chunk("r", map[string]any{"type": agenttools.ProgressPart, "transient": true, "data": map[string]any{"phase": "now"}})),
			frame(2, chunk("r", map[string]any{"type": agenttools.MilestonePart, "data": map[string]any{"name": "old", "sequence": 0, "at": 10}})),
		)
		r := s.RunsByID["r"]
		if len(r.Milestones) != 1 || r.Progress.Phase != "now" || r.Progress.Milestone != "" {
			t.Errorf("run = %+v, progress %+v", r, r.Progress)
		}
	})
	t.Run("other frame types are ignored", func(t *testing.T) {
		f := frame(0, started("r", 0))
		f.Type = wire.RPC
		if s := agenttools.ApplyAt(agenttools.State{}, f, clock); len(s.RunsByID) != 0 {
			t.Errorf("runs = %v", s.RunsByID)
		}
	})
}

func raw(t *testing.T, f agenttool.Frame, replay bool) []byte {
	t.Helper()
	f.Replay = replay
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTracker replicates scenarios 34–40 of the reference (spec §9 C).
func TestTracker(t *testing.T) {
	delta := func(seq int64, d string) agenttool.Frame {
		return frame(seq, chunk("r", message.TextDelta("t", d)), "call-1")
	}
	start := []agenttool.Frame{
		frame(0, agenttool.Event{Kind: "started", RunID: "r", AgentType: "Researcher", Order: ptr(0)}, "call-1"),
		frame(1, chunk("r", message.TextStart("t")), "call-1"),
	}
	type step struct {
		f      agenttool.Frame
		replay bool
	}
	seq := func(fs ...agenttool.Frame) []step {
		var out []step
		for _, f := range fs {
			out = append(out, step{f: f})
		}
		return out
	}
	tests := []struct {
		name  string
		steps []step
		check func(t *testing.T, tr *agenttools.Tracker)
	}{
		{
			name: "34 a replayed chunk is applied once",
			steps: append(seq(append(start, delta(2, "Hello"))...),
				step{delta(2, "Hello"), true}, step{delta(3, " world"), false}),
			check: func(t *testing.T, tr *agenttools.Tracker) {
				if got := text(tr.State().RunsByID["r"]); got != "Hello world" {
					t.Errorf("text = %q", got)
				}
			},
		},
		{
			name:  "35 distinct sequences are not over-deduplicated",
			steps: seq(append(start, delta(2, "foo"), delta(3, "bar"))...),
			check: func(t *testing.T, tr *agenttools.Tracker) {
				if got := text(tr.State().RunsByID["r"]); got != "foobar" {
					t.Errorf("text = %q", got)
				}
			},
		},
		{
			name: "36 a replayed started does not resurrect a finished run",
			steps: append(seq(start[0], frame(1, agenttool.Event{Kind: "finished", RunID: "r", Summary: ptr("done")}, "call-1")),
				step{frame(2, agenttool.Event{Kind: "started", RunID: "r", AgentType: "Researcher", Order: ptr(0)}, "call-1"), true}),
			check: func(t *testing.T, tr *agenttools.Tracker) {
				if r := tr.State().RunsByID["r"]; r.Status != agenttool.StatusCompleted || r.Summary != "done" {
					t.Errorf("run = %+v", r)
				}
			},
		},
		{
			name: "38 grouping under a tool call and unbound",
			steps: seq(
				frame(0, agenttool.Event{Kind: "started", RunID: "child-b", AgentType: "Researcher", Order: ptr(1)}, "call-1"),
				frame(0, agenttool.Event{Kind: "started", RunID: "child-a", AgentType: "Researcher", Order: ptr(0)}, "call-1"),
				frame(0, agenttool.Event{Kind: "started", RunID: "loose", AgentType: "Planner", Order: ptr(0)}, ""),
			),
			check: func(t *testing.T, tr *agenttools.Tracker) {
				if got := ids(tr.RunsForToolCall("call-1")); !slices.Equal(got, []string{"child-a", "child-b"}) {
					t.Errorf("call-1 = %v", got)
				}
				if got := ids(tr.State().UnboundRuns); !slices.Equal(got, []string{"loose"}) {
					t.Errorf("unbound = %v", got)
				}
				if got := tr.RunsForToolCall("nope"); got == nil || len(got) != 0 {
					t.Errorf("unknown tool call = %v, want empty", got)
				}
			},
		},
		{
			name: "39 terminal kinds map to statuses",
			steps: seq(
				frame(0, agenttool.Event{Kind: "started", RunID: "f", AgentType: "A", Order: ptr(0)}),
				frame(0, agenttool.Event{Kind: "started", RunID: "e", AgentType: "A", Order: ptr(1)}),
				frame(0, agenttool.Event{Kind: "started", RunID: "a", AgentType: "A", Order: ptr(2)}),
				frame(0, agenttool.Event{Kind: "started", RunID: "i", AgentType: "A", Order: ptr(3)}),
				frame(1, agenttool.Event{Kind: "finished", RunID: "f", Summary: ptr("sum")}),
				frame(1, agenttool.Event{Kind: "error", RunID: "e", Error: "boom"}),
				frame(1, agenttool.Event{Kind: "aborted", RunID: "a", Reason: "stop"}),
				frame(1, agenttool.Event{Kind: "interrupted", RunID: "i", Error: "lost", Reason: "no-progress", ChildStillRunning: ptr(true)}),
			),
			check: func(t *testing.T, tr *agenttools.Tracker) {
				s := tr.State()
				f, e, a, i := s.RunsByID["f"], s.RunsByID["e"], s.RunsByID["a"], s.RunsByID["i"]
				if f.Status != agenttool.StatusCompleted || f.Summary != "sum" {
					t.Errorf("finished: %+v", f)
				}
				if e.Status != agenttool.StatusError || e.Error != "boom" {
					t.Errorf("error: %+v", e)
				}
				if a.Status != agenttool.StatusAborted || a.Error != "stop" {
					t.Errorf("aborted: %+v", a)
				}
				if i.Status != agenttool.StatusInterrupted || i.Error != "lost" || i.Reason != agenttool.ReasonNoProgress || !*i.ChildStillRunning {
					t.Errorf("interrupted: %+v", i)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := agenttools.NewTracker(func() time.Time { return clock })
			for _, st := range tt.steps {
				tr.HandleFrame(raw(t, st.f, st.replay))
			}
			tt.check(t, tr)
		})
	}

	// 37: ResetLocalState clears runs and the seen set.
	t.Run("37 reset local state", func(t *testing.T) {
		tr := agenttools.NewTracker(nil)
		frames := append(start, delta(2, "Hi"))
		for _, f := range frames {
			tr.Apply(f)
		}
		if got := text(tr.State().RunsByID["r"]); got != "Hi" {
			t.Fatalf("text = %q", got)
		}
		tr.ResetLocalState()
		if n := len(tr.State().RunsByID); n != 0 {
			t.Fatalf("%d runs after reset", n)
		}
		for _, f := range frames {
			if !tr.Apply(f) {
				t.Errorf("frame %d not re-applied after reset", f.Sequence)
			}
		}
		if got := text(tr.State().RunsByID["r"]); got != "Hi" {
			t.Errorf("text after re-send = %q", got)
		}
	})

	// 40: garbage before a valid started.
	t.Run("40 garbage frames are ignored", func(t *testing.T) {
		tr := agenttools.NewTracker(nil)
		for _, data := range [][]byte{{0xff, 0x00, 0x01}, []byte("{malformed"), []byte(`{"type":"rpc","id":"x"}`), []byte(`"just a string"`)} {
			if tr.HandleFrame(data) {
				t.Errorf("frame %q applied", data)
			}
		}
		if !tr.HandleFrame(raw(t, start[0], false)) {
			t.Fatal("valid started not applied")
		}
		if r := tr.State().RunsByID["r"]; r == nil || r.Status != agenttool.StatusRunning {
			t.Errorf("run = %+v", r)
		}
	})
}
