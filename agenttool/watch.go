package agenttool

import (
	"errors"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
)

// ToolInfo describes the run an AgentTool starts: what another front door
// (the MCP server) needs to start the same run without a chat turn.
type ToolInfo struct {
	// Class is the child's agent class.
	Class string
	// Display is the UI metadata the tool's runs are started with.
	Display Display
	// Tokens caps each run of the tool.
	Tokens TokenBudget
}

type toolInfoKey struct{}

// InfoOf reports whether t was built by AgentTool or
// AgentToolWithOutput, and if so what run it starts.
func InfoOf(t chat.Tool) (ToolInfo, bool) {
	info, ok := t.Meta(toolInfoKey{}).(ToolInfo)
	return info, ok
}

// watcher is one WatchRun subscription.
type watcher struct {
	fn func(Event)
}

// WatchRun calls fn with every live event of run runID of parent, as the
// parent's connected clients get them (started, chunks with progress and
// milestones, the end), from now until stop is called. It sees what this
// process broadcasts: the events of a run the parent dispatches or
// follows here. fn is called with the parent's registry lock held, so it
// must return at once and must not call into agenttool: hand the event to
// a goroutine through a bounded queue. Watch a run before dispatching it
// (with its RunID chosen in advance) so that no event is missed.
func WatchRun(parent agent.Agent, runID string, fn func(Event)) (stop func(), err error) {
	if runID == "" || fn == nil {
		return nil, errors.New("agenttool: WatchRun needs a run id and a function")
	}
	h, err := hostOf(parent)
	if err != nil {
		return nil, err
	}
	w := &watcher{fn: fn}
	h.mu.Lock()
	if h.watchers == nil {
		h.watchers = map[string][]*watcher{}
	}
	h.watchers[runID] = append(h.watchers[runID], w)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		list := h.watchers[runID]
		for i, x := range list {
			if x == w {
				list = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(h.watchers, runID)
		} else {
			h.watchers[runID] = list
		}
	}, nil
}

// ProgressOf returns the progress signal or milestone an event carries: a
// chunk event whose body is the child's progress or milestone data part.
func ProgressOf(ev Event) (ProgressEvent, bool) {
	if ev.Kind != "chunk" {
		return ProgressEvent{}, false
	}
	return progressOf(ev.Body)
}

// notifyWatchers hands ev to the watchers of its run; h.mu is held.
func (h *host) notifyWatchers(ev Event) {
	for _, w := range h.watchers[ev.RunID] {
		w.fn(ev)
	}
}
