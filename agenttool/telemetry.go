package agenttool

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentry/agentry/agent"
)

// Span and metric attribute keys of agent-tool runs.
const (
	attrRunID    = attribute.Key("agentry.agent_tool.run_id")
	attrType     = attribute.Key("agentry.agent_tool.agent_type")
	attrStatus   = attribute.Key("agentry.agent_tool.status")
	attrDetached = attribute.Key("agentry.agent_tool.detached")
)

// instruments are the agent-tool metrics, one set per runtime.
type instruments struct {
	started  metric.Int64Counter
	finished metric.Int64Counter
	duration metric.Float64Histogram
}

type instrumentsKey struct{}

func instrumentsOf(rt *agent.Runtime) *instruments {
	return rt.ValueOr(instrumentsKey{}, func() any {
		m := rt.Meter()
		in := &instruments{}
		// Errors come only from invalid names; the instruments are
		// usable no-ops even then.
		in.started, _ = m.Int64Counter("agentry.agent_tool.runs.started",
			metric.WithDescription("Agent-tool runs dispatched"), metric.WithUnit("{run}"))
		in.finished, _ = m.Int64Counter("agentry.agent_tool.runs.finished",
			metric.WithDescription("Agent-tool runs that reached a terminal status, by status"), metric.WithUnit("{run}"))
		in.duration, _ = m.Float64Histogram("agentry.agent_tool.run.duration",
			metric.WithDescription("Duration of agent-tool runs, from dispatch to terminal status"), metric.WithUnit("s"))
		return in
	}).(*instruments)
}

// startRunSpan starts the span of a dispatch of RunAgentTool. The child's
// turn is a child span of it, and the run's row stores it (trace_parent),
// so that the run's later work joins the trace after a restart too.
func (h *host) startRunSpan(ctx context.Context, class string, opts RunOptions) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{agent.AttrAgent.String(h.b.Path().String()), attrType.String(class),
		attrDetached.Bool(opts.Detached != nil)}
	if opts.RunID != "" {
		attrs = append(attrs, attrRunID.String(opts.RunID))
	}
	return h.rt.Tracer().Start(ctx, "agent_tool.run "+class, trace.WithAttributes(attrs...))
}

// runSpanContext returns ctx with the span of a recorded run as its
// parent: the stored one (work resumed after a restart), or ctx's own.
func runSpanContext(ctx context.Context, row runRow) context.Context {
	if row.traceParent == "" {
		return ctx
	}
	return agent.WithTraceParent(ctx, row.traceParent)
}

// countStarted counts a dispatched run.
func (h *host) countStarted(ctx context.Context, run Run) {
	instrumentsOf(h.rt).started.Add(ctx, 1, metric.WithAttributes(attrType.String(run.AgentType)))
}

// countFinished counts a run's terminal status and its duration.
func (h *host) countFinished(ctx context.Context, row runRow, res Result) {
	ins := instrumentsOf(h.rt)
	attrs := metric.WithAttributes(attrType.String(row.AgentType), attrStatus.String(string(res.Status)),
		attrDetached.Bool(row.det.Detached))
	ins.finished.Add(ctx, 1, attrs)
	if !row.StartedAt.IsZero() {
		ins.duration.Record(ctx, h.rt.Clock().Since(row.StartedAt).Seconds(), attrs)
	}
}
