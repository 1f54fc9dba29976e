// Package scripted is a deterministic model.Model for tests and offline
// demos. It answers from rules over the conversation: the first Rule whose
// Match accepts the request supplies the Reply, else the default reply does.
// A Reply is a list of steps (text, reasoning, tool calls, or an error that
// fails the stream) that the model streams in chunks, optionally waiting a
// fixed delay between chunks on an injectable clock.
package scripted

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/model"
)

// DefaultChunkSize is the most characters a text, reasoning or tool input
// event carries unless WithChunkSize says otherwise.
const DefaultChunkSize = 8

// StepKind says what a Step produces.
type StepKind string

// Kinds of Step.
const (
	StepText      StepKind = "text"
	StepReasoning StepKind = "reasoning"
	StepToolCall  StepKind = "tool-call"
	StepError     StepKind = "error"
)

// Step is one part of a Reply. Build steps with Text, Reasoning, ToolCall
// and Fail.
type Step struct {
	Kind StepKind
	// Text is the answer or reasoning text of StepText and StepReasoning.
	Text string
	// ToolCallID is the id of a StepToolCall; empty means one derived from
	// the request (see ToolCall).
	ToolCallID string
	// ToolName is the tool a StepToolCall calls.
	ToolName string
	// Input is the JSON input of a StepToolCall.
	Input json.RawMessage
	// Err is the error a StepError fails the stream with.
	Err error
}

// Text returns a step that streams s as answer text.
func Text(s string) Step { return Step{Kind: StepText, Text: s} }

// Reasoning returns a step that streams s as visible reasoning.
func Reasoning(s string) Step { return Step{Kind: StepReasoning, Text: s} }

// ToolCall returns a step that calls the tool name with input, which is used
// as is when it is a json.RawMessage and marshalled to JSON otherwise (a
// value that cannot be marshalled gives a step that fails the stream). The
// call's id is "call_<m>_<i>", where m is the number of messages in the
// request and i the call's position among the reply's tool calls, so ids are
// stable across runs; use WithID to choose one. The same request asked again
// (a turn whose call a restart cut, recovered) repeats the id; chat gives
// such a repeated call a fresh id, so a conversation never holds two calls
// with one id.
func ToolCall(name string, input any) Step {
	raw, ok := input.(json.RawMessage)
	if !ok {
		b, err := json.Marshal(input)
		if err != nil {
			return Fail(fmt.Errorf("scripted: tool call %q: input: %w", name, err))
		}
		raw = b
	}
	return Step{Kind: StepToolCall, ToolName: name, Input: raw}
}

// Fail returns a step that ends the stream with err, after the steps before
// it were streamed.
func Fail(err error) Step { return Step{Kind: StepError, Err: err} }

// WithID returns a copy of a tool call step with the given id.
func (s Step) WithID(id string) Step {
	s.ToolCallID = id
	return s
}

// Reply is what the model streams for one request, in order.
type Reply []Step

// Rule answers the requests that Match accepts.
type Rule struct {
	// Name identifies the rule in Calls.
	Name string
	// Match reports whether the rule applies; nil matches every request.
	Match func(*model.Request) bool
	// Reply returns the answer; nil means an empty answer.
	Reply func(*model.Request) Reply
}

// Call records one request the model answered and the rule that answered
// it; Rule is empty for the default reply.
type Call struct {
	Rule    string
	Request *model.Request
}

// Option configures a Model.
type Option func(*Model)

// WithRules appends rules, evaluated in order after those added before.
func WithRules(rules ...Rule) Option {
	return func(m *Model) { m.rules = append(m.rules, rules...) }
}

// WithDefault sets the reply for requests no rule matches. Without it the
// model echoes the last user text: "You said: <text>".
func WithDefault(reply func(*model.Request) Reply) Option {
	return func(m *Model) { m.def = reply }
}

// WithChunkSize sets the most characters one event carries; n < 1 means
// DefaultChunkSize.
func WithChunkSize(n int) Option {
	return func(m *Model) { m.chunk = n }
}

// WithDelay sets the wait between two events; zero means none.
func WithDelay(d time.Duration) Option {
	return func(m *Model) { m.delay = d }
}

// DefaultMaxCalls is how many answered requests a Model keeps for Calls
// unless WithMaxCalls says otherwise.
const DefaultMaxCalls = 1000

