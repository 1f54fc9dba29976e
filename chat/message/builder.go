package message

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// StreamError reports a chunk that breaks the ordering rules of the UI
// message stream, such as a text-delta without its text-start. The AI SDK
// client fails the turn on the same chunks.
type StreamError struct {
	// ChunkType is the type of the offending chunk.
	ChunkType string
	// ID is the chunk's part id or tool call id.
	ID string
	// Reason says what is wrong.
	Reason string
}

// Error describes the offending chunk and what is wrong with it.
func (e *StreamError) Error() string {
	return fmt.Sprintf("message: %s chunk %q: %s", e.ChunkType, e.ID, e.Reason)
}

// partialToolCall is a tool call whose input is still streaming.
type partialToolCall struct {
	text         string
	toolName     string
	dynamic      bool
	title        string
	toolMetadata json.RawMessage
}

// Builder builds one assistant message from a UI message stream, applying
// chunks exactly as the AI SDK client's processUIMessageStream does, so the
// server's copy of a message equals the one the client renders.
//
// The zero Builder is ready to use and builds a message with an empty id
// (a "start" chunk usually sets it). A Builder is not safe for concurrent
// use.
type Builder struct {
	msg          Message
	text         map[string]int // open text parts: id → index in msg.Parts
	reasoning    map[string]int // open reasoning parts: id → index in msg.Parts
	partialTools map[string]*partialToolCall
	finishReason string
	// acc accumulates the text of streaming parts (index in msg.Parts →
	// text so far), so a long part is not copied on every delta; sync
	// writes it back into the parts.
	acc map[int]*strings.Builder
}

// sync writes the accumulated text of streaming parts into the message.
func (b *Builder) sync() {
	for i, sb := range b.acc {
		b.msg.Parts[i].Text = sb.String()
	}
}

// NewBuilder returns a Builder for a new assistant message with messageID.
func NewBuilder(messageID string) *Builder {
	return &Builder{msg: Message{ID: messageID, Role: RoleAssistant}}
}

// Continue makes b append to existing, an assistant message from an earlier
// turn, as the client does on a continuation turn. The state of any stream
// applied before is discarded; existing is copied, not modified.
func (b *Builder) Continue(existing Message) error {
	if existing.Role != RoleAssistant {
		return fmt.Errorf("message: continue message %q: role is %q, want %q", existing.ID, existing.Role, RoleAssistant)
	}
	*b = Builder{msg: existing.Clone()}
	return nil
}

// Message returns a deep copy of the message built so far.
func (b *Builder) Message() Message {
	b.sync()
	m := b.msg.Clone()
	if m.Role == "" {
		m.Role = RoleAssistant
	}
	if m.Parts == nil {
		m.Parts = []Part{}
	}
	return m
}

// FinishReason returns the finish reason of the stream's "finish" chunk in
// either form, or "" before one arrived.
func (b *Builder) FinishReason() string {
	if b.finishReason != "" {
		return b.finishReason
	}
	return metadataFinishReason(b.msg.Metadata)
}

// Finalize marks every text and reasoning part that is still streaming as
// done and forgets the open parts, so later deltas for them fail. Use it
// when a turn ends early (aborted or failed) and its partial message is
// kept. Tool parts are left as they are.
func (b *Builder) Finalize() {
	b.sync()
	b.acc = nil
	for i := range b.msg.Parts {
		p := &b.msg.Parts[i]
		if (p.Type == PartText || p.Type == PartReasoning) && p.State == StateStreaming {
			p.State = StateDone
		}
	}
	b.text = nil
	b.reasoning = nil
}

// OpenToolCall is a tool call whose input is still streaming.
type OpenToolCall struct {
	ID, Name string
}

// OpenPart is a text or reasoning part that is still streaming: its stream
// id and its index in the message's parts.
type OpenPart struct {
	ID    string
	Index int
}

