package chat_test

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model/scripted"
)

// queueDepth reads agentry.chat.queue.depth.
func queueDepth(t *testing.T, reader *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "agentry.chat.queue.depth" {
				for _, p := range d.DataPoints {
					n += p.Value
				}
			}
		}
	}
	return n
}

// TestQueueDepthGauge: the gauge counts the turns queued behind a running
// one, each out once (taken, cancelled), and none is left counted when
// the runtime shuts down with turns still queued (they run after the
// restart, counted by that process).
func TestQueueDepthGauge(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	mclk := clockwork.NewFakeClock()
	m := scripted.New(scripted.WithClock(mclk), scripted.WithDelay(time.Hour))
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", &kit{model: m})}, meter: mp})
	ctx := testCtx(t)
	a := getChat(t, r.rt, "Bot", "q")
	var ids []string
	for _, text := range []string{"one", "two", "three", "four"} {
		id, err := a.SubmitMessages(ctx, []message.Message{userMsg(text)}, chat.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// The first turn runs, held by the model's clock; three wait.
	if err := mclk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if n := queueDepth(t, reader); n != 3 {
		t.Fatalf("queue depth %d with one turn running and three queued, want 3", n)
	}
	if !a.CancelTurn(ids[3]) {
		t.Fatal("the last queued turn was not cancelled")
	}
	if n := queueDepth(t, reader); n != 2 {
		t.Fatalf("queue depth %d after a queued turn was cancelled, want 2", n)
	}
	r.close()
	if n := queueDepth(t, reader); n != 0 {
		t.Fatalf("queue depth %d after the runtime closed, want 0", n)
	}
}
