package message

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agentry/agentry/jsonenc"
)

// Chunk types of the UI message stream. Data chunks are "data-" followed by
// the data name (see DataPartPrefix).
const (
	ChunkStart               = "start"
	ChunkFinish              = "finish"
	ChunkAbort               = "abort"
	ChunkMessageMetadata     = "message-metadata"
	ChunkStartStep           = "start-step"
	ChunkFinishStep          = "finish-step"
	ChunkTextStart           = "text-start"
	ChunkTextDelta           = "text-delta"
	ChunkTextEnd             = "text-end"
	ChunkReasoningStart      = "reasoning-start"
	ChunkReasoningDelta      = "reasoning-delta"
	ChunkReasoningEnd        = "reasoning-end"
	ChunkToolInputStart      = "tool-input-start"
	ChunkToolInputDelta      = "tool-input-delta"
	ChunkToolInputAvailable  = "tool-input-available"
	ChunkToolInputError      = "tool-input-error"
	ChunkToolApprovalRequest = "tool-approval-request"
	ChunkToolOutputAvailable = "tool-output-available"
	ChunkToolOutputError     = "tool-output-error"
	ChunkToolOutputDenied    = "tool-output-denied"
	ChunkSourceURL           = "source-url"
	ChunkSourceDocument      = "source-document"
	ChunkFile                = "file"
	ChunkError               = "error"
)

// Chunk is one AI SDK UIMessageChunk. A single struct covers every chunk
// type; Type says which fields apply (see the wire protocol notes, §2.4):
//
//   - "start": MessageID, MessageMetadata.
//   - "finish": FinishReason, MessageMetadata.
//   - "abort": Reason.
//   - "message-metadata": MessageMetadata.
//   - "start-step", "finish-step": nothing else.
//   - "text-*" and "reasoning-*": ID, Delta (deltas only), ProviderMetadata.
//   - "tool-input-start": ToolCallID, ToolName, InputEncoding,
//     ProviderExecuted, ProviderMetadata, ToolMetadata, Dynamic, Title.
//   - "tool-input-delta": ToolCallID, InputTextDelta.
//   - "tool-input-available": as tool-input-start without InputEncoding,
//     plus Input.
//   - "tool-input-error": as tool-input-available plus ErrorText.
//   - "tool-approval-request": ApprovalID, ToolCallID, ApprovalDescriptor,
//     InputSchemaInput, Signature.
//   - "tool-output-available": ToolCallID, Output, ProviderExecuted,
//     ProviderMetadata, ToolMetadata, Dynamic, Preliminary.
//   - "tool-output-error": ToolCallID, ErrorText, ProviderExecuted,
//     ProviderMetadata, ToolMetadata, Dynamic.
//   - "tool-output-denied": ToolCallID.
//   - "source-url": SourceID, URL, Title, ProviderMetadata.
//   - "source-document": SourceID, MediaType, Title, Filename,
//     ProviderMetadata.
//   - "file": URL, MediaType, ProviderMetadata.
//   - "data-{name}": ID, Data, Transient.
//   - "error": ErrorText.
//
// Fields left zero are omitted from the JSON form, except those the AI SDK
// requires for the chunk's type. Unknown members are kept.
type Chunk struct {
	Type               string          `json:"type"`
	MessageID          string          `json:"messageId,omitempty"`
	ID                 string          `json:"id,omitempty"`
	Delta              string          `json:"delta,omitempty"`
	ApprovalID         string          `json:"approvalId,omitempty"`
	ToolCallID         string          `json:"toolCallId,omitempty"`
	ToolName           string          `json:"toolName,omitempty"`
	InputTextDelta     string          `json:"inputTextDelta,omitempty"`
	InputEncoding      string          `json:"inputEncoding,omitempty"`
	Input              json.RawMessage `json:"input,omitempty"`
	Output             json.RawMessage `json:"output,omitempty"`
	ErrorText          string          `json:"errorText,omitempty"`
	ApprovalDescriptor json.RawMessage `json:"approvalDescriptor,omitempty"`
	InputSchemaInput   json.RawMessage `json:"inputSchemaInput,omitempty"`
	Signature          json.RawMessage `json:"signature,omitempty"`
	ProviderExecuted   *bool           `json:"providerExecuted,omitempty"`
	Dynamic            *bool           `json:"dynamic,omitempty"`
	Preliminary        *bool           `json:"preliminary,omitempty"`
	SourceID           string          `json:"sourceId,omitempty"`
	URL                string          `json:"url,omitempty"`
	MediaType          string          `json:"mediaType,omitempty"`
	Title              string          `json:"title,omitempty"`
	ToolMetadata       json.RawMessage `json:"toolMetadata,omitempty"`
	Filename           string          `json:"filename,omitempty"`
	Data               json.RawMessage `json:"data,omitempty"`
	Transient          *bool           `json:"transient,omitempty"`
	FinishReason       string          `json:"finishReason,omitempty"`
	Reason             string          `json:"reason,omitempty"`
	MessageMetadata    json.RawMessage `json:"messageMetadata,omitempty"`
	ProviderMetadata   json.RawMessage `json:"providerMetadata,omitempty"`

	extra map[string]json.RawMessage
}