// OpenParts returns what the stream left open: the ids of the text and
// reasoning parts still streaming and the tool calls whose input is still
// streaming, each in message order. Recovery closes them with end and
// error chunks before a stream goes on.
func (b *Builder) OpenParts() (text, reasoning []OpenPart, tools []OpenToolCall) {
	byIndex := func(open map[string]int) []OpenPart {
		ps := make([]OpenPart, 0, len(open))
		for id, i := range open {
			ps = append(ps, OpenPart{ID: id, Index: i})
		}
		slices.SortFunc(ps, func(x, y OpenPart) int { return x.Index - y.Index })
		return ps
	}
	text, reasoning = byIndex(b.text), byIndex(b.reasoning)
	for _, p := range b.msg.Parts {
		if pt, ok := b.partialTools[p.ToolCallID]; ok && p.IsTool() && p.State == StateInputStreaming {
			tools = append(tools, OpenToolCall{ID: p.ToolCallID, Name: pt.toolName})
		}
	}
	return text, reasoning, tools
}

// Apply applies one chunk to the message.
//
// It returns a *StreamError, leaving the message unchanged, when c breaks
// the stream's ordering rules: a text or reasoning delta or end without an
// open part of the same id, a tool-input-delta without its
// tool-input-start, or a tool-output-*, tool-output-denied or
// tool-approval-request for a call with no tool part. A chunk with invalid
// JSON in a JSON field is rejected the same way. The "error" and "abort"
// chunks and chunk types this package does not know leave the message
// unchanged and return nil; the caller handles them.
func (b *Builder) Apply(c Chunk) error {
	if c.Type == "" {
		return &StreamError{ChunkType: c.Type, Reason: "missing chunk type"}
	}
	if err := validateRaw(c); err != nil {
		return err
	}
	if b.msg.Role == "" {
		b.msg.Role = RoleAssistant
	}
	switch c.Type {
	case ChunkStart:
		if c.MessageID != "" {
			b.msg.ID = c.MessageID
		}
		b.msg.Metadata = mergeJSON(b.msg.Metadata, c.MessageMetadata)

	case ChunkFinish:
		if c.FinishReason != "" {
			b.finishReason = c.FinishReason
			reason, _ := json.Marshal(map[string]string{"finishReason": c.FinishReason})
			b.msg.Metadata = mergeJSON(b.msg.Metadata, reason)
		}
		b.msg.Metadata = mergeJSON(b.msg.Metadata, c.MessageMetadata)

	case ChunkMessageMetadata:
		b.msg.Metadata = mergeJSON(b.msg.Metadata, c.MessageMetadata)

	case ChunkStartStep:
		b.msg.Parts = append(b.msg.Parts, Part{Type: PartStepStart})

	case ChunkFinishStep:
		b.text = nil
		b.reasoning = nil

	case ChunkTextStart:
		b.text = openPart(b.text, c.ID, len(b.msg.Parts))
		b.msg.Parts = append(b.msg.Parts, Part{
			Type:             PartText,
			State:            StateStreaming,
			ProviderMetadata: cloneRaw(c.ProviderMetadata),
		})

	case ChunkReasoningStart:
		b.reasoning = openPart(b.reasoning, c.ID, len(b.msg.Parts))
		b.msg.Parts = append(b.msg.Parts, Part{
			Type:             PartReasoning,
			ID:               c.ID,
			State:            StateStreaming,
			ProviderMetadata: cloneRaw(c.ProviderMetadata),
		})

	case ChunkTextDelta, ChunkTextEnd:
		i, ok := b.text[c.ID]
		if !ok {
			return &StreamError{ChunkType: c.Type, ID: c.ID,
				Reason: "no open text part with this id; send text-start first"}
		}
		b.updateStreamingPart(i, c, c.Type == ChunkTextEnd)
		if c.Type == ChunkTextEnd {
			delete(b.text, c.ID)
		}

	case ChunkReasoningDelta, ChunkReasoningEnd:
		i, ok := b.reasoning[c.ID]
		if !ok {
			return &StreamError{ChunkType: c.Type, ID: c.ID,
				Reason: "no open reasoning part with this id; send reasoning-start first"}
		}
		b.updateStreamingPart(i, c, c.Type == ChunkReasoningEnd)
		if c.Type == ChunkReasoningEnd {
			delete(b.reasoning, c.ID)
		}

	case ChunkFile:
		b.msg.Parts = append(b.msg.Parts, Part{
			Type:             PartFile,
			MediaType:        c.MediaType,
			URL:              c.URL,
			ProviderMetadata: cloneRaw(c.ProviderMetadata),
		})

	case ChunkSourceURL:
		b.msg.Parts = append(b.msg.Parts, Part{
			Type:             PartSourceURL,
			SourceID:         c.SourceID,
			URL:              c.URL,
			Title:            c.Title,
			ProviderMetadata: cloneRaw(c.ProviderMetadata),
		})

	case ChunkSourceDocument:
		b.msg.Parts = append(b.msg.Parts, Part{
			Type:             PartSourceDocument,
			SourceID:         c.SourceID,
			MediaType:        c.MediaType,
			Title:            c.Title,
			Filename:         c.Filename,
			ProviderMetadata: cloneRaw(c.ProviderMetadata),
		})

	case ChunkToolInputStart, ChunkToolInputDelta, ChunkToolInputAvailable, ChunkToolInputError,
		ChunkToolApprovalRequest, ChunkToolOutputDenied, ChunkToolOutputAvailable, ChunkToolOutputError:
		return b.applyTool(c)

	default:
		if c.IsData() {
			b.applyData(c)
		}
		// "error", "abort" and unknown chunk types do not change the
		// message.
	}
	return nil
}

