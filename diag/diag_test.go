package diag_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/diag"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var stamp = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

func newHub(buf *bytes.Buffer, level slog.Level) *diag.Hub {
	logger := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: level}))
	return diag.New(logger, func() time.Time { return stamp })
}

// Subscribers get the events of their channel (or all, with "*"), stamped
// with the hub's clock, until they unsubscribe.
func TestSubscribeAndUnsubscribe(t *testing.T) {
	var buf bytes.Buffer
	h := newHub(&buf, slog.LevelInfo)
	var agentEvents, allEvents []diag.Event
	unsubAgent := h.Subscribe(diag.ChannelAgent, func(e diag.Event) { agentEvents = append(agentEvents, e) })
	unsubAll := h.Subscribe("*", func(e diag.Event) { allEvents = append(allEvents, e) })
	if !h.HasSubscribers(diag.ChannelAgent) || !h.HasSubscribers(diag.ChannelRPC) {
		t.Fatal("HasSubscribers false with subscribers (the wildcard counts for every channel)")
	}

	h.Publish(context.Background(), diag.ChannelAgent, "start", "Counter/a", map[string]any{"class": "Counter"})
	h.Publish(context.Background(), diag.ChannelRPC, "call", "Counter/a", nil)
	if len(agentEvents) != 1 || len(allEvents) != 2 {
		t.Fatalf("agent subscriber got %d, wildcard %d; want 1 and 2", len(agentEvents), len(allEvents))
	}
	got := agentEvents[0]
	if got.Channel != diag.ChannelAgent || got.Type != "start" || got.Agent != "Counter/a" ||
		!got.Time.Equal(stamp) || got.Attrs["class"] != "Counter" {
		t.Errorf("event = %+v", got)
	}

	unsubAgent()
	unsubAgent() // idempotent
	h.Publish(context.Background(), diag.ChannelAgent, "evict", "Counter/a", nil)
	if len(agentEvents) != 1 {
		t.Fatalf("unsubscribed function still called")
	}
	if len(allEvents) != 3 {
		t.Fatalf("wildcard subscriber got %d events, want 3", len(allEvents))
	}
	unsubAll()
	if h.HasSubscribers(diag.ChannelAgent) {
		t.Error("HasSubscribers true after every subscriber left")
	}
	h.Publish(context.Background(), diag.ChannelAgent, "evict", "Counter/a", nil)
	if len(allEvents) != 3 {
		t.Fatal("unsubscribed wildcard still called")
	}
	if buf.Len() != 0 {
		t.Errorf("events were logged at info level: %s", buf.String())
	}
}

// Two subscriptions of the same function are independent.
func TestSubscriptionsAreIndependent(t *testing.T) {
	var buf bytes.Buffer
	h := newHub(&buf, slog.LevelInfo)
	n := 0
	fn := func(diag.Event) { n++ }
	u1 := h.Subscribe("x", fn)
	h.Subscribe("x", fn)
	h.Publish(context.Background(), "x", "t", "", nil)
	if n != 2 {
		t.Fatalf("called %d times, want 2", n)
	}
	u1()
	h.Publish(context.Background(), "x", "t", "", nil)
	if n != 3 {
		t.Fatalf("called %d times after one unsubscribe, want 3", n)
	}
}

// At debug level every event is also a log record named channel.type with
// the agent and the attributes.
func TestEventsAreLogged(t *testing.T) {
	var buf bytes.Buffer
	h := newHub(&buf, slog.LevelDebug)
	h.Publish(context.Background(), diag.ChannelSchedule, "fire", "Counter/a", map[string]any{"method": "Tick"})
	out := buf.String()
	for _, want := range []string{"msg=schedule.fire", "channel=schedule", "agent=Counter/a", "method=Tick"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
}

// A subscriber may unsubscribe from inside its callback, and publishing
// from many goroutines is safe.
func TestConcurrentPublishAndUnsubscribeInCallback(t *testing.T) {
	h := diag.New(nil, nil)
	var unsub func()
	calls := 0
	unsub = h.Subscribe("c", func(diag.Event) {
		calls++
		unsub()
	})
	h.Publish(context.Background(), "c", "a", "", nil)
	h.Publish(context.Background(), "c", "b", "", nil)
	if calls != 1 {
		t.Fatalf("called %d times, want 1", calls)
	}

	var mu sync.Mutex
	count := 0
	defer h.Subscribe("d", func(diag.Event) { mu.Lock(); count++; mu.Unlock() })()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				h.Publish(context.Background(), "d", "e", "", nil)
			}
		})
	}
	wg.Wait()
	if count != 800 {
		t.Fatalf("got %d events, want 800", count)
	}
}

// A hub without a clock stamps events with the real time.
func TestDefaultClock(t *testing.T) {
	h := diag.New(nil, nil)
	var got time.Time
	defer h.Subscribe("c", func(e diag.Event) { got = e.Time })()
	before := time.Now()
	h.Publish(context.Background(), "c", "t", "", nil)
	if got.Before(before) || time.Since(got) > time.Minute {
		t.Fatalf("event time %v, want about %v", got, before)
	}
}

// TestPublishJoinsTheSpan: an event published with a context that carries
// a recording span becomes an event of that span, and subscribers get the
// span's context.
func TestPublishJoinsTheSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	h := diag.New(slog.New(slog.DiscardHandler), func() time.Time { return stamp })
	var got diag.Event
	defer h.Subscribe(diag.ChannelAgent, func(e diag.Event) { got = e })()
	ctx, span := tp.Tracer("test").Start(context.Background(), "work")
	h.Publish(ctx, diag.ChannelAgent, "start", "Counter/a", map[string]any{"class": "Counter", "n": 3})
	span.End()
	if !got.Span.Equal(span.SpanContext()) {
		t.Fatalf("event span %v, want %v", got.Span, span.SpanContext())
	}
	ended := rec.Ended()
	if len(ended) != 1 || len(ended[0].Events()) != 1 {
		t.Fatalf("spans %v", ended)
	}
	ev := ended[0].Events()[0]
	want := map[string]string{"agentry.agent": "Counter/a", "class": "Counter", "n": "3"}
	if ev.Name != "agent.start" || len(ev.Attributes) != len(want) {
		t.Fatalf("span event %s %v", ev.Name, ev.Attributes)
	}
	for _, kv := range ev.Attributes {
		if want[string(kv.Key)] != kv.Value.String() {
			t.Errorf("attribute %s = %s, want %s", kv.Key, kv.Value.String(), want[string(kv.Key)])
		}
	}
	// Without a span nothing changes.
	h.Publish(context.Background(), diag.ChannelAgent, "evict", "Counter/a", nil)
	if got.Span.IsValid() {
		t.Errorf("an event published without a span has span %v", got.Span)
	}
}
