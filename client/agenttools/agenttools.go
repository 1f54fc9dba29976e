// Package agenttools folds agent-tool-event frames into the state of every
// agent-tool run a parent agent reports: the Go twin of the npm
// applyAgentToolEvent reducer and the useAgentToolEvents hook.
//
// Apply is a pure reducer: it never changes the State it is given, so the
// same frame applied twice to the same state gives equal results. A
// Tracker wraps it with the hook's deduplication, so live frames and the
// replay a server pushes on every connection can be fed in any overlap:
//
//	tr := agenttools.NewTracker(nil)
//	conn, err := client.Dial(ctx, client.Options{
//		Host: host, Agent: "Assistant", Name: user,
//		OnFrame: func(f client.Frame) { tr.HandleFrame(f.Data) },
//	})
//	…
//	for _, run := range tr.State().RunsForToolCall(toolCallID) { … }
package agenttools

import (
	"cmp"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/wire"
)

// Reserved data parts of a child's stream.
const (
	// ProgressPart is the transient data part that carries progress:
	// data {fraction?, message?, phase?, data?}.
	ProgressPart = "data-agent-progress"
	// MilestonePart is the durable data part that carries a milestone:
	// data {name, sequence, at, fraction?, message?, phase?, data?}.
	MilestonePart = "data-agent-milestone"
)

// State is the state of every run seen, indexed three ways. Runs are shared
// between the states Apply returns and must be treated as read-only.
type State struct {
	// RunsByID holds every run by run id.
	RunsByID map[string]*Run
	// RunsByToolCallID groups the runs bound to a parent tool call,
	// sorted by Order, then RunID.
	RunsByToolCallID map[string][]*Run
	// UnboundRuns are the runs with no parent tool call (detached or
	// programmatic), in the same order.
	UnboundRuns []*Run
}

// RunsForToolCall returns the runs rendered under the parent tool call id,
// or an empty slice (the hook's getRunsForToolCall).
func (s State) RunsForToolCall(id string) []*Run {
	if rs := s.RunsByToolCallID[id]; rs != nil {
		return rs
	}
	return []*Run{}
}

// SubAgent addresses a run's child for drill-in: connect with
// client.Options{Agent: parent, Name: parentName, Sub: []client.Hop{{Agent:
// sa.Agent, Name: sa.Name}}}.
type SubAgent struct {
	Agent string
	Name  string
}

// Progress is the latest progress signal of a run.
type Progress struct {
	Fraction *float64
	Message  string
	Phase    string
	// Data is the application payload of a progress signal.
	Data json.RawMessage
	// Milestone names the milestone this progress reflects, if any.
	Milestone string
	// At is when the client received the signal, or the milestone's own
	// time for a milestone.
	At time.Time
}

// Milestone is a durable milestone a run reached.
type Milestone struct {
	Name     string
	Sequence int64
	At       time.Time
	Fraction *float64
	Message  string
	Phase    string
	Data     json.RawMessage
}

// Run is the client's view of one agent-tool run.
type Run struct {
	RunID            string
	AgentType        string
	ParentToolCallID string
	InputPreview     json.RawMessage
	Order            int
	Display          agenttool.Display
	// Status is running, completed, error, aborted or interrupted.
	Status agenttool.Status
	// Parts is the child's assistant message so far, built from its chunks
	// as the chat's message.Builder builds a message: text, reasoning, tool
	// and non-transient data parts.
	Parts []message.Part
	// Summary is set when the run completed.
	Summary string
	// Error is the error of an error or interrupted run, and the reason of
	// an aborted one.
	Error string
	// Reason and ChildStillRunning are set for interrupted runs.
	Reason            agenttool.Reason
	ChildStillRunning *bool
	// Progress is the latest progress signal, nil before the first.
	Progress *Progress
	// Milestones are the milestones reached, deduplicated by sequence and
	// sorted by it.
	Milestones []Milestone
	// SubAgent addresses the run's child.
	SubAgent SubAgent

	// lg and n are the builder lineage Parts come from: Parts equal
	// lg.chunks[:n] applied in order.
	lg *partLog
	n  int
}

// partLog is the chunk log and message builder of a run. Runs derived one
// from another share it; a run applying a chunk continues it in place when
// it is the log's latest state and forks a copy otherwise, so Apply stays
// pure at amortized constant cost.
type partLog struct {
	mu     sync.Mutex
	chunks []message.Chunk
	b      *message.Builder
}