// applyTool applies a chunk of a tool call (Apply's tool-* cases).
func (b *Builder) applyTool(c Chunk) error {
	switch c.Type {
	case ChunkToolInputStart:
		if b.partialTools == nil {
			b.partialTools = make(map[string]*partialToolCall)
		}
		b.partialTools[c.ToolCallID] = &partialToolCall{
			toolName:     c.ToolName,
			dynamic:      isTrue(c.Dynamic),
			title:        c.Title,
			toolMetadata: cloneRaw(c.ToolMetadata),
		}
		b.upsertTool(toolUpdate{
			dynamic:          isTrue(c.Dynamic),
			toolName:         c.ToolName,
			toolCallID:       c.ToolCallID,
			state:            StateInputStreaming,
			providerExecuted: c.ProviderExecuted,
			title:            c.Title,
			toolMetadata:     c.ToolMetadata,
			providerMetadata: c.ProviderMetadata,
		}, -1)

	case ChunkToolInputDelta:
		pt, ok := b.partialTools[c.ToolCallID]
		if !ok {
			return &StreamError{ChunkType: c.Type, ID: c.ToolCallID,
				Reason: "no tool call with this id is streaming its input; send tool-input-start first"}
		}
		pt.text += c.InputTextDelta
		b.upsertTool(toolUpdate{
			dynamic:      pt.dynamic,
			toolName:     pt.toolName,
			toolCallID:   c.ToolCallID,
			state:        StateInputStreaming,
			input:        parsePartialJSON(pt.text),
			title:        pt.title,
			toolMetadata: pt.toolMetadata,
		}, -1)

	case ChunkToolInputAvailable:
		b.upsertTool(toolUpdate{
			dynamic:          isTrue(c.Dynamic),
			toolName:         c.ToolName,
			toolCallID:       c.ToolCallID,
			state:            StateInputAvailable,
			input:            c.Input,
			providerExecuted: c.ProviderExecuted,
			providerMetadata: c.ProviderMetadata,
			title:            c.Title,
			toolMetadata:     c.ToolMetadata,
		}, -1)

	case ChunkToolInputError:
		dynamic := isTrue(c.Dynamic)
		for _, p := range b.msg.Parts[b.stepStart():] {
			if p.IsTool() && p.ToolCallID == c.ToolCallID {
				dynamic = p.Type == PartDynamicTool
				break
			}
		}
		u := toolUpdate{
			dynamic:          dynamic,
			toolName:         c.ToolName,
			toolCallID:       c.ToolCallID,
			state:            StateOutputError,
			errorText:        c.ErrorText,
			providerExecuted: c.ProviderExecuted,
			providerMetadata: c.ProviderMetadata,
			toolMetadata:     c.ToolMetadata,
		}
		if dynamic {
			u.input = c.Input
		} else {
			u.rawInput = c.Input
		}
		b.upsertTool(u, -1)

	case ChunkToolApprovalRequest:
		i, err := b.findTool(c)
		if err != nil {
			return err
		}
		p := &b.msg.Parts[i]
		p.State = StateApprovalRequested
		p.Approval = &Approval{
			ID:         c.ApprovalID,
			Descriptor: cloneRaw(c.ApprovalDescriptor),
			Signature:  cloneRaw(c.Signature),
		}

	case ChunkToolOutputDenied:
		i, err := b.findTool(c)
		if err != nil {
			return err
		}
		b.msg.Parts[i].State = StateOutputDenied

	case ChunkToolOutputAvailable, ChunkToolOutputError:
		i, err := b.findTool(c)
		if err != nil {
			return err
		}
		p := b.msg.Parts[i]
		u := toolUpdate{
			dynamic:          p.Type == PartDynamicTool,
			toolName:         p.ToolName(),
			toolCallID:       c.ToolCallID,
			input:            p.Input,
			providerExecuted: c.ProviderExecuted,
			providerMetadata: c.ProviderMetadata,
			title:            p.Title,
			toolMetadata:     p.ToolMetadata,
		}
		if c.Type == ChunkToolOutputAvailable {
			u.state = StateOutputAvailable
			u.output = c.Output
			u.preliminary = c.Preliminary
		} else {
			u.state = StateOutputError
			u.errorText = c.ErrorText
			u.rawInput = p.RawInput
		}
		b.upsertTool(u, i)
	}
	return nil
}

