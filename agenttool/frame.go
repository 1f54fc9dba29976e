package agenttool

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/agentry/agentry/jsonenc"
)

// encodeFrame returns the JSON of an event frame, byte for byte what
// json.Marshal returns, without reflection: a connect replay encodes one
// frame per stored chunk and two more per run (started and the terminal
// event). Only a non-empty Display (a map of any values) goes through
// json.Marshal.
func encodeFrame(f Frame) ([]byte, error) {
	ev := f.Event
	b := make([]byte, 0, 112+len(f.Type)+len(f.ParentToolCallID)+len(ev.RunID)+len(ev.AgentType)+
		len(ev.InputPreview)+len(ev.Body)+len(ev.Body)/8+len(ev.Error)+len(ev.Reason))
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
	b = append(b, `,"event":{"kind":`...)
	b = jsonenc.AppendString(b, ev.Kind)
	b = append(b, `,"runId":`...)
	b = jsonenc.AppendString(b, ev.RunID)
	if ev.AgentType != "" {
		b = append(b, `,"agentType":`...)
		b = jsonenc.AppendString(b, ev.AgentType)
	}
	if len(ev.InputPreview) != 0 {
		b = append(b, `,"inputPreview":`...)
		var err error
		if b, err = jsonenc.AppendRaw(b, ev.InputPreview); err != nil {
			return nil, fmt.Errorf("agenttool: encode inputPreview: %w", err)
		}
	}
	if ev.Order != nil {
		b = append(b, `,"order":`...)
		b = strconv.AppendInt(b, int64(*ev.Order), 10)
	}
	if len(ev.Display) != 0 {
		d, err := json.Marshal(ev.Display)
		if err != nil {
			return nil, fmt.Errorf("agenttool: encode display: %w", err)
		}
		b = append(b, `,"display":`...)
		b = append(b, d...)
	}
	if ev.Body != "" {
		b = append(b, `,"body":`...)
		b = jsonenc.AppendString(b, ev.Body)
	}
	if ev.Summary != nil {
		b = append(b, `,"summary":`...)
		b = jsonenc.AppendString(b, *ev.Summary)
	}
	if ev.Error != "" {
		b = append(b, `,"error":`...)
		b = jsonenc.AppendString(b, ev.Error)
	}
	if ev.Reason != "" {
		b = append(b, `,"reason":`...)
		b = jsonenc.AppendString(b, ev.Reason)
	}
	if ev.ChildStillRunning != nil {
		b = append(b, `,"childStillRunning":`...)
		b = strconv.AppendBool(b, *ev.ChildStillRunning)
	}
	return append(b, "}}"...), nil
}
