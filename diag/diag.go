// Package diag is Agentry's observability hub: named channels ("agent",
// "rpc", "schedule", "agentTool", …) that code can subscribe to, in the manner
// of Node's diagnostics_channel. Every published event is also written as a
// log/slog record, and, when the publisher's context carries an
// OpenTelemetry span that records, an event of that span: a diagnostic
// event joins the trace of the work that published it.
package diag

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Well-known channel names.
const (
	ChannelAgent     = "agent"
	ChannelRPC       = "rpc"
	ChannelSchedule  = "schedule"
	ChannelChat      = "chat"
	ChannelAgentTool = "agentTool"
	ChannelServer    = "server"
)

// Event is one observation published on a channel.
type Event struct {
	// Channel is the channel name, such as "agent".
	Channel string
	// Type names what happened, such as "start" or "evict".
	Type string
	// Agent is the instance path the event concerns, if any.
	Agent string
	// Time is when the event was published.
	Time time.Time
	// Attrs carries the event's details.
	Attrs map[string]any
	// Span is the span context of the publisher's context (invalid when
	// it carried none), so that a subscriber can relate the event to its
	// trace.
	Span trace.SpanContext
}

// Hub fans published events out to subscribers. The zero value is not
// usable; call New.
type Hub struct {
	logger *slog.Logger
	now    func() time.Time

	mu     sync.RWMutex
	nextID int
	subs   map[string]map[int]func(Event)
}

// New returns a Hub that also logs every event to logger (nil means
// slog.Default()) at debug level, and stamps events with now (nil means
// time.Now).
func New(logger *slog.Logger, now func() time.Time) *Hub {
	if logger == nil {
		logger = slog.Default()
	}
	if now == nil {
		now = time.Now
	}
	return &Hub{logger: logger, now: now, subs: make(map[string]map[int]func(Event))}
}

// Subscribe calls fn for every event published on channel ("*" for all
// channels) until the returned function is called. fn runs synchronously on
// the publisher's goroutine and must not block.
func (h *Hub) Subscribe(channel string, fn func(Event)) (unsubscribe func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nextID++
	id := h.nextID
	if h.subs[channel] == nil {
		h.subs[channel] = make(map[int]func(Event))
	}
	h.subs[channel][id] = fn
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs[channel], id)
	}
}

// HasSubscribers reports whether any subscriber listens on channel.
func (h *Hub) HasSubscribers(channel string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.subs[channel]) > 0 || len(h.subs["*"]) > 0
}

// Publish sends an event to the channel's subscribers and logs it (with
// ctx, so that a log handler can correlate it). When ctx carries a span
// that records, the event is added to it as a span event named
// channel.typ.
func (h *Hub) Publish(ctx context.Context, channel, typ, agent string, attrs map[string]any) {
	span := trace.SpanFromContext(ctx)
	ev := Event{Channel: channel, Type: typ, Agent: agent, Time: h.now(), Attrs: attrs, Span: span.SpanContext()}
	if span.IsRecording() {
		kv := make([]attribute.KeyValue, 0, len(attrs)+1)
		if agent != "" {
			kv = append(kv, attribute.String("agentry.agent", agent))
		}
		for k, v := range attrs {
			kv = append(kv, attributeOf(k, v))
		}
		span.AddEvent(channel+"."+typ, trace.WithAttributes(kv...), trace.WithTimestamp(ev.Time))
	}
	if h.logger.Enabled(ctx, slog.LevelDebug) {
		args := make([]any, 0, 2*len(attrs)+4)
		args = append(args, slog.String("channel", channel), slog.String("agent", agent))
		for k, v := range attrs {
			args = append(args, slog.Any(k, v))
		}
		h.logger.DebugContext(ctx, channel+"."+typ, args...)
	}
	h.mu.RLock()
	fns := make([]func(Event), 0, len(h.subs[channel])+len(h.subs["*"]))
	for _, fn := range h.subs[channel] {
		fns = append(fns, fn)
	}
	for _, fn := range h.subs["*"] {
		fns = append(fns, fn)
	}
	h.mu.RUnlock()
	for _, fn := range fns {
		fn(ev)
	}
}

// attributeOf converts an event attribute to a span attribute.
func attributeOf(k string, v any) attribute.KeyValue {
	switch v := v.(type) {
	case string:
		return attribute.String(k, v)
	case bool:
		return attribute.Bool(k, v)
	case int:
		return attribute.Int(k, v)
	case int64:
		return attribute.Int64(k, v)
	case float64:
		return attribute.Float64(k, v)
	case time.Time:
		return attribute.String(k, v.Format(time.RFC3339Nano))
	case fmt.Stringer:
		return attribute.String(k, v.String())
	}
	return attribute.String(k, fmt.Sprint(v))
}