// Apply returns the state after frame f, as applyAgentToolEvent does (see
// ApplyAt); progress signals are stamped with the current time.
func Apply(s State, f agenttool.Frame) State { return ApplyAt(s, f, time.Now()) }

// ApplyAt returns the state after frame f; now stamps progress signals. s
// is not modified.
//
//   - Frames whose type is not agent-tool-event are ignored.
//   - started creates the run (status running, no parts, SubAgent
//     {agentType, runId}) or refreshes the metadata of a running run,
//     keeping its parts; a started frame for a run already terminal is
//     ignored.
//   - chunk and terminal events for a run never started are dropped.
//   - chunk applies its body (a UI message chunk) to the parts; a body that
//     is not JSON or that the builder rejects leaves the run unchanged. A
//     text or reasoning delta with no open part starts one, as the npm
//     reducer does for resumed streams. A data-agent-progress body sets
//     Progress; a data-agent-milestone body with a name is merged into
//     Milestones and, when new and not older than the progress, becomes
//     the progress.
//   - finished, error, aborted and interrupted set the status completed,
//     error, aborted and interrupted; terminal to terminal is allowed (an
//     interrupted run that finishes later becomes completed).
func ApplyAt(s State, f agenttool.Frame, now time.Time) State {
	if f.Type != wire.AgentToolEvent || f.Event.RunID == "" {
		return s
	}
	ev := f.Event
	prev := s.RunsByID[ev.RunID]
	next := applyToRun(prev, f, now)
	if next == nil || next == prev {
		return s
	}
	byID := make(map[string]*Run, len(s.RunsByID)+1)
	maps.Copy(byID, s.RunsByID)
	byID[ev.RunID] = next
	out := State{RunsByID: byID, RunsByToolCallID: make(map[string][]*Run, len(s.RunsByToolCallID)+1)}
	maps.Copy(out.RunsByToolCallID, s.RunsByToolCallID)
	out.UnboundRuns = s.UnboundRuns
	groups := []string{next.ParentToolCallID}
	if prev != nil && prev.ParentToolCallID != next.ParentToolCallID {
		groups = append(groups, prev.ParentToolCallID)
	}
	for _, g := range groups {
		var rs []*Run
		for _, r := range byID {
			if r.ParentToolCallID == g {
				rs = append(rs, r)
			}
		}
		slices.SortFunc(rs, func(a, b *Run) int {
			return cmp.Or(cmp.Compare(a.Order, b.Order), cmp.Compare(a.RunID, b.RunID))
		})
		switch {
		case g == "":
			out.UnboundRuns = rs
		case len(rs) == 0:
			delete(out.RunsByToolCallID, g)
		default:
			out.RunsByToolCallID[g] = rs
		}
	}
	return out
}

// terminal reports whether s is one of the statuses a run ends in.
func terminal(s agenttool.Status) bool {
	return s.Hard() || s == agenttool.StatusInterrupted
}

// applyToRun returns the run after f, prev itself when f changes nothing,
// or nil for a frame about a run never started.
func applyToRun(prev *Run, f agenttool.Frame, now time.Time) *Run {
	ev := f.Event
	if ev.Kind == "started" {
		if prev != nil && terminal(prev.Status) {
			return prev
		}
		r := &Run{}
		if prev != nil {
			*r = *prev
		}
		r.RunID = ev.RunID
		r.AgentType = ev.AgentType
		r.ParentToolCallID = f.ParentToolCallID
		r.InputPreview = ev.InputPreview
		r.Order = 0
		if ev.Order != nil {
			r.Order = *ev.Order
		}
		r.Display = ev.Display
		r.Status = agenttool.StatusRunning
		if r.Parts == nil {
			r.Parts = []message.Part{}
		}
		r.SubAgent = SubAgent{Agent: ev.AgentType, Name: ev.RunID}
		return r
	}
	if prev == nil {
		return nil
	}
	r := *prev
	switch ev.Kind {
	case "chunk":
		return applyChunk(prev, ev.Body, now)
	case "finished":
		r.Status = agenttool.StatusCompleted
		r.Summary = ""
		if ev.Summary != nil {
			r.Summary = *ev.Summary
		}
		r.Error = ""
	case "error":
		r.Status = agenttool.StatusError
		r.Error = ev.Error
	case "aborted":
		r.Status = agenttool.StatusAborted
		r.Error = ev.Reason
	case "interrupted":
		r.Status = agenttool.StatusInterrupted
		r.Error = ev.Error
		r.Reason = agenttool.Reason(ev.Reason)
		r.ChildStillRunning = ev.ChildStillRunning
	default:
		return prev
	}
	return &r
}

