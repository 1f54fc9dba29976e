// Package anthropic is a model.Model for Anthropic's Messages API, built on
// the official anthropic-sdk-go SDK.
//
// Requests are streamed. Transient failures (HTTP 408, 429, 5xx, overloaded
// errors and connection errors) that happen before the first event is
// yielded are retried with exponential backoff, honouring Retry-After within
// a cap; the SDK's own retries are turned off so that this policy is the only
// one in force.
package anthropic

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"os"
	"strings"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/internal/files"
	"github.com/agentry/agentry/model/internal/retry"
)

// DefaultModel is the model used when Config.Model is empty.
const DefaultModel = sdk.ModelClaudeSonnet5_5

// DefaultMaxTokens caps the output when neither the request nor the Config
// says otherwise; the Messages API requires a cap.
const DefaultMaxTokens = 4096

// Config configures a Model. Zero fields take defaults.
type Config struct {
	// BaseURL is the API root; empty means the SDK's default (which honours
	// ANTHROPIC_BASE_URL).
	BaseURL string
	// APIKey authenticates requests; empty means the SDK's credential chain
	// (ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN, profiles).
	APIKey string
	// Model is the model id; empty means DefaultModel.
	Model string
	// HTTPClient sends the requests; nil means the SDK's default client.
	HTTPClient *http.Client
	// MaxRetries is how many times a transient failure is retried; zero
	// means 2 and a negative value disables retries.
	MaxRetries int
	// Clock measures the backoff between retries; nil means the real clock.
	Clock clockwork.Clock
	// MaxTokens caps the output of requests that set no cap; zero means
	// DefaultMaxTokens.
	MaxTokens int
	// ThinkingBudget, when positive, turns on extended thinking with this
	// many tokens; the thinking streams as reasoning events.
	ThinkingBudget int
	// MaxImageBytes caps one attached image; zero means 5 MiB (the API's
	// own limit). A larger one fails the request with a
	// *model.RequestError before anything is sent.
	MaxImageBytes int
	// MaxPDFBytes caps one attached PDF; zero means 32 MiB.
	MaxPDFBytes int
	// MaxTextBytes caps one attached plain text file; zero means 1 MiB.
	MaxTextBytes int
}

// ConfigFromEnv returns a Config read from the environment:
// ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and AGENTRY_MODEL (DefaultModel when
// unset).
func ConfigFromEnv() Config {
	return Config{
		APIKey:  os.Getenv("ANTHROPIC_API_KEY"),
		BaseURL: os.Getenv("ANTHROPIC_BASE_URL"),
		Model:   cmp.Or(os.Getenv("AGENTRY_MODEL"), DefaultModel),
	}
}

// FromEnv returns a Model configured by ConfigFromEnv.
func FromEnv() *Model { return New(ConfigFromEnv()) }

// Model streams messages from Anthropic. It is safe for concurrent use.
type Model struct {
	client    sdk.Client
	model     string
	maxTokens int
	thinking  int
	policy    retry.Policy
	clock     clockwork.Clock
	files     files.Limits
}

var _ model.Model = (*Model)(nil)

// New returns a Model for cfg.
func New(cfg Config) *Model {
	opts := retry.Options(retry.Client{BaseURL: cfg.BaseURL, APIKey: cfg.APIKey, HTTPClient: cfg.HTTPClient},
		option.WithMaxRetries(0), option.WithBaseURL, option.WithAPIKey,
		func(c *http.Client) option.RequestOption { return option.WithHTTPClient(c) })
	clock := retry.RealClock(cfg.Clock)
	return &Model{
		client:    sdk.NewClient(opts...),
		model:     cmp.Or(cfg.Model, DefaultModel),
		maxTokens: cmp.Or(cfg.MaxTokens, DefaultMaxTokens),
		thinking:  cfg.ThinkingBudget,
		policy:    retry.Policy{MaxRetries: cfg.MaxRetries, Clock: clock},
		clock:     clock,
		files:     files.Limits{MaxImageBytes: cfg.MaxImageBytes, MaxPDFBytes: cfg.MaxPDFBytes, MaxTextBytes: cfg.MaxTextBytes},
	}
}

