// Package chat makes agents chat-capable: UI transcripts, one turn at a
// time in order, a model/tool loop with a step limit, headless turns
// (SaveMessages), idempotent submissions (SubmitMessages), resumable streams
// with per-stream sequence numbers persisted in batches, crash recovery,
// cancel and clear. A chunk reaches clients only after its commit (the
// output gate), and a turn's tools and handler are inputs of the instance
// (see agent and docs/concurrency.md). It speaks the protocol of the npm chat clients
// (useAgentChat, WebSocketChatTransport).
//
// Tools write data parts, transient data and preliminary output into their
// turn's stream (ToolStream), and assistant messages carry metadata: their
// creation time, model, finish reason and token usage, the usage of the
// agent-tool runs below them, and the application's own
// (MetadataProvider).
//
// A chat agent embeds Base and is written one of two ways:
//
//   - declaratively: it implements SystemPrompt, Tools and (or relies on the
//     runtime default for) ChatModel, and the framework runs the loop;
//   - with its own handler: it implements OnChatMessage and writes the
//     turn's chunk stream itself, optionally running the loop inside it.
package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
)

// Hooks of a chat agent, all optional; the framework finds them by type
// assertion on the agent value.

// ModelProvider gives a declarative chat agent its model. Without it the
// runtime default (Config.Model) is used.
type ModelProvider interface {
	ChatModel() model.Model
}

// SystemPrompter gives a declarative chat agent its system prompt.
type SystemPrompter interface {
	SystemPrompt() string
}

// ToolProvider gives a declarative chat agent its server-side tools.
type ToolProvider interface {
	Tools() []Tool
}

// StepLimiter caps the model steps of one turn (default 10).
type StepLimiter interface {
	MaxSteps() int
}

// Handler is implemented by chat agents that write their turns themselves
// (the AIChatAgent style). OnChatMessage writes the turn's chunks with
// t.Write (or runs the framework loop with t.RunLoop); the framework sends
// the start and finish chunks, persists the message and ends the turn.
type Handler interface {
	OnChatMessage(ctx context.Context, t *Turn) error
}

// Recovery says what to do with a turn the process died in.
type Recovery int

const (
	// RecoverContinue keeps the turn's completed steps (their tool calls
	// are not run again) and continues it from the last step boundary; with
	// no completed step it is the same as RecoverRetry. The default.
	RecoverContinue Recovery = iota
	// RecoverRetry discards the partial answer and runs the turn again.
	RecoverRetry
	// RecoverAbandon ends the turn with outcome error.
	RecoverAbandon
)

// RecoveryPolicy lets an agent choose how its interrupted turns recover,
// given the partial assistant message that was persisted.
type RecoveryPolicy interface {
	RecoverTurn(ctx context.Context, partial message.Message) Recovery
}

// TurnObserver is told when a turn ends.
type TurnObserver interface {
	OnTurnEnd(ctx context.Context, r TurnResult)
}

// Config is the runtime-wide chat configuration, set with Configure.
type Config struct {
	// Model is the default model of declarative agents that do not
	// implement ChatModel.
	Model model.Model
	// Retention is how long a finished stream's chunks are kept for
	// clients that resume late; zero means 10 minutes.
	Retention time.Duration
	// FlushInterval is the output gate's batching window: a streamed
	// chunk reaches clients only once it is committed (with the chunks
	// around it, in one transaction), and a stream commits at most once
	// per window unless FlushChunks chunks wait. The first chunk of a
	// quiet stream is committed at once, so the gate adds at most one
	// window (plus a commit) of latency. Zero means 100 ms; a negative
	// value commits as soon as the previous commit is done.
	FlushInterval time.Duration
	// FlushChunks is the most chunks one transaction writes, and the
	// batch size that ends the batching window early; zero means 64.
	FlushChunks int
	// MaxQueuedRequests is how many turns may wait behind the running one
	// before a client's further chat requests are refused (with an error
	// response; turns submitted from Go, such as agent-tool notices, are
	// never refused). Zero means 16; negative means no limit.
	MaxQueuedRequests int
	// MaxTurnsInFlight is how many chat turns (every instance's: running
	// or queued, clients' requests, agent-tool children and notices alike)
	// may be in flight on this runtime, the node, before a client's
	// further chat requests are refused (with an error response; turns
	// submitted from Go are never refused, and count). Zero means
	// DefaultMaxTurnsInFlight; negative means no limit.
	MaxTurnsInFlight int
	// Recovery holds the runtime's recovery budgets of interrupted turns
	// (zero fields: the defaults); a class's RecoveryBudgets override
	// them field by field.
	Recovery RecoveryBudgets
}

type configKey struct{}