func (c *Chunk) fields() []field {
	return []field{
		{"type", &c.Type},
		{"messageId", &c.MessageID},
		{"id", &c.ID},
		{"delta", &c.Delta},
		{"approvalId", &c.ApprovalID},
		{"toolCallId", &c.ToolCallID},
		{"toolName", &c.ToolName},
		{"inputTextDelta", &c.InputTextDelta},
		{"inputEncoding", &c.InputEncoding},
		{"input", &c.Input},
		{"output", &c.Output},
		{"errorText", &c.ErrorText},
		{"approvalDescriptor", &c.ApprovalDescriptor},
		{"inputSchemaInput", &c.InputSchemaInput},
		{"signature", &c.Signature},
		{"providerExecuted", &c.ProviderExecuted},
		{"dynamic", &c.Dynamic},
		{"preliminary", &c.Preliminary},
		{"sourceId", &c.SourceID},
		{"url", &c.URL},
		{"mediaType", &c.MediaType},
		{"title", &c.Title},
		{"toolMetadata", &c.ToolMetadata},
		{"filename", &c.Filename},
		{"data", &c.Data},
		{"transient", &c.Transient},
		{"finishReason", &c.FinishReason},
		{"reason", &c.Reason},
		{"messageMetadata", &c.MessageMetadata},
		{"providerMetadata", &c.ProviderMetadata},
	}
}

// fieldPtr returns the pointer of key's field (see fields), nil for a key
// of no field: decodeObject finds fields without a slice of them.
func (c *Chunk) fieldPtr(key []byte) any {
	switch string(key) {
	case "type":
		return &c.Type
	case "messageId":
		return &c.MessageID
	case "id":
		return &c.ID
	case "delta":
		return &c.Delta
	case "approvalId":
		return &c.ApprovalID
	case "toolCallId":
		return &c.ToolCallID
	case "toolName":
		return &c.ToolName
	case "inputTextDelta":
		return &c.InputTextDelta
	case "inputEncoding":
		return &c.InputEncoding
	case "input":
		return &c.Input
	case "output":
		return &c.Output
	case "errorText":
		return &c.ErrorText
	case "approvalDescriptor":
		return &c.ApprovalDescriptor
	case "inputSchemaInput":
		return &c.InputSchemaInput
	case "signature":
		return &c.Signature
	case "providerExecuted":
		return &c.ProviderExecuted
	case "dynamic":
		return &c.Dynamic
	case "preliminary":
		return &c.Preliminary
	case "sourceId":
		return &c.SourceID
	case "url":
		return &c.URL
	case "mediaType":
		return &c.MediaType
	case "title":
		return &c.Title
	case "toolMetadata":
		return &c.ToolMetadata
	case "filename":
		return &c.Filename
	case "data":
		return &c.Data
	case "transient":
		return &c.Transient
	case "finishReason":
		return &c.FinishReason
	case "reason":
		return &c.Reason
	case "messageMetadata":
		return &c.MessageMetadata
	case "providerMetadata":
		return &c.ProviderMetadata
	}
	return nil
}

