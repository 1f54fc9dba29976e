package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP trace receiver that keeps the span names it
// was sent.
type collector struct {
	mu    sync.Mutex
	names map[string]int
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil || r.URL.Path != "/v1/traces" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.names[s.Name]++
			}
		}
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// TestServeExportsTraces: with OTEL_EXPORTER_OTLP_ENDPOINT set, serve
// exports the spans of the work it did (an RPC call) over OTLP/HTTP, at
// the latest when it shuts down; metrics are turned off with
// OTEL_METRICS_EXPORTER=none.
func TestServeExportsTraces(t *testing.T) {
	col := &collector{names: map[string]int{}}
	hs := httptest.NewServer(col)
	defer hs.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", hs.URL)
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	t.Run("serve", func(t *testing.T) {
		host := startServe(t, os.Getenv)
		conn, err := dialAssistant(host, "")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Call(ctx, "listHelperRuns"); err != nil {
			t.Fatal(err)
		}
	})
	// The subtest's cleanup stopped serve, which flushed its spans.
	col.mu.Lock()
	defer col.mu.Unlock()
	if col.names["rpc listHelperRuns"] != 1 {
		t.Fatalf("exported spans %v, want one rpc listHelperRuns", col.names)
	}
}

// TestTelemetryOff: without the variables nothing is exported, and a bad
// exporter name is an error.
func TestTelemetryOff(t *testing.T) {
	ctx := context.Background()
	for _, env := range []map[string]string{
		{},
		{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
		{"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
	} {
		tel, err := newTelemetry(ctx, func(k string) string { return env[k] })
		if err != nil {
			t.Fatalf("%v: %v", env, err)
		}
		if tel.Tracer != nil || tel.Meter != nil {
			t.Errorf("%v: telemetry on: %+v", env, tel)
		}
	}
	if _, err := newTelemetry(ctx, func(k string) string {
		if k == "OTEL_TRACES_EXPORTER" {
			return "zipkin"
		}
		return ""
	}); err == nil {
		t.Error("OTEL_TRACES_EXPORTER=zipkin: no error")
	}
}