// validateRaw rejects a chunk whose JSON fields the builder copies into
// the message do not hold valid JSON.
func validateRaw(c Chunk) error {
	for _, f := range []struct {
		name string
		v    json.RawMessage
	}{
		{"input", c.Input},
		{"output", c.Output},
		{"data", c.Data},
		{"messageMetadata", c.MessageMetadata},
		{"providerMetadata", c.ProviderMetadata},
		{"toolMetadata", c.ToolMetadata},
		{"approvalDescriptor", c.ApprovalDescriptor},
		{"signature", c.Signature},
	} {
		if len(f.v) > 0 && !json.Valid(f.v) {
			id := c.ID
			if c.ToolCallID != "" {
				id = c.ToolCallID
			}
			return &StreamError{ChunkType: c.Type, ID: id, Reason: "invalid JSON in " + f.name}
		}
	}
	return nil
}

// openPart records that the part with id starts at index i.
func openPart(open map[string]int, id string, i int) map[string]int {
	if open == nil {
		open = make(map[string]int)
	}
	open[id] = i
	return open
}

// updateStreamingPart applies a delta or end chunk to the text or
// reasoning part at index i.
func (b *Builder) updateStreamingPart(i int, c Chunk, end bool) {
	p := &b.msg.Parts[i]
	if c.Delta != "" {
		sb := b.acc[i]
		if sb == nil {
			if b.acc == nil {
				b.acc = map[int]*strings.Builder{}
			}
			sb = &strings.Builder{}
			sb.WriteString(p.Text)
			b.acc[i] = sb
		}
		sb.WriteString(c.Delta)
	}
	if len(c.ProviderMetadata) > 0 {
		p.ProviderMetadata = cloneRaw(c.ProviderMetadata)
	}
	if end {
		if sb := b.acc[i]; sb != nil {
			p.Text = sb.String()
			delete(b.acc, i)
		}
		p.State = StateDone
	}
}

// applyData stores a non-transient data chunk, replacing the data of an
// earlier part with the same type and id.
func (b *Builder) applyData(c Chunk) {
	if c.IsTransient() {
		return
	}
	if c.ID != "" {
		for i := range b.msg.Parts {
			p := &b.msg.Parts[i]
			if p.Type == c.Type && p.ID == c.ID {
				p.Data = cloneRaw(c.Data)
				return
			}
		}
	}
	b.msg.Parts = append(b.msg.Parts, Part{Type: c.Type, ID: c.ID, Data: cloneRaw(c.Data)})
}

// stepStart returns the index of the first part of the current step: the
// one after the last step-start part.
func (b *Builder) stepStart() int {
	for i := len(b.msg.Parts) - 1; i >= 0; i-- {
		if b.msg.Parts[i].Type == PartStepStart {
			return i + 1
		}
	}
	return 0
}

