package testenv

import (
	"encoding/json"
	"fmt"

	"github.com/agentry/agentry/wire"
)

// WireFrame is a frame of any type as the tests read it: the type
// (a wire constant) and the fields of the frames they inspect, each
// left zero when the frame has none. Tests decode into it
// (WSClient[WireFrame]) instead of each declaring its own frame struct.
// Fields that carry another package's types (a chat's messages) are
// raw JSON, for the test to decode into that type.
type WireFrame struct {
	// Raw is the frame as received, for a failure's message.
	Raw string `json:"-"`

	// Type is the frame's type.
	Type string `json:"type"`

	// Name and Agent are an identity frame's; State a state frame's.
	Name  string          `json:"name"`
	Agent string          `json:"agent"`
	State json.RawMessage `json:"state"`

	// ID, Success, Result, Done and Error are an RPC response's (Done is
	// nil on a response that is not streamed); ID is also a chat turn's
	// and Error an error frame's text (with its Code) or a failed chat
	// turn's flag.
	ID      string          `json:"id"`
	Success bool            `json:"success"`
	Result  json.RawMessage `json:"result"`
	Done    *bool           `json:"done"`
	Error   ErrorField      `json:"error"`
	Code    string          `json:"code"`

	// Body, Seq, Continuation, Replay, ReplayComplete, MessageIDs and
	// Outcome are a chat response's (wire.ChatResponseFrame); Done and
	// Error too.
	Body           string   `json:"body"`
	Seq            *int     `json:"seq"`
	Continuation   bool     `json:"continuation"`
	Replay         bool     `json:"replay"`
	ReplayComplete bool     `json:"replayComplete"`
	MessageIDs     []string `json:"messageIds"`
	Outcome        string   `json:"outcome"`

	// ProbeID and Reason are a resume frame's (wire.StreamFrame).
	ProbeID string `json:"probeId"`
	Reason  string `json:"reason"`

	// Messages is a chat messages frame's transcript, Connect whether it
	// is the one sent on connect; Message a message-updated frame's
	// message.
	Messages json.RawMessage `json:"messages"`
	Connect  bool            `json:"connect"`
	Message  json.RawMessage `json:"message"`

	// Sequence and Event are an agent-tool event frame's.
	Sequence int64 `json:"sequence"`
	Event    struct {
		Kind  string `json:"kind"`
		RunID string `json:"runId"`
		Body  string `json:"body"`
	} `json:"event"`
}

// UnmarshalJSON decodes the frame and keeps its text in Raw.
func (f *WireFrame) UnmarshalJSON(data []byte) error {
	type fields WireFrame // without this method
	*f = WireFrame{Raw: string(data)}
	return json.Unmarshal(data, (*fields)(f))
}

// IsChatChunk reports whether f is a chunk of a chat turn's stream: a chat
// response with a body that is not its end, an error or the end of a
// replay.
func (f WireFrame) IsChatChunk() bool {
	return f.Type == wire.ChatResponse && !f.Ended() && !f.Failed() && !f.ReplayComplete && f.Body != ""
}

// Ended reports whether the frame says done: true (an RPC response's last
// frame, a chat turn's end).
func (f WireFrame) Ended() bool { return f.Done != nil && *f.Done }

// Failed reports whether a chat response says error: true.
func (f WireFrame) Failed() bool { return f.Error == ErrorFailed }

// ErrorField is a frame's "error": a text (an RPC response's, an error
// frame's), or a chat response's flag, held as ErrorFailed when true and
// "" when false.
type ErrorField string

// ErrorFailed is an ErrorField of "error": true.
const ErrorFailed ErrorField = "true"

// UnmarshalJSON accepts a string, a boolean or null.
func (e *ErrorField) UnmarshalJSON(data []byte) error {
	switch string(data) {
	case "true":
		*e = ErrorFailed
		return nil
	case "false", "null":
		*e = ""
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("error field %s: %w", data, err)
	}
	*e = ErrorField(s)
	return nil
}