// ModelName returns the model id requests use (model.Namer).
func (m *Model) ModelName() string { return m.model }

// Stream implements model.Model.
func (m *Model) Stream(ctx context.Context, req *model.Request) iter.Seq2[model.Event, error] {
	params, err := m.params(req)
	if err != nil {
		return retry.Failed(fmt.Errorf("anthropic: request: %w", err))
	}
	return retry.SSE(ctx, m.policy, "anthropic", m.classify,
		func(ctx context.Context) retry.Events[sdk.MessageStreamEventUnion] {
			return m.client.Messages.NewStreaming(ctx, params)
		},
		func() retry.Decoder[sdk.MessageStreamEventUnion] { return &streamState{tools: map[int64]*toolUse{}} })
}

// classify tells the retry policy which errors are transient.
func (m *Model) classify(err error) (bool, time.Duration) {
	var aerr *sdk.Error
	if errors.As(err, &aerr) {
		switch string(aerr.Type()) {
		case "overloaded_error", "api_error", "rate_limit_error":
		default:
			if !retry.TransientStatus(aerr.StatusCode) {
				return false, 0
			}
		}
		var h http.Header
		if aerr.Response != nil {
			h = aerr.Response.Header
		}
		return true, retry.RetryAfter(h, m.clock.Now())
	}
	return retry.IsConnError(err), 0
}

// params maps a provider-neutral request to the SDK's parameters.
func (m *Model) params(req *model.Request) (sdk.MessageNewParams, error) {
	p := sdk.MessageNewParams{
		Model:     m.model,
		MaxTokens: int64(cmp.Or(req.MaxTokens, m.maxTokens)),
	}
	if m.thinking > 0 {
		p.Thinking = sdk.ThinkingConfigParamOfEnabled(int64(m.thinking))
	}
	if req.System != "" {
		p.System = []sdk.TextBlockParam{{Text: req.System}}
	}
	for i, msg := range req.Messages {
		role, blocks, err := m.blocks(msg)
		if err != nil {
			return p, fmt.Errorf("message %d: %w", i, err)
		}
		if len(blocks) == 0 {
			continue
		}
		// The API wants user and assistant turns to alternate: a tool
		// result message followed by user text becomes one user turn.
		if n := len(p.Messages); n > 0 {
			last := &p.Messages[n-1]
			switch {
			case role == "user" && last.OfUser != nil:
				last.OfUser.Content = append(last.OfUser.Content, blocks...)
				continue
			case role == "assistant" && last.OfAssistant != nil:
				last.OfAssistant.Content = append(last.OfAssistant.Content, blocks...)
				continue
			}
		}
		if role == "assistant" {
			p.Messages = append(p.Messages, sdk.NewAssistantMessage(blocks...))
		} else {
			p.Messages = append(p.Messages, sdk.NewUserMessage(blocks...))
		}
	}
	for _, t := range req.Tools {
		schema, err := inputSchema(t.InputSchema)
		if err != nil {
			return p, fmt.Errorf("tool %q: input schema: %w", t.Name, err)
		}
		tool := sdk.ToolParam{Name: t.Name, InputSchema: schema}
		if t.Description != "" {
			tool.Description = sdk.String(t.Description)
		}
		p.Tools = append(p.Tools, sdk.ToolUnionParam{OfTool: &tool})
	}
	return p, nil
}