// progressData is the data of a progress or milestone part.
type progressData struct {
	Name     *string         `json:"name"`
	Sequence int64           `json:"sequence"`
	At       float64         `json:"at"`
	Fraction *float64        `json:"fraction"`
	Message  string          `json:"message"`
	Phase    string          `json:"phase"`
	Data     json.RawMessage `json:"data"`
}

// applyChunk applies one chunk body to a run.
func applyChunk(prev *Run, body string, now time.Time) *Run {
	var c message.Chunk
	if err := json.Unmarshal([]byte(body), &c); err != nil || c.Type == "" {
		return prev
	}
	r := *prev
	if c.Type == ProgressPart || c.Type == MilestonePart {
		var d progressData
		if len(c.Data) > 0 && json.Unmarshal(c.Data, &d) != nil {
			return prev
		}
		if c.Type == ProgressPart {
			r.Progress = &Progress{Fraction: d.Fraction, Message: d.Message, Phase: d.Phase, Data: d.Data, At: now}
		} else {
			if d.Name == nil {
				return prev
			}
			ms := Milestone{Name: *d.Name, Sequence: d.Sequence, At: time.UnixMilli(int64(d.At)),
				Fraction: d.Fraction, Message: d.Message, Phase: d.Phase, Data: d.Data}
			i, found := slices.BinarySearchFunc(prev.Milestones, ms.Sequence, func(m Milestone, seq int64) int {
				return cmp.Compare(m.Sequence, seq)
			})
			if !found {
				r.Milestones = slices.Insert(slices.Clone(prev.Milestones), i, ms)
				if prev.Progress == nil || !ms.At.Before(prev.Progress.At) {
					r.Progress = &Progress{Fraction: ms.Fraction, Message: ms.Message, Phase: ms.Phase,
						Milestone: ms.Name, At: ms.At}
				}
			}
		}
	}
	lg, n, parts, ok := appendChunk(prev, c)
	if ok {
		r.lg, r.n, r.Parts = lg, n, parts
	}
	return &r
}

// appendChunk applies c to the run's builder lineage and returns the new
// lineage position and parts; ok is false when the builder rejects c.
func appendChunk(prev *Run, c message.Chunk) (*partLog, int, []message.Part, bool) {
	if c.IsData() && c.IsTransient() {
		// A transient data chunk changes no part.
		return prev.lg, prev.n, prev.Parts, true
	}
	lg := prev.lg
	if lg == nil {
		lg = newPartLog(nil)
	}
	lg.mu.Lock()
	if len(lg.chunks) != prev.n {
		// prev is not the lineage's latest state: fork a copy.
		fork := newPartLog(lg.chunks[:prev.n])
		lg.mu.Unlock()
		lg = fork
		lg.mu.Lock()
	}
	defer lg.mu.Unlock()
	err := lg.b.Apply(c)
	var se *message.StreamError
	if errors.As(err, &se) && (c.Type == message.ChunkTextDelta || c.Type == message.ChunkReasoningDelta) {
		// A delta with no open part: start one first, like the npm
		// reducer's fallback for resumed streams.
		start := message.TextStart(c.ID)
		if c.Type == message.ChunkReasoningDelta {
			start = message.ReasoningStart(c.ID)
		}
		if lg.b.Apply(start) == nil {
			lg.chunks = append(lg.chunks, start)
			err = lg.b.Apply(c)
		}
	}
	if err == nil {
		lg.chunks = append(lg.chunks, c)
	}
	if len(lg.chunks) == prev.n {
		return nil, 0, nil, false
	}
	return lg, len(lg.chunks), lg.b.Message().Parts, true
}

// newPartLog returns a lineage that has applied chunks.
func newPartLog(chunks []message.Chunk) *partLog {
	lg := &partLog{chunks: slices.Clone(chunks), b: message.NewBuilder("")}
	for _, c := range lg.chunks {
		_ = lg.b.Apply(c) // every logged chunk was accepted before
	}
	return lg
}
