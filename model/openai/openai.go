// Package openai is a model.Model for OpenAI and every endpoint that speaks
// the OpenAI chat completions API, built on the official openai-go SDK.
//
// Requests are streamed. Transient failures (HTTP 408, 429, 5xx and
// connection errors) that happen before the first event is yielded are
// retried with exponential backoff, honouring Retry-After within a cap; the
// SDK's own retries are turned off so that this policy is the only one in
// force.
package openai

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/internal/files"
	"github.com/agentry/agentry/model/internal/retry"
)

// DefaultModel is the model used when Config.Model is empty.
const DefaultModel = "gpt-4o-mini"

// Config configures a Model. Zero fields take defaults.
type Config struct {
	// BaseURL is the API root, e.g. "https://api.openai.com/v1/"; empty
	// means the SDK's default (which honours OPENAI_BASE_URL).
	BaseURL string
	// APIKey authenticates requests; empty means the SDK's default (which
	// honours OPENAI_API_KEY).
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
	// MaxImageBytes caps one attached image; zero means
	// DefaultMaxImageBytes. A larger one fails the request with a
	// *model.RequestError before anything is sent.
	MaxImageBytes int
	// MaxPDFBytes caps one attached PDF; zero means 32 MiB.
	MaxPDFBytes int
}

// DefaultMaxImageBytes is the default cap on one attached image (OpenAI
// refuses images over 20 MB).
const DefaultMaxImageBytes = 20 << 20

// ConfigFromEnv returns a Config read from the environment: OPENAI_API_KEY,
// OPENAI_BASE_URL and AGENTRY_MODEL (DefaultModel when unset).
func ConfigFromEnv() Config {
	return Config{
		APIKey:  os.Getenv("OPENAI_API_KEY"),
		BaseURL: os.Getenv("OPENAI_BASE_URL"),
		Model:   cmp.Or(os.Getenv("AGENTRY_MODEL"), DefaultModel),
	}
}

// FromEnv returns a Model configured by ConfigFromEnv.
func FromEnv() *Model { return New(ConfigFromEnv()) }

// Model streams chat completions from an OpenAI-compatible endpoint. It is
// safe for concurrent use.
type Model struct {
	client sdk.Client
	model  string
	policy retry.Policy
	clock  clockwork.Clock
	files  files.Limits
}

var _ model.Model = (*Model)(nil)

// New returns a Model for cfg.
func New(cfg Config) *Model {
	opts := retry.Options(retry.Client{BaseURL: cfg.BaseURL, APIKey: cfg.APIKey, HTTPClient: cfg.HTTPClient},
		option.WithMaxRetries(0), option.WithBaseURL, option.WithAPIKey,
		func(c *http.Client) option.RequestOption { return option.WithHTTPClient(c) })
	clock := retry.RealClock(cfg.Clock)
	return &Model{
		client: sdk.NewClient(opts...),
		model:  cmp.Or(cfg.Model, DefaultModel),
		policy: retry.Policy{MaxRetries: cfg.MaxRetries, Clock: clock},
		clock:  clock,
		files:  files.Limits{MaxImageBytes: cmp.Or(cfg.MaxImageBytes, DefaultMaxImageBytes), MaxPDFBytes: cfg.MaxPDFBytes},
	}
}

// ModelName returns the model id requests use (model.Namer).
func (m *Model) ModelName() string { return m.model }

// Stream implements model.Model.
func (m *Model) Stream(ctx context.Context, req *model.Request) iter.Seq2[model.Event, error] {
	params, err := m.params(req)
	if err != nil {
		return retry.Failed(fmt.Errorf("openai: request: %w", err))
	}
	return retry.SSE(ctx, m.policy, "openai", m.classify,
		func(ctx context.Context) retry.Events[sdk.ChatCompletionChunk] {
			return m.client.Chat.Completions.NewStreaming(ctx, params)
		},
		func() retry.Decoder[sdk.ChatCompletionChunk] { return &streamState{byIndex: map[int64]*toolCall{}} })
}