// WithMaxCalls sets how many answered requests the model keeps for Calls,
// the newest: n == 0 means DefaultMaxCalls, n < 0 keeps none (a model that
// serves for a long time, as the demo's, and that nobody inspects).
func WithMaxCalls(n int) Option {
	return func(m *Model) { m.maxCalls = n }
}

// WithClock sets the clock the delay is measured on; the default is the
// real clock.
func WithClock(c clockwork.Clock) Option {
	return func(m *Model) { m.clock = c }
}

// Model is a deterministic model.Model. It is safe for concurrent use.
type Model struct {
	rules []Rule
	def   func(*model.Request) Reply
	chunk int
	delay time.Duration
	clock clockwork.Clock

	maxCalls int // how many calls are kept; < 0: none
	mu       sync.Mutex
	calls    []Call
}

var (
	_ model.Model     = (*Model)(nil)
	_ model.Continuer = (*Model)(nil)
)

// New returns a Model configured by opts.
func New(opts ...Option) *Model {
	m := &Model{}
	for _, o := range opts {
		o(m)
	}
	if m.chunk < 1 {
		m.chunk = DefaultChunkSize
	}
	if m.clock == nil {
		m.clock = clockwork.NewRealClock()
	}
	if m.maxCalls == 0 {
		m.maxCalls = DefaultMaxCalls
	}
	if m.def == nil {
		m.def = func(req *model.Request) Reply { return Reply{Text("You said: " + LastUserText(req))} }
	}
	return m
}

// Calls returns the requests answered so far, oldest first: the newest
// DefaultMaxCalls of them, or as many as WithMaxCalls says.
func (m *Model) Calls() []Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maxCalls < 0 {
		return nil
	}
	return append([]Call(nil), m.calls[max(0, len(m.calls)-m.maxCalls):]...)
}

// record keeps c (with a copy of its request) for Calls. Past twice the
// limit the oldest are forgotten, so keeping costs a copy now and then,
// not one per call.
func (m *Model) record(c Call) {
	if m.maxCalls < 0 {
		return
	}
	c.Request = clone(c.Request)
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.calls) >= 2*m.maxCalls {
		n := copy(m.calls, m.calls[len(m.calls)-m.maxCalls:])
		clear(m.calls[n:])
		m.calls = m.calls[:n]
	}
	m.calls = append(m.calls, c)
}

// ModelName returns "scripted" (model.Namer).
func (m *Model) ModelName() string { return "scripted" }

// Stream implements model.Model. It picks the reply when the loop starts,
// then streams it: each text or reasoning step as chunks, each tool call as
// a start, its input in chunks and the whole call, and finally a finish
// whose reason is tool-calls if the reply ends with a tool call and stop
// otherwise. An error step ends the stream with that error. Between two
// events the model waits the configured delay, and it stops with ctx's error
// as soon as ctx ends.

func (m *Model) Stream(ctx context.Context, req *model.Request) iter.Seq2[model.Event, error] {
	return func(yield func(model.Event, error) bool) {
		name, reply := m.answer(req)
		m.record(Call{Rule: name, Request: req})

		first := true
		send := func(ev model.Event) bool {
			if err := m.pause(ctx, first); err != nil {
				yield(model.Event{}, fmt.Errorf("scripted: stream: %w", err))
				return false
			}
			first = false
			return yield(ev, nil)
		}
		calls := 0
		for _, s := range reply {
			switch s.Kind {
			case StepText, StepReasoning:
				kind := model.EventTextDelta
				if s.Kind == StepReasoning {
					kind = model.EventReasoningDelta
				}
				for _, c := range chunks(s.Text, m.chunk) {
					if !send(model.Event{Kind: kind, Text: c}) {
						return
					}
				}
			case StepToolCall:
				id := s.ToolCallID
				if id == "" {
					id = fmt.Sprintf("call_%d_%d", len(req.Messages), calls)
				}
				calls++
				if !send(model.Event{Kind: model.EventToolCallStart, ToolCallID: id, ToolName: s.ToolName}) {
					return
				}
				for _, c := range chunks(string(s.Input), m.chunk) {
					if !send(model.Event{Kind: model.EventToolCallDelta, ToolCallID: id, InputDelta: c}) {
						return
					}
				}
				input := s.Input
				if len(input) == 0 {
					input = json.RawMessage("{}")
				}
				if !send(model.Event{Kind: model.EventToolCall, ToolCallID: id, ToolName: s.ToolName, Input: input}) {
					return
				}
			case StepError:
				if err := m.pause(ctx, first); err != nil {
					yield(model.Event{}, fmt.Errorf("scripted: stream: %w", err))
					return
				}
				yield(model.Event{}, fmt.Errorf("scripted: stream: %w", s.Err))
				return
			default:
				yield(model.Event{}, fmt.Errorf("scripted: unknown step kind %q", s.Kind))
				return
			}
		}
		reason := model.FinishStop
		if n := len(reply); n > 0 && reply[n-1].Kind == StepToolCall {
			reason = model.FinishToolCalls
		}
		send(model.Event{Kind: model.EventFinish, FinishReason: reason, Usage: usage(req, reply)})
	}
}

