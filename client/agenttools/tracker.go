package agenttools

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/wire"
)

// Tracker follows the agent-tool runs of one parent connection, as the npm
// useAgentToolEvents hook does: it applies every agent-tool-event frame it
// is given once, deduplicating by (parentToolCallId, runId, sequence) for
// its whole life, so a connect replay that repeats live frames (or a frame
// delivered twice) is applied once. The replay flag is not consulted. A
// Tracker is safe for concurrent use.
type Tracker struct {
	now func() time.Time

	mu    sync.Mutex
	state State
	seen  map[dedupeKey]struct{}
}

type dedupeKey struct {
	parentToolCallID string
	runID            string
	sequence         int64
}

// NewTracker returns an empty Tracker; now stamps progress signals (nil
// means time.Now).
func NewTracker(now func() time.Time) *Tracker {
	if now == nil {
		now = time.Now
	}
	return &Tracker{now: now, seen: map[dedupeKey]struct{}{}}
}

// HandleFrame applies a raw frame from the parent's connection. Frames that
// are not JSON, or not agent-tool-event frames, are ignored. It reports
// whether the frame was applied.
func (t *Tracker) HandleFrame(data []byte) bool {
	var f agenttool.Frame
	if json.Unmarshal(data, &f) != nil {
		return false
	}
	return t.Apply(f)
}

// Apply applies an agent-tool-event frame unless a frame with the same
// (parentToolCallId, runId, sequence) was applied before. It reports
// whether the frame was new.
func (t *Tracker) Apply(f agenttool.Frame) bool {
	if f.Type != wire.AgentToolEvent || f.Event.RunID == "" {
		return false
	}
	k := dedupeKey{f.ParentToolCallID, f.Event.RunID, f.Sequence}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.seen[k]; dup {
		return false
	}
	t.seen[k] = struct{}{}
	t.state = ApplyAt(t.state, f, t.now())
	return true
}

// State returns the current state. It is a snapshot: later frames do not
// change it.
func (t *Tracker) State() State {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state
}

// RunsForToolCall returns the runs under a parent tool call, or an empty
// slice.
func (t *Tracker) RunsForToolCall(id string) []*Run { return t.State().RunsForToolCall(id) }

// ResetLocalState forgets every run and every frame seen, so frames sent
// again are applied again (for example after the server cleared its runs).
func (t *Tracker) ResetLocalState() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.state = State{}
	t.seen = map[dedupeKey]struct{}{}
}
