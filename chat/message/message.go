// Package message is the AI SDK v6 UI message model in Go: the UIMessage
// and its parts that chat clients store and render, the UIMessageChunk
// stream that builds an assistant message, a Builder that applies chunks
// exactly as the AI SDK client's processUIMessageStream does, and ToModel,
// which turns a UI transcript into the provider-neutral conversation of
// package model.
//
// Every type encodes to the JSON the AI SDK expects and decodes from what
// its clients send. Members this package does not know (from a newer client
// or an application) are kept and written back, so a decode/encode round
// trip loses nothing.
package message

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Role is the author of a UI message.
type Role string

// Roles a UI message may have.
const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// Message is an AI SDK UIMessage.
//
// Its JSON form is {id, role, metadata?, parts}; parts is always present.
type Message struct {
	ID   string `json:"id"`
	Role Role   `json:"role"`
	// Metadata is application data; the server stores finishReason here.
	Metadata json.RawMessage `json:"metadata,omitempty"`
	Parts    []Part          `json:"parts"`

	extra map[string]json.RawMessage
}

func (m *Message) fields() []field {
	return []field{
		{"id", &m.ID},
		{"role", &m.Role},
		{"metadata", &m.Metadata},
		{"parts", &m.Parts},
	}
}

// fieldPtr returns the pointer of key's field (see fields), nil for a key
// of no field: decodeObject finds fields without a slice of them.
func (m *Message) fieldPtr(key []byte) any {
	switch string(key) {
	case "id":
		return &m.ID
	case "role":
		return &m.Role
	case "metadata":
		return &m.Metadata
	case "parts":
		return &m.Parts
	}
	return nil
}