// classify tells the retry policy which errors are transient.
func (m *Model) classify(err error) (bool, time.Duration) {
	var aerr *sdk.Error
	if errors.As(err, &aerr) {
		if !retry.TransientStatus(aerr.StatusCode) {
			return false, 0
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
func (m *Model) params(req *model.Request) (sdk.ChatCompletionNewParams, error) {
	p := sdk.ChatCompletionNewParams{
		Model:         m.model,
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	}
	if req.MaxTokens > 0 {
		p.MaxCompletionTokens = sdk.Int(int64(req.MaxTokens))
	}
	if req.System != "" {
		p.Messages = append(p.Messages, sdk.SystemMessage(req.System))
	}
	for i, msg := range req.Messages {
		msgs, err := m.messages(msg)
		if err != nil {
			return p, fmt.Errorf("message %d: %w", i, err)
		}
		p.Messages = append(p.Messages, msgs...)
	}
	for _, t := range req.Tools {
		fn := sdk.FunctionDefinitionParam{Name: t.Name}
		if t.Description != "" {
			fn.Description = sdk.String(t.Description)
		}
		if len(t.InputSchema) > 0 {
			var schema map[string]any
			if err := json.Unmarshal(t.InputSchema, &schema); err != nil {
				return p, fmt.Errorf("tool %q: input schema: %w", t.Name, err)
			}
			fn.Parameters = schema
		}
		p.Tools = append(p.Tools, sdk.ChatCompletionFunctionTool(fn))
	}
	return p, nil
}

// messages maps one message to the OpenAI messages that carry it: tool
// results become one tool message each; user text becomes a user message;
// assistant text and tool calls become one assistant message. Reasoning is
// not sent back, as the chat completions API has no place for it.
func (m *Model) messages(msg model.Message) ([]sdk.ChatCompletionMessageParamUnion, error) {
	var (
		out   []sdk.ChatCompletionMessageParamUnion
		texts []string
		calls []sdk.ChatCompletionMessageToolCallUnionParam
		parts []sdk.ChatCompletionContentPartUnionParam // of a user message with files
	)
	for _, c := range msg.Content {
		switch c.Kind {
		case model.ContentText:
			texts = append(texts, c.Text)
			parts = append(parts, sdk.TextContentPart(c.Text))
		case model.ContentFile:
			if msg.Role != model.RoleUser {
				return nil, fmt.Errorf("a file in a %s message", msg.Role)
			}
			part, err := m.filePart(c, len(parts))
			if err != nil {
				return nil, err
			}
			parts = append(parts, part)
		case model.ContentReasoning:
		case model.ContentToolCall:
			args := string(c.Input)
			if args == "" {
				args = "{}"
			}
			calls = append(calls, sdk.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &sdk.ChatCompletionMessageFunctionToolCallParam{
					ID: c.ToolCallID,
					Function: sdk.ChatCompletionMessageFunctionToolCallFunctionParam{
						Name:      c.ToolName,
						Arguments: args,
					},
				},
			})
		case model.ContentToolResult:
			out = append(out, sdk.ToolMessage(outputText(c.Output), c.ToolCallID))
		default:
			return nil, fmt.Errorf("unknown content kind %q", c.Kind)
		}
	}
	text := strings.Join(texts, "\n")
	switch msg.Role {
	case model.RoleUser:
		if len(calls) > 0 {
			return nil, errors.New("tool calls in a user message")
		}
		switch {
		case len(parts) > len(texts):
			out = append(out, sdk.UserMessage(parts))
		case len(texts) > 0:
			out = append(out, sdk.UserMessage(text))
		}
	case model.RoleAssistant:
		if len(texts) == 0 && len(calls) == 0 {
			break
		}
		a := sdk.ChatCompletionAssistantMessageParam{ToolCalls: calls}
		if len(texts) > 0 {
			a.Content.OfString = sdk.String(text)
		}
		out = append(out, sdk.ChatCompletionMessageParamUnion{OfAssistant: &a})
	case model.RoleTool:
		if len(texts) > 0 || len(calls) > 0 {
			return nil, errors.New("tool message with content other than tool results")
		}
	default:
		return nil, fmt.Errorf("unknown role %q", msg.Role)
	}
	return out, nil
}

// filePart maps an attached file to a content part: an image as an
// image_url part (its data as a data: URL, or its own URL), a PDF as a file
// part with its data inline.
func (m *Model) filePart(c model.Content, index int) (sdk.ChatCompletionContentPartUnionParam, error) {
	kind, err := files.Check("OpenAI", c, m.files, files.Image, files.PDF)
	if err != nil {
		return sdk.ChatCompletionContentPartUnionParam{}, err
	}
	if kind == files.Image {
		u := c.URL
		if len(c.Data) > 0 {
			u = "data:" + files.MediaType(c) + ";base64," + files.Base64(c)
		}
		return sdk.ImageContentPart(sdk.ChatCompletionContentPartImageImageURLParam{URL: u}), nil
	}
	if len(c.Data) == 0 {
		return sdk.ChatCompletionContentPartUnionParam{}, &model.RequestError{
			Message: fmt.Sprintf("file %s: OpenAI takes a PDF only inline, as a base64 data: URL", files.Name(c))}
	}
	name := c.Filename
	if name == "" {
		name = fmt.Sprintf("part-%d.pdf", index)
	}
	return sdk.FileContentPart(sdk.ChatCompletionContentPartFileFileParam{
		FileData: sdk.String("data:application/pdf;base64," + files.Base64(c)),
		Filename: sdk.String(name),
	}), nil
}

// outputText renders a tool result for the model: a JSON string as its
// text, anything else as its JSON.
func outputText(out json.RawMessage) string {
	var s string
	if json.Unmarshal(out, &s) == nil {
		return s
	}
	return string(out)
}

// toolCall accumulates one streamed tool call.
type toolCall struct {
	id, name string
	args     strings.Builder
	started  bool
}

// streamState turns chunks into events.
type streamState struct {
	calls        []*toolCall // in order of first appearance
	byIndex      map[int64]*toolCall
	flushed      bool
	finishReason string
	usage        model.Usage
}

// Event implements retry.Decoder.
func (st *streamState) Event(c sdk.ChatCompletionChunk, send func(model.Event) bool) (ok, done bool) {
	return st.chunk(c, send), false
}

// End implements retry.Decoder: the stream's end closes the open tool
// calls and finishes.
func (st *streamState) End(send func(model.Event) bool) (bool, error) {
	return st.finish(send), nil
}

// chunk handles one chunk. It returns false if send did.
func (st *streamState) chunk(c sdk.ChatCompletionChunk, send func(model.Event) bool) bool {
	if c.JSON.Usage.Valid() {
		st.usage = model.Usage{
			InputTokens:  int(c.Usage.PromptTokens),
			OutputTokens: int(c.Usage.CompletionTokens),
		}
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		d := ch.Delta
		if r := reasoning(d); r != "" {
			if !send(model.Event{Kind: model.EventReasoningDelta, Text: r}) {
				return false
			}
		}
		for _, text := range []string{d.Content, d.Refusal} {
			if text != "" && !send(model.Event{Kind: model.EventTextDelta, Text: text}) {
				return false
			}
		}
		for _, tc := range d.ToolCalls {
			if !st.toolCallDelta(tc, send) {
				return false
			}
		}
		if ch.FinishReason != "" {
			st.finishReason = ch.FinishReason
			if !st.flush(send) {
				return false
			}
		}
	}
	return true
}

// toolCallDelta handles a piece of a tool call. OpenAI identifies the
// pieces by index; the id and name come with the first piece.
func (st *streamState) toolCallDelta(d sdk.ChatCompletionChunkChoiceDeltaToolCall, send func(model.Event) bool) bool {
	tc := st.byIndex[d.Index]
	if tc == nil || (d.ID != "" && tc.id != "" && d.ID != tc.id) {
		tc = &toolCall{}
		st.byIndex[d.Index] = tc
		st.calls = append(st.calls, tc)
	}
	if d.ID != "" {
		tc.id = d.ID
	}
	if tc.name == "" {
		tc.name = d.Function.Name
	}
	tc.args.WriteString(d.Function.Arguments)
	switch {
	case !tc.started && tc.id != "" && tc.name != "":
		tc.started = true
		if !send(model.Event{Kind: model.EventToolCallStart, ToolCallID: tc.id, ToolName: tc.name}) {
			return false
		}
		if tc.args.Len() > 0 {
			return send(model.Event{Kind: model.EventToolCallDelta, ToolCallID: tc.id, InputDelta: tc.args.String()})
		}
	case tc.started && d.Function.Arguments != "":
		return send(model.Event{Kind: model.EventToolCallDelta, ToolCallID: tc.id, InputDelta: d.Function.Arguments})
	}
	return true
}

// flush closes the tool calls seen so far, once.
func (st *streamState) flush(send func(model.Event) bool) bool {
	if st.flushed {
		return true
	}
	st.flushed = true
	for i, tc := range st.calls {
		if tc.id == "" {
			tc.id = fmt.Sprintf("call_%d", i)
		}
		input := tc.args.String()
		if strings.TrimSpace(input) == "" {
			input = "{}"
		}
		ev := model.Event{Kind: model.EventToolCall, ToolCallID: tc.id, ToolName: tc.name, Input: json.RawMessage(input)}
		if !send(ev) {
			return false
		}
	}
	return true
}

// finish closes open tool calls and sends EventFinish.
func (st *streamState) finish(send func(model.Event) bool) bool {
	if !st.flush(send) {
		return false
	}
	return send(model.Event{
		Kind:         model.EventFinish,
		FinishReason: finishReason(st.finishReason, len(st.calls) > 0),
		Usage:        st.usage,
	})
}

// finishReason maps an OpenAI finish reason to the AI SDK's vocabulary.
func finishReason(r string, calls bool) string {
	switch r {
	case "stop":
		return model.FinishStop
	case "length":
		return model.FinishLength
	case "tool_calls", "function_call":
		return model.FinishToolCalls
	case "content_filter":
		return model.FinishContentFilter
	case "":
		if calls {
			return model.FinishToolCalls
		}
	}
	return model.FinishOther
}

// reasoning returns visible reasoning that OpenAI-compatible servers (vLLM,
// DeepSeek, OpenRouter, Ollama) stream in a non-standard delta field.
func reasoning(d sdk.ChatCompletionChunkChoiceDelta) string {
	for _, key := range []string{"reasoning_content", "reasoning"} {
		f, ok := d.JSON.ExtraFields[key]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal([]byte(f.Raw()), &s) == nil && s != "" {
			return s
		}
	}
	return ""
}