// required reports whether key is written even when empty for the chunk's
// type, because the AI SDK's schema demands it.
func (c *Chunk) required(key string) bool { return chunkRequired(c.Type, key) }

// chunkRequired is Chunk.required for a chunk of type typ.
func chunkRequired(typ, key string) bool {
	if key == "type" {
		return true
	}
	switch typ {
	case ChunkTextStart, ChunkTextEnd, ChunkReasoningStart, ChunkReasoningEnd:
		return key == "id"
	case ChunkTextDelta, ChunkReasoningDelta:
		return key == "id" || key == "delta"
	case ChunkToolInputStart:
		return key == "toolCallId" || key == "toolName"
	case ChunkToolInputDelta:
		return key == "toolCallId" || key == "inputTextDelta"
	case ChunkToolInputAvailable:
		return key == "toolCallId" || key == "toolName" || key == "input"
	case ChunkToolInputError:
		return key == "toolCallId" || key == "toolName" || key == "input" || key == "errorText"
	case ChunkToolApprovalRequest:
		return key == "approvalId" || key == "toolCallId"
	case ChunkToolOutputAvailable:
		return key == "toolCallId" || key == "output"
	case ChunkToolOutputError:
		return key == "toolCallId" || key == "errorText"
	case ChunkToolOutputDenied:
		return key == "toolCallId"
	case ChunkSourceURL:
		return key == "sourceId" || key == "url"
	case ChunkSourceDocument:
		return key == "sourceId" || key == "mediaType" || key == "title"
	case ChunkFile:
		return key == "url" || key == "mediaType"
	case ChunkError:
		return key == "errorText"
	case ChunkMessageMetadata:
		return key == "messageMetadata"
	}
	return strings.HasPrefix(typ, DataPartPrefix) && key == "data"
}

