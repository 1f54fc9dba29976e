package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// telemetry is the OpenTelemetry SDK of the serve command: providers for
// the runtime (nil when a signal is off) and their shutdown, which flushes
// what is buffered.
type telemetry struct {
	Tracer   trace.TracerProvider
	Meter    metric.MeterProvider
	shutdown []func(context.Context) error
}

// Shutdown flushes and stops the exporters.
func (t *telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// newTelemetry configures traces and metrics from the standard OTEL_*
// variables. Both are off unless an OTLP endpoint is configured
// (OTEL_EXPORTER_OTLP_ENDPOINT, or the per-signal
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / _METRICS_ENDPOINT) or the signal's
// exporter is set to "otlp" (OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER,
// which also turn a signal off with "none"); OTEL_SDK_DISABLED=true turns
// both off. The exporters speak OTLP over HTTP and read the rest of their
// configuration (headers, timeouts, compression, protocol details) from the
// same variables, as do the SDK's sampler (OTEL_TRACES_SAMPLER), batching
// (OTEL_BSP_*), metric interval (OTEL_METRIC_EXPORT_INTERVAL) and resource
// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES; the service name defaults
// to "agentry").
func newTelemetry(ctx context.Context, getenv func(string) string) (*telemetry, error) {
	t := &telemetry{}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return t, nil
	}
	traces, err := signalOn(getenv, "TRACES")
	if err != nil {
		return nil, err
	}
	metrics, err := signalOn(getenv, "METRICS")
	if err != nil {
		return nil, err
	}
	if !traces && !metrics {
		return t, nil
	}
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName("agentry")), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	if traces {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: trace exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		t.Tracer = tp
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}
	if metrics {
		exp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			_ = t.Shutdown(ctx)
			return nil, fmt.Errorf("telemetry: metric exporter: %w", err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)), sdkmetric.WithResource(res))
		t.Meter = mp
		t.shutdown = append(t.shutdown, mp.Shutdown)
	}
	return t, nil
}

// signalOn reports whether a signal ("TRACES", "METRICS") is exported.
func signalOn(getenv func(string) string, signal string) (bool, error) {
	switch v := strings.ToLower(strings.TrimSpace(getenv("OTEL_" + signal + "_EXPORTER"))); v {
	case "none":
		return false, nil
	case "otlp":
		return true, nil
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != "", nil
	default:
		return false, fmt.Errorf("telemetry: OTEL_%s_EXPORTER=%q: only otlp and none are supported", signal, v)
	}
}
