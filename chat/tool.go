package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/model"
)

// Tool is a server-side tool a chat agent's model can call. Build one with
// NewTool; the zero Tool is not usable.
type Tool struct {
	// Name is the tool name the model calls.
	Name string
	// Description tells the model what the tool does.
	Description string
	// Title is an optional display name sent with the tool's chunks.
	Title string
	// NeedsApproval, when set, decides for each call whether the user must
	// approve it before it runs (the AI SDK's needsApproval): RequireApproval
	// for every call, ApprovalIf for a function of the input. A call that
	// needs approval is not executed: the turn streams a
	// tool-approval-request and ends waiting for the answer (see
	// Base.AddToolApprovalResponse).
	NeedsApproval ApprovalFunc

	schema   *jsonschema.Schema
	raw      json.RawMessage // the schema as given to NewRawTool, offered unchanged
	resolved *jsonschema.Resolved
	spec     *specCache // the schema's JSON, marshalled once for every copy of t
	exec     func(ctx context.Context, input json.RawMessage) (any, error)
	checks   []func(rt *agent.Runtime) error
	client   bool        // a client-side tool: schema only, answered by the client
	meta     map[any]any // set with WithMeta
}

// WithMeta returns a copy of the tool that carries value under key, for a
// package that builds tools to recognise its own later (agenttool marks
// its tools with the class they run, which the MCP server reads). As with
// context.WithValue, a key should be an unexported type of the package
// that sets it.
func (t Tool) WithMeta(key, value any) Tool {
	m := make(map[any]any, len(t.meta)+1)
	for k, v := range t.meta {
		m[k] = v
	}
	m[key] = value
	t.meta = m
	return t
}

// Meta returns the value the tool carries under key (WithMeta), or nil.
func (t Tool) Meta(key any) any { return t.meta[key] }

// WithCheck returns a copy of the tool with a set-up check: the runtime's
// Start runs it (for the tools a chat class's sample instance returns
// from Tools) and fails on its error. An agent tool checks there that its
// child class is registered.
func (t Tool) WithCheck(check func(rt *agent.Runtime) error) Tool {
	t.checks = append(append([]func(*agent.Runtime) error(nil), t.checks...), check)
	return t
}

// Validator is implemented by tool input types with checks beyond their
// JSON Schema; a returned error is reported to the model as invalid input.
type Validator interface {
	Validate() error
}

// NewTool returns a tool whose input is In, decoded from the model's JSON.
// Its JSON Schema is inferred from In (struct fields without omitempty are
// required; a `jsonschema:"…"` tag is the field's description); every input
// is validated against it, and against In's Validate method if it has one,
// before fn runs. Invalid input, an error returned by fn and a panic in fn
// all become tool errors the model sees; the turn goes on.
func NewTool[In, Out any](name, description string, fn func(ctx context.Context, in In) (Out, error)) Tool {
	schema, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("chat: tool %s: infer input schema: %v", name, err))
	}
	t := Tool{Name: name, Description: description, schema: schema}
	t.exec = func(ctx context.Context, raw json.RawMessage) (any, error) {
		var in In
		if err := json.Unmarshal(raw, &in); err != nil {
			return nil, &InputError{Err: err}
		}
		if v, ok := any(&in).(Validator); ok {
			if err := v.Validate(); err != nil {
				return nil, &InputError{Err: err}
			}
		}
		return fn(ctx, in)
	}
	t.resolve()
	return t
}

// NewRawTool returns a tool whose input JSON Schema is given as JSON and
// offered to the model byte for byte, and whose function gets the model's
// input as raw JSON: a tool from another source, such as an MCP server's.
// The name must be 1–64 letters, digits, '_' or '-', and the schema a JSON
// object. Input is validated against the schema when it resolves (a
// schema that does not, say one with a remote $ref, only requires a JSON
// object, and fn's source must check the rest). Errors and panics of fn
// become tool errors the model sees, as with NewTool.
func NewRawTool(name, description string, schema json.RawMessage, fn func(ctx context.Context, input json.RawMessage) (any, error)) (Tool, error) {
	if !toolNamePattern.MatchString(name) {
		return Tool{}, fmt.Errorf("chat: tool name %q: want 1-64 letters, digits, '_' or '-'", name)
	}
	if fn == nil {
		return Tool{}, fmt.Errorf("chat: tool %s: no function", name)
	}
	s := &jsonschema.Schema{}
	if err := json.Unmarshal(schema, s); err != nil {
		return Tool{}, fmt.Errorf("chat: tool %s: input schema is not a JSON Schema object: %w", name, err)
	}
	t := Tool{Name: name, Description: description, schema: s, raw: append(json.RawMessage(nil), schema...), exec: fn}
	if r, err := s.Resolve(nil); err == nil {
		t.resolved = r
	} else if t.resolved, err = (&jsonschema.Schema{Type: "object"}).Resolve(nil); err != nil {
		return Tool{}, fmt.Errorf("chat: tool %s: %w", name, err)
	}
	return t, nil
}