// Configure sets the runtime-wide chat configuration. Call it before
// Start; after it, Configure returns agent.ErrStarted and changes nothing.
// It also has the runtime check the chat classes when they are registered
// and at Start: a method named as a chat hook (SystemPrompt, Tools, …) with
// another signature, or a tool whose check fails (an agent tool of a class
// that is not registered), is an error.
func Configure(rt *agent.Runtime, cfg Config) error {
	if rt.Started() {
		return fmt.Errorf("chat: Configure: %w", agent.ErrStarted)
	}
	if cfg.Retention == 0 {
		cfg.Retention = 10 * time.Minute
	}
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = defaultFlushInterval
	}
	if cfg.FlushChunks == 0 {
		cfg.FlushChunks = 64
	}
	if cfg.MaxQueuedRequests == 0 {
		cfg.MaxQueuedRequests = DefaultMaxQueuedRequests
	}
	if cfg.MaxTurnsInFlight == 0 {
		cfg.MaxTurnsInFlight = DefaultMaxTurnsInFlight
	}
	rt.SetValue(configKey{}, cfg)
	if _, done := rt.Value(checksKey{}).(bool); done {
		return nil
	}
	rt.SetValue(checksKey{}, true)
	if err := rt.DeclareHooks(hooks...); err != nil {
		return err
	}
	return rt.AddCheck(func(context.Context) error { return checkTools(rt) })
}

type checksKey struct{}

var baseType = reflect.TypeFor[Base]()

// hooks are the chat layer's hook interfaces, which only classes that
// embed Base call.
var hooks = []agent.Hook{
	agent.HookFor[ModelProvider](baseType),
	agent.HookFor[SystemPrompter](baseType),
	agent.HookFor[ToolProvider](baseType),
	agent.HookFor[StepLimiter](baseType),
	agent.HookFor[Handler](baseType),
	agent.HookFor[RecoveryPolicy](baseType),
	agent.HookFor[TurnObserver](baseType),
	agent.HookFor[RecoveryBudgeter](baseType),
	agent.HookFor[RecoveryGuard](baseType),
	agent.HookFor[RecoveryExhaustedObserver](baseType),
	agent.HookFor[MetadataProvider](baseType),
}

// checkTools runs the checks of the tools that each chat class's sample
// instance (a fresh one from its New, not hydrated) returns from Tools. A
// Tools method that cannot run on such an instance (it panics) is skipped:
// its tools are checked when they run.
func checkTools(rt *agent.Runtime) error {
	var errs []error
	for _, c := range rt.Classes() {
		p, ok := c.New().(ToolProvider)
		if !ok {
			continue
		}
		var tools []Tool
		func() {
			defer func() { _ = recover() }()
			tools = p.Tools()
		}()
		for _, t := range tools {
			for _, check := range t.checks {
				if err := check(rt); err != nil {
					errs = append(errs, fmt.Errorf("chat: class %s: tool %s: %w", c.Name, t.Name, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

func configOf(rt *agent.Runtime) Config {
	if c, ok := rt.Value(configKey{}).(Config); ok {
		return c
	}
	return Config{Retention: 10 * time.Minute, FlushInterval: defaultFlushInterval, FlushChunks: 64,
		MaxQueuedRequests: DefaultMaxQueuedRequests, MaxTurnsInFlight: DefaultMaxTurnsInFlight}
}

// DefaultMaxQueuedRequests is Config.MaxQueuedRequests's default.
const DefaultMaxQueuedRequests = 16

// ErrTooManyQueued refuses a client's chat request while
// Config.MaxQueuedRequests turns already wait.
var ErrTooManyQueued = errors.New("chat: too many requests queued")

const defaultFlushInterval = 100 * time.Millisecond

// TurnResult is how a turn ended.
type TurnResult struct {
	// ID is the turn's request (stream) id.
	ID string
	// Outcome is completed, error, aborted or skipped.
	Outcome string
	// Error is the error text of an error outcome.
	Error string
	// Message is the assistant message the turn produced (possibly
	// partial, for aborted and error outcomes; empty when it produced
	// nothing).
	Message message.Message
	// Exhausted is set when recovery gave up on the turn (it was sealed:
	// outcome error, Error the terminal message, which also ends Message).
	Exhausted ExhaustReason
	// Usage counts the tokens of the message's own model calls (of every
	// turn that wrote it: a continuation's include the turn before).
	Usage Usage
	// TreeUsage is Usage plus the usage of the agent-tool runs the turn
	// awaited, each with its own children: the whole delegation tree.
	TreeUsage Usage
	// Waiting lists the tool calls a completed turn ended waiting for:
	// approvals and client tools' outputs. Their answers continue the
	// message in a continuation turn (see AddToolApprovalResponse).
	Waiting []WaitingCall
}

// Text returns the concatenated text parts of the turn's message.
func (r TurnResult) Text() string { return MessageText(r.Message) }

// MessageText returns the concatenated text of a message's text parts.
func MessageText(m message.Message) string {
	var s string
	for _, p := range message.Visible(m.Parts) {
		if p.Type == message.PartText {
			s += p.Text
		}
	}
	return s
}

// messagesFrame is a wire.ChatMessages frame.
type messagesFrame struct {
	Type     string            `json:"type"`
	Messages []message.Message `json:"messages"`
	Connect  bool              `json:"connect,omitempty"`
}

func encode(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic("chat: encode frame: " + err.Error())
	}
	return data
}