// blocks maps one message to the role and content blocks of an Anthropic
// message. Tool results travel in user messages. Reasoning is not sent back:
// the API accepts earlier thinking only with its signature, which
// model.Content does not keep.
func (m *Model) blocks(msg model.Message) (role string, out []sdk.ContentBlockParamUnion, err error) {
	switch msg.Role {
	case model.RoleUser, model.RoleTool:
		role = "user"
	case model.RoleAssistant:
		role = "assistant"
	default:
		return "", nil, fmt.Errorf("unknown role %q", msg.Role)
	}
	for _, c := range msg.Content {
		switch c.Kind {
		case model.ContentText:
			if c.Text != "" {
				out = append(out, sdk.NewTextBlock(c.Text))
			}
		case model.ContentFile:
			if msg.Role != model.RoleUser {
				return "", nil, fmt.Errorf("a file in a %s message", msg.Role)
			}
			b, err := m.fileBlock(c)
			if err != nil {
				return "", nil, err
			}
			out = append(out, b)
		case model.ContentReasoning:
		case model.ContentToolCall:
			if role != "assistant" {
				return "", nil, errors.New("tool call outside an assistant message")
			}
			input := json.RawMessage(c.Input)
			if !json.Valid(input) {
				// The API takes only an object; a malformed input the
				// model produced goes back as an empty one.
				input = json.RawMessage("{}")
			}
			out = append(out, sdk.NewToolUseBlock(c.ToolCallID, input, c.ToolName))
		case model.ContentToolResult:
			if role != "user" {
				return "", nil, errors.New("tool result in an assistant message")
			}
			out = append(out, toolResult(c))
		default:
			return "", nil, fmt.Errorf("unknown content kind %q", c.Kind)
		}
	}
	return role, out, nil
}

// fileBlock maps an attached file to a content block: an image block, a
// PDF document block (base64 or URL) or a plain text document block.
func (m *Model) fileBlock(c model.Content) (sdk.ContentBlockParamUnion, error) {
	kind, err := files.Check("Anthropic", c, m.files, files.Image, files.PDF, files.Text)
	if err != nil {
		return sdk.ContentBlockParamUnion{}, err
	}
	var b sdk.ContentBlockParamUnion
	switch {
	case kind == files.Image && c.URL != "":
		b = sdk.NewImageBlock(sdk.URLImageSourceParam{URL: c.URL})
	case kind == files.Image:
		b = sdk.NewImageBlockBase64(files.MediaType(c), files.Base64(c))
	case kind == files.PDF && c.URL != "":
		b = sdk.NewDocumentBlock(sdk.URLPDFSourceParam{URL: c.URL})
	case kind == files.PDF:
		b = sdk.NewDocumentBlock(sdk.Base64PDFSourceParam{Data: files.Base64(c)})
	case c.URL != "":
		return b, &model.RequestError{Message: fmt.Sprintf("file %s: Anthropic takes a text file only inline, as a base64 data: URL", files.Name(c))}
	default:
		b = sdk.NewDocumentBlock(sdk.PlainTextSourceParam{Data: string(c.Data)})
	}
	if c.Filename != "" && b.OfDocument != nil {
		b.OfDocument.Title = sdk.String(c.Filename)
	}
	return b, nil
}

// toolResult renders a tool result block: a JSON string as its text,
// anything else as its JSON.
func toolResult(c model.Content) sdk.ContentBlockParamUnion {
	text := string(c.Output)
	var s string
	if json.Unmarshal(c.Output, &s) == nil {
		text = s
	}
	if text == "" {
		b := sdk.ToolResultBlockParam{ToolUseID: c.ToolCallID}
		if c.IsError {
			b.IsError = sdk.Bool(true)
		}
		return sdk.ContentBlockParamUnion{OfToolResult: &b}
	}
	return sdk.NewToolResultBlock(c.ToolCallID, text, c.IsError)
}

// inputSchema splits a JSON Schema object into the SDK's input schema.
func inputSchema(raw json.RawMessage) (sdk.ToolInputSchemaParam, error) {
	var s sdk.ToolInputSchemaParam
	if len(raw) == 0 {
		return s, nil
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return s, err
	}
	s.Properties = fields["properties"]
	if req, ok := fields["required"].([]any); ok {
		for _, r := range req {
			if name, ok := r.(string); ok {
				s.Required = append(s.Required, name)
			}
		}
	}
	delete(fields, "type")
	delete(fields, "properties")
	delete(fields, "required")
	if len(fields) > 0 {
		s.ExtraFields = fields
	}
	return s, nil
}