// ContinuesAnswers reports true (model.Continuer): asked with a
// conversation that ends with a cut answer, the model goes on from where
// it stops.
func (m *Model) ContinuesAnswers() bool { return true }

// answer returns the rule name and the reply for req. A request that ends
// with assistant messages is a cut answer to continue (model.Continuer;
// several messages when it was cut and continued more than once): the
// reply is the one the conversation before those messages gets, without
// the part of it they already hold, so the answer goes on where it stops
// and is not said twice. When the cut answer is not the beginning of that
// reply, the request is answered as it is.
func (m *Model) answer(req *model.Request) (string, Reply) {
	n := len(req.Messages)
	for n > 0 && req.Messages[n-1].Role == model.RoleAssistant {
		n--
	}
	if n < len(req.Messages) {
		var cut []model.Content
		for _, msg := range req.Messages[n:] {
			cut = append(cut, msg.Content...)
		}
		before := *req
		before.Messages = req.Messages[:n]
		name, reply := m.pick(&before)
		if rest, ok := continueReply(reply, cut); ok {
			return name, rest
		}
	}
	return m.pick(req)
}

// continueReply returns what follows the cut answer in reply: cut must be
// reply's text and reasoning from its beginning, the last of them possibly
// cut short.
func continueReply(reply Reply, cut []model.Content) (Reply, bool) {
	reply = mergeText(reply)
	var merged []model.Content
	for _, c := range cut {
		if n := len(merged); n > 0 && merged[n-1].Kind == c.Kind && (c.Kind == model.ContentText || c.Kind == model.ContentReasoning) {
			merged[n-1].Text += c.Text
			continue
		}
		merged = append(merged, c)
	}
	cut = merged
	k := 0
	for i, c := range cut {
		kind := StepText
		switch c.Kind {
		case model.ContentText:
		case model.ContentReasoning:
			kind = StepReasoning
		default:
			return nil, false
		}
		if k >= len(reply) || reply[k].Kind != kind || !strings.HasPrefix(reply[k].Text, c.Text) {
			return nil, false
		}
		if len(c.Text) < len(reply[k].Text) {
			if i != len(cut)-1 {
				return nil, false
			}
			s := reply[k]
			s.Text = s.Text[len(c.Text):]
			return append(Reply{s}, reply[k+1:]...), true
		}
		k++
	}
	return reply[k:], true
}

// mergeText joins adjacent text steps, and adjacent reasoning steps, as
// they stream into one part.
func mergeText(reply Reply) Reply {
	var out Reply
	for _, s := range reply {
		if n := len(out); n > 0 && (s.Kind == StepText || s.Kind == StepReasoning) && out[n-1].Kind == s.Kind {
			out[n-1].Text += s.Text
			continue
		}
		out = append(out, s)
	}
	return out
}

// pick returns the name and reply of the first matching rule, or the
// default reply with an empty name.
func (m *Model) pick(req *model.Request) (string, Reply) {
	for _, r := range m.rules {
		if r.Match != nil && !r.Match(req) {
			continue
		}
		if r.Reply == nil {
			return r.Name, nil
		}
		return r.Name, r.Reply(req)
	}
	return "", m.def(req)
}

// pause waits the delay before every event but the first, and reports ctx's
// error if ctx has ended.
func (m *Model) pause(ctx context.Context, first bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if first || m.delay <= 0 {
		return nil
	}
	t := m.clock.NewTimer(m.delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.Chan():
		return nil
	}
}