// MarshalJSON encodes m as an AI SDK UIMessage, unknown members included.
func (m Message) MarshalJSON() ([]byte, error) {
	n := 32 + len(m.ID) + len(m.Metadata)
	for i := range m.Parts {
		n += m.Parts[i].sizeHint()
	}
	b, err := m.AppendJSON(make([]byte, 0, n))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// UnmarshalJSON decodes an AI SDK UIMessage, keeping unknown members.
func (m *Message) UnmarshalJSON(data []byte) error {
	*m = Message{}
	extra, err := unmarshalObject(data, m.fieldPtr, m.fields)
	if err != nil {
		return fmt.Errorf("message: %w", err)
	}
	m.extra = extra
	return nil
}

// Clone returns a deep copy of m.
func (m Message) Clone() Message {
	out := m
	out.Metadata = cloneRaw(m.Metadata)
	out.extra = cloneExtra(m.extra)
	if m.Parts != nil {
		out.Parts = make([]Part, len(m.Parts))
		for i, p := range m.Parts {
			out.Parts[i] = p.Clone()
		}
	}
	return out
}

// Part types. Tool parts are "tool-" followed by the tool name, data parts
// "data-" followed by the data name.
const (
	PartText           = "text"
	PartReasoning      = "reasoning"
	PartStepStart      = "step-start"
	PartDynamicTool    = "dynamic-tool"
	PartSourceURL      = "source-url"
	PartSourceDocument = "source-document"
	PartFile           = "file"

	// ToolPartPrefix starts the type of a static tool part.
	ToolPartPrefix = "tool-"
	// DataPartPrefix starts the type of a data part and a data chunk.
	DataPartPrefix = "data-"
)

// States of text and reasoning parts.
const (
	StateStreaming = "streaming"
	StateDone      = "done"
)

// States of tool parts, in lifecycle order.
const (
	StateInputStreaming    = "input-streaming"
	StateInputAvailable    = "input-available"
	StateApprovalRequested = "approval-requested"
	StateApprovalResponded = "approval-responded"
	StateOutputAvailable   = "output-available"
	StateOutputError       = "output-error"
	StateOutputDenied      = "output-denied"
)

// Part is one part of a UI message. A single struct covers every part type;
// Type says which fields apply:
//
//   - "text": Text, State, ProviderMetadata.
//   - "reasoning": ID, Text, State, ProviderMetadata.
//   - "step-start": nothing else.
//   - "tool-{name}" and "dynamic-tool" (which also has DynamicToolName):
//     ToolCallID, State, Input, Output, ErrorText, RawInput, Approval,
//     ProviderExecuted, Preliminary, Title, ToolMetadata,
//     CallProviderMetadata, ResultProviderMetadata.
//   - "source-url": SourceID, URL, Title, ProviderMetadata.
//   - "source-document": SourceID, MediaType, Title, Filename,
//     ProviderMetadata.
//   - "file": URL, MediaType, Filename, ProviderMetadata.
//   - "data-{name}": ID, Data.
//
// Fields left zero are omitted from the JSON form, except those the AI SDK
// requires for the part's type (such as the text of a text part).
type Part struct {
	Type string `json:"type"`
	// ID identifies reasoning and data parts.
	ID string `json:"id,omitempty"`
	// Text is the content of text and reasoning parts.
	Text string `json:"text,omitempty"`
	// DynamicToolName names the tool of a dynamic-tool part (JSON
	// "toolName"); use the ToolName method for any tool part.
	DynamicToolName string `json:"toolName,omitempty"`
	ToolCallID      string `json:"toolCallId,omitempty"`
	// State is StateStreaming or StateDone for text and reasoning, one of
	// the tool states for tool parts.
	State    string          `json:"state,omitempty"`
	Input    json.RawMessage `json:"input,omitempty"`
	Output   json.RawMessage `json:"output,omitempty"`
	RawInput json.RawMessage `json:"rawInput,omitempty"`
	// ErrorText describes the failure of a tool part in StateOutputError.
	ErrorText              string          `json:"errorText,omitempty"`
	Approval               *Approval       `json:"approval,omitempty"`
	ProviderExecuted       *bool           `json:"providerExecuted,omitempty"`
	Preliminary            *bool           `json:"preliminary,omitempty"`
	Title                  string          `json:"title,omitempty"`
	ToolMetadata           json.RawMessage `json:"toolMetadata,omitempty"`
	CallProviderMetadata   json.RawMessage `json:"callProviderMetadata,omitempty"`
	ResultProviderMetadata json.RawMessage `json:"resultProviderMetadata,omitempty"`
	SourceID               string          `json:"sourceId,omitempty"`
	URL                    string          `json:"url,omitempty"`
	MediaType              string          `json:"mediaType,omitempty"`
	Filename               string          `json:"filename,omitempty"`
	Data                   json.RawMessage `json:"data,omitempty"`
	ProviderMetadata       json.RawMessage `json:"providerMetadata,omitempty"`

	extra map[string]json.RawMessage
}

func (p *Part) fields() []field {
	return []field{
		{"type", &p.Type},
		{"id", &p.ID},
		{"text", &p.Text},
		{"toolName", &p.DynamicToolName},
		{"toolCallId", &p.ToolCallID},
		{"state", &p.State},
		{"input", &p.Input},
		{"output", &p.Output},
		{"rawInput", &p.RawInput},
		{"errorText", &p.ErrorText},
		{"approval", &p.Approval},
		{"providerExecuted", &p.ProviderExecuted},
		{"preliminary", &p.Preliminary},
		{"title", &p.Title},
		{"toolMetadata", &p.ToolMetadata},
		{"callProviderMetadata", &p.CallProviderMetadata},
		{"resultProviderMetadata", &p.ResultProviderMetadata},
		{"sourceId", &p.SourceID},
		{"url", &p.URL},
		{"mediaType", &p.MediaType},
		{"filename", &p.Filename},
		{"data", &p.Data},
		{"providerMetadata", &p.ProviderMetadata},
	}
}

// fieldPtr returns the pointer of key's field (see fields), nil for a key
// of no field: decodeObject finds fields without a slice of them.
func (p *Part) fieldPtr(key []byte) any {
	switch string(key) {
	case "type":
		return &p.Type
	case "id":
		return &p.ID
	case "text":
		return &p.Text
	case "toolName":
		return &p.DynamicToolName
	case "toolCallId":
		return &p.ToolCallID
	case "state":
		return &p.State
	case "input":
		return &p.Input
	case "output":
		return &p.Output
	case "rawInput":
		return &p.RawInput
	case "errorText":
		return &p.ErrorText
	case "approval":
		return &p.Approval
	case "providerExecuted":
		return &p.ProviderExecuted
	case "preliminary":
		return &p.Preliminary
	case "title":
		return &p.Title
	case "toolMetadata":
		return &p.ToolMetadata
	case "callProviderMetadata":
		return &p.CallProviderMetadata
	case "resultProviderMetadata":
		return &p.ResultProviderMetadata
	case "sourceId":
		return &p.SourceID
	case "url":
		return &p.URL
	case "mediaType":
		return &p.MediaType
	case "filename":
		return &p.Filename
	case "data":
		return &p.Data
	case "providerMetadata":
		return &p.ProviderMetadata
	}
	return nil
}

// required reports whether key is written even when empty for the part's
// type, because the AI SDK's schema demands it.
func (p *Part) required(key string) bool {
	switch {
	case key == "type":
		return true
	case p.Type == PartText || p.Type == PartReasoning:
		return key == "text"
	case p.IsTool():
		return key == "toolCallId" || key == "state" || (key == "toolName" && p.Type == PartDynamicTool)
	case p.Type == PartSourceURL:
		return key == "sourceId" || key == "url"
	case p.Type == PartSourceDocument:
		return key == "sourceId" || key == "mediaType" || key == "title"
	case p.Type == PartFile:
		return key == "url" || key == "mediaType"
	case p.IsData():
		return key == "data"
	}
	return false
}

// MarshalJSON encodes p as an AI SDK UI message part, unknown members
// included.
func (p Part) MarshalJSON() ([]byte, error) {
	b, err := p.appendJSON(make([]byte, 0, p.sizeHint()))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// sizeHint is about the length of p's encoding, to size a buffer.
func (p *Part) sizeHint() int {
	return 64 + len(p.Type) + len(p.ID) + len(p.Text) + len(p.ToolCallID) + len(p.State) + len(p.Input) + len(p.Output) +
		len(p.RawInput) + len(p.ErrorText) + len(p.Title) + len(p.Data) + len(p.ProviderMetadata) + len(p.URL)
}

// UnmarshalJSON decodes an AI SDK UI message part, keeping unknown members.
func (p *Part) UnmarshalJSON(data []byte) error {
	*p = Part{}
	extra, err := unmarshalObject(data, p.fieldPtr, p.fields)
	if err != nil {
		return fmt.Errorf("part: %w", err)
	}
	p.extra = extra
	return nil
}

// Clone returns a deep copy of p.
func (p Part) Clone() Part {
	out := p
	out.Input = cloneRaw(p.Input)
	out.Output = cloneRaw(p.Output)
	out.RawInput = cloneRaw(p.RawInput)
	out.Approval = p.Approval.clone()
	out.ProviderExecuted = cloneBool(p.ProviderExecuted)
	out.Preliminary = cloneBool(p.Preliminary)
	out.ToolMetadata = cloneRaw(p.ToolMetadata)
	out.CallProviderMetadata = cloneRaw(p.CallProviderMetadata)
	out.ResultProviderMetadata = cloneRaw(p.ResultProviderMetadata)
	out.Data = cloneRaw(p.Data)
	out.ProviderMetadata = cloneRaw(p.ProviderMetadata)
	out.extra = cloneExtra(p.extra)
	return out
}

// IsTool reports whether p is a tool part: "tool-{name}" or "dynamic-tool".
func (p Part) IsTool() bool {
	return p.Type == PartDynamicTool || strings.HasPrefix(p.Type, ToolPartPrefix)
}

// ToolName returns the tool's name: the suffix of a "tool-{name}" type, or
// DynamicToolName for a dynamic-tool part. It is empty for other parts.
func (p Part) ToolName() string {
	if p.Type == PartDynamicTool {
		return p.DynamicToolName
	}
	if name, ok := strings.CutPrefix(p.Type, ToolPartPrefix); ok {
		return name
	}
	return ""
}

// IsDynamicTool reports whether p is a "dynamic-tool" part.
func (p Part) IsDynamicTool() bool { return p.Type == PartDynamicTool }

// IsData reports whether p is a "data-{name}" part.
func (p Part) IsData() bool { return strings.HasPrefix(p.Type, DataPartPrefix) }

// Approval is the approval record of a tool part that needed the user's
// consent. Unknown members are kept.
type Approval struct {
	ID string `json:"id"`
	// Approved is nil until the user answers.
	Approved *bool  `json:"approved,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Descriptor and Signature are copied from the tool-approval-request
	// chunk's approvalDescriptor and signature.
	Descriptor json.RawMessage `json:"descriptor,omitempty"`
	Signature  json.RawMessage `json:"signature,omitempty"`

	extra map[string]json.RawMessage
}

func (a *Approval) fields() []field {
	return []field{
		{"id", &a.ID},
		{"approved", &a.Approved},
		{"reason", &a.Reason},
		{"descriptor", &a.Descriptor},
		{"signature", &a.Signature},
	}
}

// fieldPtr returns the pointer of key's field (see fields), nil for a key
// of no field: decodeObject finds fields without a slice of them.
func (a *Approval) fieldPtr(key []byte) any {
	switch string(key) {
	case "id":
		return &a.ID
	case "approved":
		return &a.Approved
	case "reason":
		return &a.Reason
	case "descriptor":
		return &a.Descriptor
	case "signature":
		return &a.Signature
	}
	return nil
}

// MarshalJSON encodes a, unknown members included.
func (a Approval) MarshalJSON() ([]byte, error) {
	b, err := a.appendJSON(make([]byte, 0, 64+len(a.ID)+len(a.Reason)+len(a.Descriptor)+len(a.Signature)))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// UnmarshalJSON decodes an approval, keeping unknown members.
func (a *Approval) UnmarshalJSON(data []byte) error {
	*a = Approval{}
	extra, err := unmarshalObject(data, a.fieldPtr, a.fields)
	if err != nil {
		return fmt.Errorf("approval: %w", err)
	}
	a.extra = extra
	return nil
}

func (a *Approval) clone() *Approval {
	if a == nil {
		return nil
	}
	out := *a
	out.Approved = cloneBool(a.Approved)
	out.Descriptor = cloneRaw(a.Descriptor)
	out.Signature = cloneRaw(a.Signature)
	out.extra = cloneExtra(a.extra)
	return &out
}

// InterruptedMetadata is the provider metadata that marks a part a restart
// cut short (a text or reasoning part, a tool call whose input was
// streaming). Recovery closes such a part with it
// (in the part's end chunk, so clients get the same mark); the part stays
// in the message for the people who saw it, and is left out of what the
// model is shown and of the message's text.
var InterruptedMetadata = json.RawMessage(`{"agentry":{"interrupted":true}}`)

// ContinuedMetadata is the provider metadata of a text or reasoning part a
// restart cut short and that the turn's model went on with (a
// model.Continuer): it stays part of the answer, and the next part of the
// message holds the rest of it. Clients get the mark in the part's end
// chunk, as with InterruptedMetadata.
var ContinuedMetadata = json.RawMessage(`{"agentry":{"interrupted":true,"continued":true}}`)

// Interrupted reports whether the part was cut short by a restart and left
// out of the answer (see InterruptedMetadata): a text or reasoning part,
// or a tool call whose input was still streaming. A part marked with
// ContinuedMetadata is not: its answer goes on in the next part.
func (p Part) Interrupted() bool {
	marked := func(meta json.RawMessage) bool {
		if len(meta) == 0 {
			return false
		}
		var m struct {
			Agentry struct {
				Interrupted bool `json:"interrupted"`
				Continued   bool `json:"continued"`
			} `json:"agentry"`
		}
		return json.Unmarshal(meta, &m) == nil && m.Agentry.Interrupted && !m.Agentry.Continued
	}
	switch {
	case p.IsTool():
		return marked(p.ResultProviderMetadata) || marked(p.CallProviderMetadata)
	case p.Type == PartText || p.Type == PartReasoning:
		return marked(p.ProviderMetadata)
	}
	return false
}

// InterruptedStepName is the name of the data part ("data-agentry-interrupted")
// that recovery writes into a step a restart cut short, before the step's
// end. The step stays in the message for the people who saw it; the model
// is not shown it and it is not part of the message's text (Visible).
const InterruptedStepName = "agentry-interrupted"

// ContinuedStepName is the name of the data part ("data-agentry-continued")
// that recovery writes into a step a restart cut short and that the model
// goes on with in the next step (see ContinuedMetadata). The step stays
// part of the answer; with the step that continues it, it is one model
// step.
const ContinuedStepName = "agentry-continued"

// Visible returns the parts of an assistant message that count as its
// answer: without the parts a restart cut short (Interrupted) and without
// every part of a step marked with an InterruptedStepName data part. It is
// what the model is shown and what the message's text is made of.
func Visible(parts []Part) []Part {
	marker := DataPartPrefix + InterruptedStepName
	out := make([]Part, 0, len(parts))
	step := -1 // index in out of the current step's step-start part
	for _, p := range parts {
		switch {
		case p.Type == PartStepStart:
			step = len(out)
			out = append(out, p)
		case p.Type == marker:
			if step >= 0 {
				out = out[:step]
				step = -1
			}
		case p.Interrupted():
		default:
			out = append(out, p)
		}
	}
	return out
}