// MarshalJSON encodes c as an AI SDK UIMessageChunk, unknown members
// included.
// It writes what json.Marshal writes (compact, HTML-safe), member by
// member in the order of fields, without reflection: a chunk is encoded
// once per streamed token.
func (c Chunk) MarshalJSON() ([]byte, error) {
	b, err := c.AppendJSON(make([]byte, 0, 64+len(c.Delta)+len(c.ID)+len(c.MessageMetadata)+len(c.Input)+len(c.Output)+len(c.Data)))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// AppendJSON appends c's encoding, what MarshalJSON returns, to b: a
// caller that encodes a chunk per streamed token reuses one buffer.
func (c *Chunk) AppendJSON(b []byte) ([]byte, error) {
	start := len(b)
	e := chunkEncoder{typ: c.Type, b: b}
	e.b = append(e.b, `{"type":`...)
	e.b = jsonenc.AppendString(e.b, c.Type)
	e.str("messageId", c.MessageID)
	e.str("id", c.ID)
	e.str("delta", c.Delta)
	e.str("approvalId", c.ApprovalID)
	e.str("toolCallId", c.ToolCallID)
	e.str("toolName", c.ToolName)
	e.str("inputTextDelta", c.InputTextDelta)
	e.str("inputEncoding", c.InputEncoding)
	e.raw("input", c.Input)
	e.raw("output", c.Output)
	e.str("errorText", c.ErrorText)
	e.raw("approvalDescriptor", c.ApprovalDescriptor)
	e.raw("inputSchemaInput", c.InputSchemaInput)
	e.raw("signature", c.Signature)
	e.flag("providerExecuted", c.ProviderExecuted)
	e.flag("dynamic", c.Dynamic)
	e.flag("preliminary", c.Preliminary)
	e.str("sourceId", c.SourceID)
	e.str("url", c.URL)
	e.str("mediaType", c.MediaType)
	e.str("title", c.Title)
	e.raw("toolMetadata", c.ToolMetadata)
	e.str("filename", c.Filename)
	e.raw("data", c.Data)
	e.flag("transient", c.Transient)
	e.str("finishReason", c.FinishReason)
	e.str("reason", c.Reason)
	e.raw("messageMetadata", c.MessageMetadata)
	e.raw("providerMetadata", c.ProviderMetadata)
	if e.err == nil && len(c.extra) > 0 {
		e.b, e.err = appendExtra(e.b, c.extra)
	}
	if e.err != nil {
		return b[:start], fmt.Errorf("chunk %q: %w", c.Type, e.err)
	}
	return append(e.b, '}'), nil
}

// chunkEncoder appends a chunk's members after its type; each is left out
// when zero unless its key is required for the chunk's type.
type chunkEncoder struct {
	typ string // the chunk's type, which says which keys are required
	b   []byte
	err error
}

func (e *chunkEncoder) key(key string) {
	e.b = append(e.b, ',', '"')
	e.b = append(e.b, key...)
	e.b = append(e.b, '"', ':')
}

func (e *chunkEncoder) str(key, v string) {
	if v == "" && !chunkRequired(e.typ, key) {
		return
	}
	e.key(key)
	e.b = jsonenc.AppendString(e.b, v)
}

func (e *chunkEncoder) raw(key string, v json.RawMessage) {
	if e.err != nil || len(v) == 0 && !chunkRequired(e.typ, key) {
		return
	}
	e.key(key)
	b, err := jsonenc.AppendRaw(e.b, v)
	if err != nil {
		e.err = fmt.Errorf("encode %q: %w", key, err)
		return
	}
	e.b = b
}

func (e *chunkEncoder) flag(key string, v *bool) {
	if v == nil && !chunkRequired(e.typ, key) {
		return
	}
	e.key(key)
	switch {
	case v == nil:
		e.b = append(e.b, "null"...)
	case *v:
		e.b = append(e.b, "true"...)
	default:
		e.b = append(e.b, "false"...)
	}
}

// UnmarshalJSON decodes an AI SDK UIMessageChunk, keeping unknown members.
func (c *Chunk) UnmarshalJSON(data []byte) error {
	*c = Chunk{}
	extra, err := unmarshalObject(data, c.fieldPtr, c.fields)
	if err != nil {
		return fmt.Errorf("chunk: %w", err)
	}
	c.extra = extra
	return nil
}

// IsData reports whether c is a "data-{name}" chunk.
func (c Chunk) IsData() bool { return strings.HasPrefix(c.Type, DataPartPrefix) }

// IsTransient reports whether c is a data chunk that is delivered to the
// client's onData callback but not stored in the message.
func (c Chunk) IsTransient() bool { return c.Transient != nil && *c.Transient }

// EffectiveFinishReason returns the finish reason of a "finish" chunk in
// either form: the native finishReason field, or the finishReason member of
// messageMetadata that AIChatAgent sends. It is empty when neither is set.
func (c Chunk) EffectiveFinishReason() string {
	if c.FinishReason != "" {
		return c.FinishReason
	}
	return metadataFinishReason(c.MessageMetadata)
}

// metadataFinishReason returns the string member finishReason of a
// metadata object, or "".
func metadataFinishReason(meta json.RawMessage) string {
	if !isObject(meta) {
		return ""
	}
	var m struct {
		FinishReason any `json:"finishReason"`
	}
	if json.Unmarshal(meta, &m) != nil {
		return ""
	}
	s, _ := m.FinishReason.(string)
	return s
}

// Start returns a "start" chunk. An empty messageID is omitted, as on a
// continuation turn, so the client keeps appending to its last message.
func Start(messageID string) Chunk { return Chunk{Type: ChunkStart, MessageID: messageID} }

// StartStep returns a "start-step" chunk.
func StartStep() Chunk { return Chunk{Type: ChunkStartStep} }

// FinishStep returns a "finish-step" chunk.
func FinishStep() Chunk { return Chunk{Type: ChunkFinishStep} }

// TextStart returns a "text-start" chunk opening text part id.
func TextStart(id string) Chunk { return Chunk{Type: ChunkTextStart, ID: id} }

// TextDelta returns a "text-delta" chunk appending delta to text part id.
func TextDelta(id, delta string) Chunk { return Chunk{Type: ChunkTextDelta, ID: id, Delta: delta} }

// TextEnd returns a "text-end" chunk closing text part id.
func TextEnd(id string) Chunk { return Chunk{Type: ChunkTextEnd, ID: id} }

// ReasoningStart returns a "reasoning-start" chunk opening reasoning part id.
func ReasoningStart(id string) Chunk { return Chunk{Type: ChunkReasoningStart, ID: id} }

// ReasoningDelta returns a "reasoning-delta" chunk appending delta to
// reasoning part id.
func ReasoningDelta(id, delta string) Chunk {
	return Chunk{Type: ChunkReasoningDelta, ID: id, Delta: delta}
}

// ReasoningEnd returns a "reasoning-end" chunk closing reasoning part id.
func ReasoningEnd(id string) Chunk { return Chunk{Type: ChunkReasoningEnd, ID: id} }

// ToolInputStart returns a "tool-input-start" chunk opening the call callID
// of tool name.
func ToolInputStart(callID, name string) Chunk {
	return Chunk{Type: ChunkToolInputStart, ToolCallID: callID, ToolName: name}
}

// ToolInputDelta returns a "tool-input-delta" chunk carrying a piece of the
// JSON input text of the call callID.
func ToolInputDelta(callID, delta string) Chunk {
	return Chunk{Type: ChunkToolInputDelta, ToolCallID: callID, InputTextDelta: delta}
}

// ToolInputAvailable returns a "tool-input-available" chunk carrying the
// whole input of the call callID of tool name.
func ToolInputAvailable(callID, name string, input json.RawMessage) Chunk {
	return Chunk{Type: ChunkToolInputAvailable, ToolCallID: callID, ToolName: name, Input: input}
}

// ToolInputError returns a "tool-input-error" chunk: the model produced an
// input for the call callID that could not be used.
func ToolInputError(callID, name string, input json.RawMessage, errText string) Chunk {
	return Chunk{Type: ChunkToolInputError, ToolCallID: callID, ToolName: name, Input: input, ErrorText: errText}
}

// ToolApprovalRequest returns a "tool-approval-request" chunk asking the
// user to approve the call callID.
func ToolApprovalRequest(approvalID, callID string) Chunk {
	return Chunk{Type: ChunkToolApprovalRequest, ApprovalID: approvalID, ToolCallID: callID}
}

// ToolOutputAvailable returns a "tool-output-available" chunk carrying the
// result of the call callID.
func ToolOutputAvailable(callID string, output json.RawMessage) Chunk {
	return Chunk{Type: ChunkToolOutputAvailable, ToolCallID: callID, Output: output}
}

// ToolOutputError returns a "tool-output-error" chunk: the call callID
// failed with errText.
func ToolOutputError(callID, errText string) Chunk {
	return Chunk{Type: ChunkToolOutputError, ToolCallID: callID, ErrorText: errText}
}

// ToolOutputDenied returns a "tool-output-denied" chunk: the user refused
// the call callID.
func ToolOutputDenied(callID string) Chunk {
	return Chunk{Type: ChunkToolOutputDenied, ToolCallID: callID}
}

// Finish returns a "finish" chunk in the form AIChatAgent sends,
// {type:"finish", messageMetadata:{finishReason}}, so that the client
// stores the reason in the message metadata as the server does. An empty
// reason gives a bare {type:"finish"}.
func Finish(reason string) Chunk {
	c := Chunk{Type: ChunkFinish}
	if reason != "" {
		c.MessageMetadata, _ = json.Marshal(map[string]string{"finishReason": reason})
	}
	return c
}

// MessageMetadata returns a "message-metadata" chunk that merges meta into
// the message metadata.
func MessageMetadata(meta json.RawMessage) Chunk {
	return Chunk{Type: ChunkMessageMetadata, MessageMetadata: meta}
}

// Data returns a "data-{name}" chunk. A non-empty id lets a later chunk of
// the same name and id replace the part; a transient chunk reaches the
// client's onData callback but is not stored in the message.
func Data(name, id string, data json.RawMessage, transient bool) Chunk {
	c := Chunk{Type: DataPartPrefix + name, ID: id, Data: data}
	if transient {
		c.Transient = &transient
	}
	return c
}

// Error returns an "error" chunk with text.
func Error(text string) Chunk { return Chunk{Type: ChunkError, ErrorText: text} }

// Abort returns an "abort" chunk; an empty reason is omitted.
func Abort(reason string) Chunk { return Chunk{Type: ChunkAbort, Reason: reason} }
