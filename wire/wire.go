// Package wire is the vocabulary of Agentry's WebSocket protocol in one
// place: the type names of the frames (the Cloudflare Agents protocol's,
// the AI SDK chat protocol's as the Cloudflare chat agents speak it,
// the agent-tool events, and Agentry's own) and the shapes of the frames
// whose fields are plain JSON. The server (agent, chat, agenttool), the Go
// client (client), the terminal client (cmd/agentry) and the tests all
// name frames through it, so a name is written down once.
//
// Frames that carry another package's types (a chat's messages, an
// agent-tool event) have their shapes in that package: chat/message for
// messages, agenttool.Frame for agent-tool events. The package is at the
// bottom of the house: it imports nothing of Agentry, so every floor may
// use it. spec/wire-protocol.md describes the protocol.
package wire

import "encoding/json"

// Frame types of the agent runtime (the Cloudflare Agents protocol).
const (
	// Identity is the first frame of a connection: the agent's name and
	// class.
	Identity = "cf_agent_identity"
	// State carries the agent's synced state, both ways.
	State = "cf_agent_state"
	// StateError refuses a client's state update.
	StateError = "cf_agent_state_error"
	// MCPServers lists the agent's MCP servers (always empty here).
	MCPServers = "cf_agent_mcp_servers"
	// RPC is a callable method's request and its response(s).
	RPC = "rpc"
	// Error is Agentry's own frame for a client frame that could not be
	// handled (malformed JSON, unknown type, too large). The npm clients
	// ignore it; it is there for people and tests reading the wire.
	Error = "agentry_error"
)

// Frame types of the chat protocol.
const (
	// ChatRequest submits a turn (the AI SDK's request body in init).
	ChatRequest = "cf_agent_use_chat_request"
	// ChatResponse is a chunk of a turn's stream, or its end (done).
	ChatResponse = "cf_agent_use_chat_response"
	// ChatMessages carries the whole transcript.
	ChatMessages = "cf_agent_chat_messages"
	// ChatClear clears the transcript, both ways.
	ChatClear = "cf_agent_chat_clear"
	// ChatCancel asks to stop a turn.
	ChatCancel = "cf_agent_chat_request_cancel"
	// StreamResumeRequest asks whether a turn streams (a probe).
	StreamResumeRequest = "cf_agent_stream_resume_request"
	// StreamResumeAck accepts an offered stream: its replay follows.
	StreamResumeAck = "cf_agent_stream_resume_ack"
	// StreamResuming offers a streaming turn to a client.
	StreamResuming = "cf_agent_stream_resuming"
	// StreamResumeNone answers a probe: nothing streams.
	StreamResumeNone = "cf_agent_stream_resume_none"
	// StreamPending answers a probe: a turn is queued, its offer follows.
	StreamPending = "cf_agent_stream_pending"
	// ToolResult is a client's result of a client-side tool call.
	ToolResult = "cf_agent_tool_result"
	// ToolApproval is a client's answer to a tool call awaiting approval.
	ToolApproval = "cf_agent_tool_approval"
	// MessageUpdated carries one changed message of the transcript.
	MessageUpdated = "cf_agent_message_updated"
)

// Frame types of agent tools (agenttool).
const (
	// AgentToolEvent is an event of an agent-tool run (agenttool.Frame).
	AgentToolEvent = "agent-tool-event"
	// AgentToolApproval answers an approval a child run waits for.
	AgentToolApproval = "agent_tool_approval"
	// AgentToolResult gives a client-side tool result a child run waits
	// for.
	AgentToolResult = "agent_tool_result"
)

// IdentityFrame is an Identity frame.
type IdentityFrame struct {
	Type         string `json:"type"`
	Name         string `json:"name"`
	Agent        string `json:"agent"`
	StateFollows bool   `json:"stateFollows,omitempty"`
}

// StateFrame is a State frame.
type StateFrame struct {
	Type  string          `json:"type"`
	State json.RawMessage `json:"state"`
}

// StateErrorFrame is a StateError frame.
type StateErrorFrame struct {
	Type  string `json:"type"`
	Error string `json:"error"`
}

// ErrorFrame is an Error frame: a code and a message.
type ErrorFrame struct {
	Type  string `json:"type"`
	Code  string `json:"code"`
	Error string `json:"error"`
}

// ChatResponseFrame is a ChatResponse frame: a chunk of a turn's stream
// (Body, numbered by Seq once committed), or the turn's end (Done, with
// its Outcome; Error marks a failed turn's error text).
type ChatResponseFrame struct {
	Type           string   `json:"type"`
	ID             string   `json:"id"`
	Body           string   `json:"body"`
	Done           bool     `json:"done"`
	Error          bool     `json:"error,omitempty"`
	Continuation   bool     `json:"continuation,omitempty"`
	Replay         bool     `json:"replay,omitempty"`
	ReplayComplete bool     `json:"replayComplete,omitempty"`
	Seq            *int     `json:"seq,omitempty"`
	MessageIDs     []string `json:"messageIds,omitempty"`
	Outcome        string   `json:"outcome,omitempty"`
}

// StreamFrame is one of the resume frames (StreamResumeRequest,
// StreamResumeAck, StreamResuming, StreamResumeNone, StreamPending): the
// turn (ID) and the probe it answers (ProbeID).
type StreamFrame struct {
	Type    string `json:"type"`
	ID      string `json:"id,omitempty"`
	ProbeID string `json:"probeId,omitempty"`
	Reason  string `json:"reason,omitempty"`
}
