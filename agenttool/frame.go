package agenttool

import (
	"encoding/json"
	"strconv"

	"github.com/agentry/agentry/internal/jsonenc"
)

// encodeFrame returns the JSON of an event frame, byte for byte what
// json.Marshal returns. Chunk events, which are most of a connect replay's
// frames (26 of 28 per run of the benchmark), are written without
// reflection; other events go through json.Marshal.
func encodeFrame(f Frame) ([]byte, error) {
	ev := f.Event
	if ev.Kind != "chunk" || ev.AgentType != "" || len(ev.InputPreview) != 0 || ev.Order != nil ||
		len(ev.Display) != 0 || ev.Summary != nil || ev.Error != "" || ev.Reason != "" || ev.ChildStillRunning != nil {
		return json.Marshal(f)
	}
	b := make([]byte, 0, 96+len(f.Type)+len(f.ParentToolCallID)+len(ev.RunID)+len(ev.Body)+len(ev.Body)/8)
	b = append(b, `{"type":`...)
	b = jsonenc.AppendString(b, f.Type)
	if f.ParentToolCallID != "" {
		b = append(b, `,"parentToolCallId":`...)
		b = jsonenc.AppendString(b, f.ParentToolCallID)
	}
	b = append(b, `,"sequence":`...)
	b = strconv.AppendInt(b, f.Sequence, 10)
	if f.Replay {
		b = append(b, `,"replay":true`...)
	}
	b = append(b, `,"event":{"kind":"chunk","runId":`...)
	b = jsonenc.AppendString(b, ev.RunID)
	if ev.Body != "" {
		b = append(b, `,"body":`...)
		b = jsonenc.AppendString(b, ev.Body)
	}
	return append(b, "}}"...), nil
}
