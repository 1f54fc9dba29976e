package testenv

import "encoding/json"

// WireFrame is a frame of any type as the tests read it: the type
// (a wire constant) and the fields of the frames they inspect, each
// left zero when the frame has none. Tests decode into it
// (WSClient[WireFrame]) instead of each declaring its own frame struct.
// A chat response's "error": true does not fit Error (a string, as in
// RPC responses and error frames): decode such frames into
// wire.ChatResponseFrame.
type WireFrame struct {
	// Type is the frame's type.
	Type string `json:"type"`

	// Name and Agent are an identity frame's; State a state frame's.
	Name  string          `json:"name"`
	Agent string          `json:"agent"`
	State json.RawMessage `json:"state"`

	// ID, Success, Result, Done and Error are an RPC response's (Done is
	// nil on a response that is not streamed); ID is also a chat turn's
	// and Error an error frame's text.
	ID      string          `json:"id"`
	Success bool            `json:"success"`
	Result  json.RawMessage `json:"result"`
	Done    *bool           `json:"done"`
	Error   string          `json:"error"`

	// Messages is a chat messages frame's transcript.
	Messages json.RawMessage `json:"messages"`

	// Sequence and Event are an agent-tool event frame's.
	Sequence int64 `json:"sequence"`
	Event    struct {
		Kind  string `json:"kind"`
		RunID string `json:"runId"`
		Body  string `json:"body"`
	} `json:"event"`
}
