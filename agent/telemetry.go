package agent

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// InstrumentationScope names the tracer and the meter of Agentry's spans
// and metrics.
const InstrumentationScope = "github.com/agentry/agentry"

// Span and metric attribute keys shared by the runtime and its layers.
const (
	AttrAgent  = attribute.Key("agentry.agent")  // an instance path
	AttrClass  = attribute.Key("agentry.class")  // a class name
	AttrMethod = attribute.Key("rpc.method")     // a callable's wire name
	AttrResult = attribute.Key("agentry.result") // how something ended
)

// telemetry holds the runtime's tracer and its own instruments.
type telemetry struct {
	tracer      trace.Tracer
	meter       metric.Meter
	rpcDuration metric.Float64Histogram
	connections metric.Int64UpDownCounter
	reg         metric.Registration
}

func newTelemetry(rt *Runtime, tp trace.TracerProvider, mp metric.MeterProvider) *telemetry {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{tracer: tp.Tracer(InstrumentationScope), meter: mp.Meter(InstrumentationScope)}
	// Instrument errors only come from invalid names, fixed here; the
	// returned instruments are usable (no-ops) even then.
	t.rpcDuration, _ = t.meter.Float64Histogram("agentry.rpc.duration",
		metric.WithDescription("Duration of client RPC calls"), metric.WithUnit("s"))
	t.connections, _ = t.meter.Int64UpDownCounter("agentry.connections",
		metric.WithDescription("Open client connections"), metric.WithUnit("{connection}"))
	resident, _ := t.meter.Int64ObservableGauge("agentry.instances.resident",
		metric.WithDescription("Agent instances in memory"), metric.WithUnit("{instance}"))
	t.reg, _ = t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(resident, int64(rt.ResidentCount()))
		return nil
	}, resident)
	return t
}

func (t *telemetry) close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

// Tracer returns the tracer of the runtime's spans (Options.TracerProvider).
// Layers start their spans with it.
func (rt *Runtime) Tracer() trace.Tracer { return rt.tel.tracer }

// Meter returns the meter of the runtime's metrics (Options.MeterProvider).
// Layers create their instruments with it, once per runtime (see
// ValueOr).
func (rt *Runtime) Meter() metric.Meter { return rt.tel.meter }

// ValueOr returns the value stored under key (as SetValue stores it), first
// storing what build returns if there is none. Layers keep their
// runtime-wide parts (metric instruments) with it.
func (rt *Runtime) ValueOr(key any, build func() any) any {
	if v, ok := rt.values.Load(key); ok {
		return v
	}
	v, _ := rt.values.LoadOrStore(key, build())
	return v
}

// EndSpan ends span with err's status: an error records it and sets the
// span's status to Error.
func EndSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// TraceParent encodes the span context of ctx as a W3C traceparent
// header value, for storing with durable work so that its continuation
// after a restart joins the same trace. It is empty when ctx carries no
// valid span context.
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier.Get("traceparent")
}

// WithTraceParent returns ctx with the remote span context that a
// TraceParent value encodes, so that spans started in it join that trace.
// An empty or malformed value returns ctx unchanged.
func WithTraceParent(ctx context.Context, traceParent string) context.Context {
	if traceParent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceParent})
}

// seconds is d in seconds, for duration histograms.
func seconds(d time.Duration) float64 { return d.Seconds() }