// WithSchema returns a copy of t whose input schema was adjusted by edit,
// for constraints a Go type cannot express (a minimum length, an enum).
func (t Tool) WithSchema(edit func(s *jsonschema.Schema)) Tool {
	t.schema = t.schema.CloneSchemas()
	t.raw = nil
	edit(t.schema)
	t.resolve()
	return t
}

// WithTitle returns a copy of t with a display title.
func (t Tool) WithTitle(title string) Tool {
	t.Title = title
	return t
}

func (t *Tool) resolve() {
	r, err := t.schema.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("chat: tool %s: resolve input schema: %v", t.Name, err))
	}
	t.resolved = r
	t.spec = &specCache{}
}

// specCache holds a tool's input schema as JSON once Spec marshalled it:
// a tool an agent builds once is offered to the model at every turn.
type specCache struct {
	mu   sync.Mutex
	data json.RawMessage
}

// of returns s marshalled, the first time only.
func (c *specCache) of(s *jsonschema.Schema) json.RawMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.data == nil {
		c.data, _ = json.Marshal(s)
	}
	return c.data
}

// Schema returns the tool's input JSON Schema, to read: see WithSchema
// for changing it.
func (t Tool) Schema() *jsonschema.Schema { return t.schema }

// Spec returns the tool as offered to a model. The input schema is
// marshalled on the first call, once for the tool and its copies; change a
// schema with WithSchema, which makes a new tool, not through the pointer
// Schema returns.
func (t Tool) Spec() model.ToolSpec {
	data := t.raw
	switch {
	case data != nil:
	case t.spec != nil:
		data = t.spec.of(t.schema)
	default:
		data, _ = json.Marshal(t.schema)
	}
	return model.ToolSpec{Name: t.Name, Description: t.Description, InputSchema: data}
}

// InputError reports tool input that failed validation.
type InputError struct{ Err error }

func (e *InputError) Error() string { return "invalid tool input: " + e.Err.Error() }

func (e *InputError) Unwrap() error { return e.Err }

// Validate checks input against the tool's schema.
func (t Tool) Validate(input json.RawMessage) error {
	var v any
	if err := json.Unmarshal(input, &v); err != nil {
		return &InputError{Err: fmt.Errorf("not JSON: %w", err)}
	}
	if err := t.resolved.Validate(v); err != nil {
		return &InputError{Err: err}
	}
	return nil
}

// Execute validates input and runs the tool. A panic is returned as an
// error.
func (t Tool) Execute(ctx context.Context, input json.RawMessage) (out any, err error) {
	if t.exec == nil {
		return nil, errors.New("chat: tool " + t.Name + " has no function")
	}
	if err := t.Validate(input); err != nil {
		return nil, err
	}
	ctx, end := startToolSpan(ctx, t.Name)
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("tool %s panicked: %v", t.Name, p)
			loggerOf(ctx).ErrorContext(ctx, "chat: tool panicked", "tool", t.Name, "panic", p, "stack", string(debug.Stack()))
		}
		end(err)
	}()
	return t.exec(ctx, input)
}

// ToolCall identifies the tool call being executed.
type ToolCall struct {
	ID    string
	Name  string
	Input json.RawMessage
}

type toolCallKey struct{}

// ToolCallFromContext returns the tool call a tool function is executing
// for; ok is false outside a tool call.
func ToolCallFromContext(ctx context.Context) (ToolCall, bool) {
	tc, ok := ctx.Value(toolCallKey{}).(ToolCall)
	return tc, ok
}

// WithToolCall returns a context carrying tc.
func WithToolCall(ctx context.Context, tc ToolCall) context.Context {
	return context.WithValue(ctx, toolCallKey{}, tc)
}

// loggerOf returns the logger of the agent whose code runs in ctx, or a
// logger that discards (a tool executed outside any agent has no runtime
// to log through; its panic is still returned as an error).
func loggerOf(ctx context.Context) *slog.Logger {
	if a, ok := agent.FromContext(ctx); ok {
		return agent.BaseOf(a).Logger()
	}
	return slog.New(slog.DiscardHandler)
}