// toolUse accumulates one streamed tool_use block.
type toolUse struct {
	id, name string
	input    strings.Builder
}

// streamState turns stream events into model events.
type streamState struct {
	tools      map[int64]*toolUse // open tool_use blocks by index
	stopReason string
	usage      model.Usage
	done       bool
}

// Event implements retry.Decoder; message_stop completes the stream.
func (st *streamState) Event(ev sdk.MessageStreamEventUnion, send func(model.Event) bool) (ok, done bool) {
	ok = st.event(ev, send)
	return ok, st.done
}

// End implements retry.Decoder: a stream that ends before message_stop
// was cut.
func (st *streamState) End(func(model.Event) bool) (bool, error) {
	return true, fmt.Errorf("stream ended before message_stop: %w", io.ErrUnexpectedEOF)
}

// event handles one stream event. It returns false if send did.
func (st *streamState) event(ev sdk.MessageStreamEventUnion, send func(model.Event) bool) bool {
	switch ev.Type {
	case "message_start":
		u := ev.Message.Usage
		st.usage.InputTokens = int(u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens)
		st.usage.OutputTokens = int(u.OutputTokens)
	case "content_block_start":
		b := ev.ContentBlock
		switch b.Type {
		case "tool_use":
			st.tools[ev.Index] = &toolUse{id: b.ID, name: b.Name}
			return send(model.Event{Kind: model.EventToolCallStart, ToolCallID: b.ID, ToolName: b.Name})
		case "text":
			if b.Text != "" {
				return send(model.Event{Kind: model.EventTextDelta, Text: b.Text})
			}
		case "thinking":
			if b.Thinking != "" {
				return send(model.Event{Kind: model.EventReasoningDelta, Text: b.Thinking})
			}
		}
	case "content_block_delta":
		d := ev.Delta
		switch d.Type {
		case "text_delta":
			if d.Text != "" {
				return send(model.Event{Kind: model.EventTextDelta, Text: d.Text})
			}
		case "thinking_delta":
			if d.Thinking != "" {
				return send(model.Event{Kind: model.EventReasoningDelta, Text: d.Thinking})
			}
		case "input_json_delta":
			tu := st.tools[ev.Index]
			if tu != nil && d.PartialJSON != "" {
				tu.input.WriteString(d.PartialJSON)
				return send(model.Event{Kind: model.EventToolCallDelta, ToolCallID: tu.id, InputDelta: d.PartialJSON})
			}
		}
	case "content_block_stop":
		tu := st.tools[ev.Index]
		if tu == nil {
			break
		}
		delete(st.tools, ev.Index)
		input := tu.input.String()
		if strings.TrimSpace(input) == "" {
			input = "{}"
		}
		return send(model.Event{Kind: model.EventToolCall, ToolCallID: tu.id, ToolName: tu.name, Input: json.RawMessage(input)})
	case "message_delta":
		st.stopReason = string(ev.Delta.StopReason)
		if u := ev.Usage; u.OutputTokens > 0 {
			st.usage.OutputTokens = int(u.OutputTokens)
		}
		if u := ev.Usage; u.InputTokens > 0 {
			st.usage.InputTokens = int(u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens)
		}
	case "message_stop":
		st.done = true
		return send(model.Event{Kind: model.EventFinish, FinishReason: finishReason(st.stopReason), Usage: st.usage})
	}
	return true
}

// finishReason maps an Anthropic stop reason to the AI SDK's vocabulary.
func finishReason(r string) string {
	switch sdk.StopReason(r) {
	case sdk.StopReasonEndTurn, sdk.StopReasonStopSequence:
		return model.FinishStop
	case sdk.StopReasonMaxTokens, sdk.StopReasonModelContextWindowExceeded:
		return model.FinishLength
	case sdk.StopReasonToolUse:
		return model.FinishToolCalls
	case sdk.StopReasonRefusal:
		return model.FinishContentFilter
	}
	return model.FinishOther
}