// findTool returns the index of the tool part for c's call: the first in
// the current step, else the last in the whole message.
func (b *Builder) findTool(c Chunk) (int, error) {
	start := b.stepStart()
	for i := start; i < len(b.msg.Parts); i++ {
		if p := b.msg.Parts[i]; p.IsTool() && p.ToolCallID == c.ToolCallID {
			return i, nil
		}
	}
	for i := start - 1; i >= 0; i-- {
		if p := b.msg.Parts[i]; p.IsTool() && p.ToolCallID == c.ToolCallID {
			return i, nil
		}
	}
	return 0, &StreamError{ChunkType: c.Type, ID: c.ToolCallID,
		Reason: "no tool part with this tool call id; send tool-input-start or tool-input-available first"}
}

// toolUpdate is the new state of a tool part.
type toolUpdate struct {
	dynamic          bool
	toolName         string
	toolCallID       string
	state            string
	input            json.RawMessage
	output           json.RawMessage
	errorText        string
	rawInput         json.RawMessage
	providerExecuted *bool
	preliminary      *bool
	title            string
	toolMetadata     json.RawMessage
	providerMetadata json.RawMessage
}

// upsertTool applies u to the tool part at index i, or, when i < 0, to the
// part of the same kind (static or dynamic) and call id in the current
// step, appending a new part when there is none. It mirrors the AI SDK's
// updateToolPart and updateDynamicToolPart.
func (b *Builder) upsertTool(u toolUpdate, i int) {
	if i < 0 {
		for j := b.stepStart(); j < len(b.msg.Parts); j++ {
			p := b.msg.Parts[j]
			kind := strings.HasPrefix(p.Type, ToolPartPrefix)
			if u.dynamic {
				kind = p.Type == PartDynamicTool
			}
			if kind && p.ToolCallID == u.toolCallID {
				i = j
				break
			}
		}
	}
	isResult := u.state == StateOutputAvailable || u.state == StateOutputError
	if i < 0 {
		p := Part{
			Type:             ToolPartPrefix + u.toolName,
			ToolCallID:       u.toolCallID,
			State:            u.state,
			Title:            u.title,
			ToolMetadata:     cloneRaw(u.toolMetadata),
			Input:            cloneRaw(u.input),
			Output:           cloneRaw(u.output),
			RawInput:         cloneRaw(u.rawInput),
			ErrorText:        u.errorText,
			ProviderExecuted: cloneBool(u.providerExecuted),
			Preliminary:      cloneBool(u.preliminary),
		}
		if u.dynamic {
			p.Type = PartDynamicTool
			p.DynamicToolName = u.toolName
		}
		if len(u.providerMetadata) > 0 {
			if isResult {
				p.ResultProviderMetadata = cloneRaw(u.providerMetadata)
			} else {
				p.CallProviderMetadata = cloneRaw(u.providerMetadata)
			}
		}
		b.msg.Parts = append(b.msg.Parts, p)
		return
	}

	p := &b.msg.Parts[i]
	p.State = u.state
	if u.dynamic {
		p.DynamicToolName = u.toolName
		if u.rawInput != nil {
			p.RawInput = cloneRaw(u.rawInput)
		}
	} else {
		p.RawInput = cloneRaw(u.rawInput)
	}
	p.Input = cloneRaw(u.input)
	p.Output = cloneRaw(u.output)
	p.ErrorText = u.errorText
	p.Preliminary = cloneBool(u.preliminary)
	if u.title != "" {
		p.Title = u.title
	}
	if u.toolMetadata != nil {
		p.ToolMetadata = cloneRaw(u.toolMetadata)
	}
	if u.providerExecuted != nil {
		p.ProviderExecuted = cloneBool(u.providerExecuted)
	}
	if len(u.providerMetadata) > 0 {
		if isResult {
			p.ResultProviderMetadata = cloneRaw(u.providerMetadata)
		} else {
			p.CallProviderMetadata = cloneRaw(u.providerMetadata)
		}
	}
}

// isTrue reports whether p points to true.
func isTrue(p *bool) bool { return p != nil && *p }
