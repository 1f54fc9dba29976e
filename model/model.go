// Package model defines the provider-neutral language model interface that
// chat agents drive, and the request, message and stream event types that
// cross it. Providers live in subpackages: openai (any OpenAI-compatible
// endpoint), anthropic, and scripted (a deterministic model for tests and
// offline demos).
package model

import (
	"context"
	"encoding/json"
	"iter"
)

// Model is a streaming language model.
//
// Stream starts one completion for req and yields its events in order. The
// sequence ends after an EventFinish, or with a non-nil error (the event is
// then zero). Implementations retry transient provider failures (HTTP 429
// and 5xx) with backoff before the first event is yielded; an error after
// events were yielded is returned as is. Breaking out of the loop cancels the
// underlying request.
type Model interface {
	Stream(ctx context.Context, req *Request) iter.Seq2[Event, error]
}

// Namer is implemented by models that know their model id ("gpt-4o-mini");
// chat turns record it in the assistant message's metadata.
type Namer interface {
	ModelName() string
}

// Continuer is implemented by models that go on with an answer a restart
// cut short instead of starting it over. When a chat turn is cut in the
// middle of its answer text (no tool call of the step was cut), recovery
// shows such a model the cut text as it was stored: the request ends with
// an assistant message holding it, and the model's reply is what follows
// it (ContinuesAnswers true). Other models are not shown the cut text and
// answer anew after it. An Anthropic-style provider could implement it by
// prefilling; providers that cannot continue a partial answer should not.
type Continuer interface {
	ContinuesAnswers() bool
}

// Request is one completion request.
type Request struct {
	// System is the system prompt; empty means none.
	System string
	// Messages is the conversation so far, oldest first.
	Messages []Message
	// Tools the model may call.
	Tools []ToolSpec
	// MaxTokens caps the output; zero means the provider default.
	MaxTokens int
}

// Role is the author of a Message.
type Role string

// Roles a Message may have.
const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	// RoleTool carries tool results answering the previous assistant
	// message's tool calls.
	RoleTool Role = "tool"
)

// Message is one turn of the conversation in provider-neutral form.
type Message struct {
	Role    Role
	Content []Content
}

// ContentKind says which fields of a Content are set.
type ContentKind string

// Kinds of Content.
const (
	ContentText       ContentKind = "text"
	ContentReasoning  ContentKind = "reasoning"
	ContentToolCall   ContentKind = "tool-call"
	ContentToolResult ContentKind = "tool-result"
	// ContentFile is a file the user attached: an image or a document
	// such as a PDF, in a user message.
	ContentFile ContentKind = "file"
)

// Content is one piece of a Message.
type Content struct {
	Kind ContentKind
	// Text is set for ContentText and ContentReasoning.
	Text string
	// ToolCallID links a ContentToolCall to its ContentToolResult.
	ToolCallID string
	// ToolName is set for tool calls and results.
	ToolName string
	// Input is the JSON arguments of a ContentToolCall.
	Input json.RawMessage
	// Output is the JSON result of a ContentToolResult.
	Output json.RawMessage
	// IsError marks a ContentToolResult that reports a failure.
	IsError bool
	// MediaType is the IANA media type of a ContentFile, such as
	// "image/png" or "application/pdf".
	MediaType string
	// Data holds the bytes of a ContentFile given inline.
	Data []byte
	// URL locates a ContentFile the provider fetches itself (an http or
	// https URL); it is empty when Data holds the file.
	URL string
	// Filename is the file's name, if the user gave one.
	Filename string
}

// Text returns a text Content.
func Text(s string) Content { return Content{Kind: ContentText, Text: s} }

// File returns a ContentFile holding data of mediaType.
func File(mediaType string, data []byte) Content {
	return Content{Kind: ContentFile, MediaType: mediaType, Data: data}
}

// RequestError reports a request that a provider will not send as it is,
// for a reason the user can fix: a file larger than the provider's limit,
// or of a type it does not take. Its message is meant for the user (chat
// turns show it as their error).
type RequestError struct {
	// Message says what is wrong and what the limit is.
	Message string
}

func (e *RequestError) Error() string { return e.Message }

// ToolSpec describes a tool offered to the model.
type ToolSpec struct {
	Name        string
	Description string
	// InputSchema is the JSON Schema of the tool's input object.
	InputSchema json.RawMessage
}

// EventKind says which fields of an Event are set.
type EventKind string

// Kinds of Event, in the order a stream may produce them.
const (
	// EventTextDelta carries Text, a piece of the answer.
	EventTextDelta EventKind = "text-delta"
	// EventReasoningDelta carries Text, a piece of visible reasoning.
	EventReasoningDelta EventKind = "reasoning-delta"
	// EventToolCallStart opens a tool call: ToolCallID and ToolName.
	EventToolCallStart EventKind = "tool-call-start"
	// EventToolCallDelta carries InputDelta, a piece of the JSON arguments
	// of the call ToolCallID.
	EventToolCallDelta EventKind = "tool-call-delta"
	// EventToolCall closes a tool call: ToolCallID, ToolName and the whole
	// Input. Providers always send it, even when they sent no start or
	// deltas.
	EventToolCall EventKind = "tool-call"
	// EventFinish ends the stream: FinishReason and Usage.
	EventFinish EventKind = "finish"
)

// Finish reasons, in the AI SDK's vocabulary.
const (
	FinishStop          = "stop"
	FinishLength        = "length"
	FinishToolCalls     = "tool-calls"
	FinishContentFilter = "content-filter"
	FinishError         = "error"
	FinishOther         = "other"
)

// Event is one item of a model stream.
type Event struct {
	Kind         EventKind
	Text         string
	ToolCallID   string
	ToolName     string
	InputDelta   string
	Input        json.RawMessage
	FinishReason string
	Usage        Usage
}

// Usage counts tokens of one completion.
type Usage struct {
	InputTokens  int
	OutputTokens int
}