// chunks splits s into pieces of at most n characters.
func chunks(s string, n int) []string {
	var out []string
	for s != "" {
		i, count := 0, 0
		for i < len(s) && count < n {
			_, size := utf8.DecodeRuneInString(s[i:])
			i += size
			count++
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out
}

// usage estimates token counts deterministically: one token per four
// characters of input and output text.
func usage(req *model.Request, reply Reply) model.Usage {
	in := utf8.RuneCountInString(req.System)
	for _, msg := range req.Messages {
		for _, c := range msg.Content {
			in += utf8.RuneCountInString(c.Text) + len(c.Input) + len(c.Output)
		}
	}
	out := 0
	for _, s := range reply {
		out += utf8.RuneCountInString(s.Text) + len(s.Input)
	}
	return model.Usage{InputTokens: (in + 3) / 4, OutputTokens: (out + 3) / 4}
}

// clone copies req deeply enough that later changes to the caller's
// messages do not show in Calls.
func clone(req *model.Request) *model.Request {
	c := *req
	c.Messages = make([]model.Message, len(req.Messages))
	for i, msg := range req.Messages {
		msg.Content = append([]model.Content(nil), msg.Content...)
		c.Messages[i] = msg
	}
	c.Tools = append([]model.ToolSpec(nil), req.Tools...)
	return &c
}

// LastUserText returns the text of the last user message of req, its text
// parts joined by newlines, or "" if there is none.
func LastUserText(req *model.Request) string {
	for i := len(req.Messages) - 1; i >= 0; i-- {
		msg := req.Messages[i]
		if msg.Role != model.RoleUser {
			continue
		}
		var parts []string
		for _, c := range msg.Content {
			if c.Kind == model.ContentText {
				parts = append(parts, c.Text)
			}
		}
		if len(parts) > 0 {
			return strings.Join(parts, "\n")
		}
	}
	return ""
}

// LastIsToolResult reports whether the last message of req carries tool
// results, that is, whether the model is being asked to continue after its
// tools ran.
func LastIsToolResult(req *model.Request) bool {
	if len(req.Messages) == 0 {
		return false
	}
	for _, c := range req.Messages[len(req.Messages)-1].Content {
		if c.Kind == model.ContentToolResult {
			return true
		}
	}
	return false
}

// ToolResults returns the tool results of the last step: those in the
// messages after the last assistant message, in order. It returns nil when
// the last message carries no tool results.
func ToolResults(req *model.Request) []model.Content {
	if !LastIsToolResult(req) {
		return nil
	}
	start := 0
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == model.RoleAssistant {
			start = i + 1
			break
		}
	}
	var out []model.Content
	for _, msg := range req.Messages[start:] {
		for _, c := range msg.Content {
			if c.Kind == model.ContentToolResult {
				out = append(out, c)
			}
		}
	}
	return out
}

// LastUserContains returns a matcher for requests whose last user text
// contains substr.
func LastUserContains(substr string) func(*model.Request) bool {
	return func(req *model.Request) bool { return strings.Contains(LastUserText(req), substr) }
}

// Always returns a reply function that always answers with r, for Rule.Reply
// and WithDefault.
func Always(r Reply) func(*model.Request) Reply {
	return func(*model.Request) Reply { return r }
}

// CountToolResults counts the tool results in the whole conversation of
// req (every step so far), for scripted agents that act by step number.
func CountToolResults(req *model.Request) int {
	n := 0
	for _, m := range req.Messages {
		for _, c := range m.Content {
			if c.Kind == model.ContentToolResult {
				n++
			}
		}
	}
	return n
}

// ReportToolResults returns a rule, named "after-tools", that answers a
// request whose last message carries tool results with one text: "after: "
// and then "[NAME error=BOOL OUTPUT]" for each result of the last step,
// separated by spaces. Tests put it first so that a model which called
// tools reports what they returned.
func ReportToolResults() Rule {
	return Rule{
		Name:  "after-tools",
		Match: LastIsToolResult,
		Reply: func(req *model.Request) Reply {
			var parts []string
			for _, r := range ToolResults(req) {
				parts = append(parts, fmt.Sprintf("[%s error=%v %s]", r.ToolName, r.IsError, r.Output))
			}
			return Reply{Text("after: " + strings.Join(parts, " "))}
		},
	}
}
