package soakcrash

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/agentry/agentry/wire"
)

// This file is a Go port of the client side the soak test plays: the
// replica of useAgentToolEvents in test/npm/tool-events.mjs, which is the
// npm package's own agentToolEventDedupeKey and applyAgentToolEvent
// (agents@0.32.0, dist/agent-tools-*.js) behind a message listener. Only
// what decides a run's status and text is ported:
//
//   - the listener ignores frames that are not JSON agent-tool-event
//     frames;
//   - a seen set, kept for the hook's lifetime (here: across every
//     reconnection of one tab), drops a frame whose dedupe key was seen:
//     [parentToolCallId ?? "", runId, identity].join("\0"), identity being
//     "seq:<sequence>" for ordinary chunks, "event:<JSON of the event>" for
//     lifecycle events, "milestone:<n>", "progress:<id>" or
//     "unstored:<id>" for the reserved ones;
//   - applyToRun: a started event creates the run (and does not touch one
//     that has a terminal status), a chunk of an unknown run is dropped, a
//     chunk whose body is not JSON changes nothing, terminal events set the
//     status;
//   - applyChunkToParts for text: text-start pushes a text part, text-delta
//     appends to the last text part (pushing one when there is none),
//     text-end closes it. Other chunk types never change a text part, so
//     they are not modelled.
//
// The run's text is textOf(parts) of test/npm/agent-tools.mjs: the text
// parts concatenated. JSON.stringify of the event is approximated by the
// compacted bytes the server sent (the server is Go: one encoding per
// event value). TestSoak cross-checks this port against the node replica
// when node and test/npm/node_modules are present.

// toolEvents is the state of one useAgentToolEvents hook.
type toolEvents struct {
	seen map[string]bool
	runs map[string]*runView
}

// runView is what the reducer keeps of a run.
type runView struct {
	RunID            string
	ParentToolCallID string
	Status           string // running, completed, error, aborted, interrupted
	Summary, Error   string
	texts            []string // the text parts, in order
}

// Text is the run's text: its text parts concatenated.
func (r *runView) Text() string { return strings.Join(r.texts, "") }

func newToolEvents() *toolEvents {
	return &toolEvents{seen: map[string]bool{}, runs: map[string]*runView{}}
}

// toolFrame is an agent-tool-event frame as the client parses it.
type toolFrame struct {
	Type             string          `json:"type"`
	ParentToolCallID *string         `json:"parentToolCallId"`
	Sequence         json.Number     `json:"sequence"`
	Replay           bool            `json:"replay"`
	Event            json.RawMessage `json:"event"`
}

// toolEvent is the event of a frame.
type toolEvent struct {
	Kind       string  `json:"kind"`
	RunID      string  `json:"runId"`
	Body       *string `json:"body"`
	UnstoredID *string `json:"unstoredId"`
	Summary    string  `json:"summary"`
	Error      string  `json:"error"`
	Reason     string  `json:"reason"`
}

// parseToolFrame parses an agent-tool-event frame; ok is false for any
// other data, which the listener ignores.
func parseToolFrame(data []byte) (f toolFrame, ev toolEvent, ok bool) {
	if json.Unmarshal(data, &f) != nil || f.Type != wire.AgentToolEvent || json.Unmarshal(f.Event, &ev) != nil {
		return f, ev, false
	}
	return f, ev, true
}

// dedupeKey is agentToolEventDedupeKey.
func dedupeKey(f toolFrame, ev toolEvent) string {
	var identity string
	switch {
	case ev.Kind != "chunk":
		identity = "event:" + compact(f.Event)
	case ev.UnstoredID != nil:
		identity = "unstored:" + *ev.UnstoredID
	default:
		body := ""
		if ev.Body != nil {
			body = *ev.Body
		}
		identity = "seq:" + f.Sequence.String()
		if strings.Contains(body, "data-agent-milestone") || strings.Contains(body, "data-agent-progress") {
			var parsed struct {
				Type string `json:"type"`
				ID   any    `json:"id"`
				Data struct {
					Name     any `json:"name"`
					Sequence any `json:"sequence"`
				} `json:"data"`
			}
			if json.Unmarshal([]byte(body), &parsed) == nil {
				_, named := parsed.Data.Name.(string)
				switch {
				case parsed.Type == "data-agent-milestone" && named:
					n, _ := parsed.Data.Sequence.(float64)
					identity = "milestone:" + strconv.FormatFloat(n, 'f', -1, 64)
				case parsed.Type == "data-agent-progress":
					if id, ok := parsed.ID.(string); ok {
						identity = "progress:" + id
					} else {
						identity = "progress:" + f.Sequence.String() + ":" + body
					}
				}
			}
		}
	}
	ptc := ""
	if f.ParentToolCallID != nil {
		ptc = *f.ParentToolCallID
	}
	return ptc + "\x00" + ev.RunID + "\x00" + identity
}

func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

// apply is the message listener: it dedupes and reduces one frame, and
// reports whether the frame was an agent-tool event that was applied (not a
// duplicate).
func (s *toolEvents) apply(data []byte) bool {
	f, ev, ok := parseToolFrame(data)
	if !ok {
		return false
	}
	key := dedupeKey(f, ev)
	if s.seen[key] {
		return false
	}
	s.seen[key] = true
	r := s.runs[ev.RunID]
	switch ev.Kind {
	case "started":
		if r == nil {
			r = &runView{RunID: ev.RunID}
			s.runs[ev.RunID] = r
		}
		if terminal(r.Status) {
			return true
		}
		r.Status = "running"
		if f.ParentToolCallID != nil {
			r.ParentToolCallID = *f.ParentToolCallID
		} else {
			r.ParentToolCallID = ""
		}
	case "chunk":
		if r == nil || ev.Body == nil {
			return true
		}
		var ch struct {
			Type  string  `json:"type"`
			Delta *string `json:"delta"`
		}
		if json.Unmarshal([]byte(*ev.Body), &ch) != nil {
			return true
		}
		delta := ""
		if ch.Delta != nil {
			delta = *ch.Delta
		}
		switch ch.Type {
		case "text-start":
			r.texts = append(r.texts, "")
		case "text-delta":
			if n := len(r.texts); n > 0 {
				r.texts[n-1] += delta
			} else {
				r.texts = append(r.texts, delta)
			}
		}
	case "finished":
		if r != nil {
			r.Status, r.Summary, r.Error = "completed", ev.Summary, ""
		}
	case "error":
		if r != nil {
			r.Status, r.Error = "error", ev.Error
		}
	case "aborted":
		if r != nil {
			r.Status, r.Error = "aborted", ev.Reason
		}
	case "interrupted":
		if r != nil {
			r.Status, r.Error = "interrupted", ev.Error
		}
	}
	return true
}

// terminal reports whether a reducer status is terminal.
func terminal(status string) bool {
	switch status {
	case "completed", "error", "aborted", "interrupted":
		return true
	}
	return false
}

// hard reports whether a reducer status is a terminal no later event
// replaces (interrupted is soft: a re-attached run ends later).
func hard(status string) bool {
	return status == "completed" || status == "error" || status == "aborted"
}
