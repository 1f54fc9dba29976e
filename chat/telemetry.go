package chat

import (
	"context"
	"iter"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/model"
)

// Span and metric attribute keys of the chat layer. The model's follow the
// OpenTelemetry semantic conventions for generative AI.
const (
	attrTurn         = attribute.Key("agentry.chat.turn")
	attrRecovering   = attribute.Key("agentry.chat.recovering")
	attrOutcome      = attribute.Key("agentry.chat.outcome")
	attrTool         = attribute.Key("gen_ai.tool.name")
	attrToolCall     = attribute.Key("gen_ai.tool.call.id")
	attrInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	attrOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	attrTokenType    = attribute.Key("gen_ai.token.type")
	attrFinish       = attribute.Key("gen_ai.response.finish_reasons")
)

// outcomeInterrupted is the span and metric outcome of a turn that the
// runtime's shutdown left unfinished (it recovers with the next process).
const outcomeInterrupted = "interrupted"

// instruments are the chat layer's metrics, one set per runtime.
type instruments struct {
	turns         metric.Int64Counter
	turnDuration  metric.Float64Histogram
	queued        metric.Int64UpDownCounter
	tokens        metric.Int64Counter
	modelDuration metric.Float64Histogram
}

type instrumentsKey struct{}

func instrumentsOf(rt *agent.Runtime) *instruments {
	return rt.ValueOr(instrumentsKey{}, func() any {
		m := rt.Meter()
		in := &instruments{}
		// Errors come only from invalid names; the instruments are
		// usable no-ops even then.
		in.turns, _ = m.Int64Counter("agentry.chat.turns",
			metric.WithDescription("Chat turns ended, by outcome"), metric.WithUnit("{turn}"))
		in.turnDuration, _ = m.Float64Histogram("agentry.chat.turn.duration",
			metric.WithDescription("Duration of chat turns, from acceptance to end"), metric.WithUnit("s"))
		in.queued, _ = m.Int64UpDownCounter("agentry.chat.queue.depth",
			metric.WithDescription("Chat turns queued behind a running turn"), metric.WithUnit("{turn}"))
		in.tokens, _ = m.Int64Counter("agentry.model.tokens",
			metric.WithDescription("Tokens used by model calls"), metric.WithUnit("{token}"))
		in.modelDuration, _ = m.Float64Histogram("agentry.model.duration",
			metric.WithDescription("Duration of model calls"), metric.WithUnit("s"))
		return in
	}).(*instruments)
}

// startTurnSpan starts the span of a turn, a child of the span that
// submitted it (row.TraceParent, stored with the turn, so that a turn
// recovered after a restart joins its trace too). It returns ctx with the
// span.
func (c *core) startTurnSpan(ctx context.Context, t *turn) context.Context {
	ctx, t.span = c.rt.Tracer().Start(agent.WithTraceParent(ctx, t.row.TraceParent), "chat.turn",
		trace.WithAttributes(agent.AttrAgent.String(c.b.Path().String()), agent.AttrClass.String(c.b.ClassName()),
			attrTurn.String(t.row.ID)))
	t.began = c.rt.Clock().Now()
	instrumentsOf(c.rt).queued.Add(ctx, 1)
	t.inQueue = true
	return ctx
}

// dequeued counts turns out of the queue-depth gauge, each once: taken
// by the worker, cancelled, cleared, or left queued when the runtime
// shuts down (they run again after the restart, counted by that
// process). c.mu held.
func (c *core) dequeued(ts ...*turn) {
	n := 0
	for _, t := range ts {
		if t.inQueue {
			t.inQueue = false
			n++
		}
	}
	if n > 0 {
		instrumentsOf(c.rt).queued.Add(c.rt.Context(), -int64(n))
	}
}

// endTurnSpan ends a turn's span and counts the turn.
func (c *core) endTurnSpan(t *turn, outcome, errText string) {
	if t.span == nil {
		return
	}
	ins := instrumentsOf(c.rt)
	attrs := metric.WithAttributes(agent.AttrClass.String(c.b.ClassName()), attrOutcome.String(outcome))
	ins.turns.Add(t.ctx, 1, attrs)
	ins.turnDuration.Record(t.ctx, c.rt.Clock().Since(t.began).Seconds(), attrs)
	t.span.SetAttributes(attrOutcome.String(outcome), attrRecovering.Bool(t.recovering))
	if outcome == OutcomeError {
		t.span.SetStatus(codes.Error, errText)
	}
	t.span.End()
}

// streamModel calls m in a span of its own that records the call's token
// counts, which also go to the token counter.
func (c *core) streamModel(ctx context.Context, m model.Model, req *model.Request) iter.Seq2[model.Event, error] {
	return func(yield func(model.Event, error) bool) {
		ctx, span := c.rt.Tracer().Start(ctx, "chat.model", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(agent.AttrAgent.String(c.b.Path().String())))
		start := time.Now()
		var usage model.Usage
		var err error
		defer func() {
			ins := instrumentsOf(c.rt)
			class := agent.AttrClass.String(c.b.ClassName())
			span.SetAttributes(attrInputTokens.Int(usage.InputTokens), attrOutputTokens.Int(usage.OutputTokens))
			ins.tokens.Add(ctx, int64(usage.InputTokens), metric.WithAttributes(class, attrTokenType.String("input")))
			ins.tokens.Add(ctx, int64(usage.OutputTokens), metric.WithAttributes(class, attrTokenType.String("output")))
			ins.modelDuration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(class))
			agent.EndSpan(span, err)
		}()
		for ev, e := range m.Stream(ctx, req) {
			if e != nil {
				err = e
			} else if ev.Kind == model.EventFinish {
				usage.InputTokens += ev.Usage.InputTokens
				usage.OutputTokens += ev.Usage.OutputTokens
				if ev.FinishReason != "" {
					span.SetAttributes(attrFinish.StringSlice([]string{ev.FinishReason}))
				}
			}
			if !yield(ev, e) {
				return
			}
		}
	}
}

// startToolSpan starts the span of a tool call; end ends it with the
// call's error.
func startToolSpan(ctx context.Context, name string) (_ context.Context, end func(error)) {
	a, ok := agent.FromContext(ctx)
	if !ok {
		return ctx, func(error) {}
	}
	b := agent.BaseOf(a)
	attrs := []attribute.KeyValue{agent.AttrAgent.String(b.Path().String()), attrTool.String(name)}
	if tc, ok := ToolCallFromContext(ctx); ok {
		attrs = append(attrs, attrToolCall.String(tc.ID))
	}
	ctx, span := b.Runtime().Tracer().Start(ctx, "chat.tool "+name, trace.WithAttributes(attrs...))
	return ctx, func(err error) { agent.EndSpan(span, err) }
}
