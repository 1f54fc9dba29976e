package agenttool

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
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
	b = appendJSONString(b, f.Type)
	if f.ParentToolCallID != "" {
		b = append(b, `,"parentToolCallId":`...)
		b = appendJSONString(b, f.ParentToolCallID)
	}
	b = append(b, `,"sequence":`...)
	b = strconv.AppendInt(b, f.Sequence, 10)
	if f.Replay {
		b = append(b, `,"replay":true`...)
	}
	b = append(b, `,"event":{"kind":"chunk","runId":`...)
	b = appendJSONString(b, ev.RunID)
	if ev.Body != "" {
		b = append(b, `,"body":`...)
		b = appendJSONString(b, ev.Body)
	}
	return append(b, "}}"...), nil
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string with encoding/json's
// escaping: HTML-safe (<, >, & as \u003c …), U+2028 and U+2029 escaped,
// invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
