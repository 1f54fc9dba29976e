package agenttool_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// traceKit is the delegation tree of TestOneTraceAcrossTheTree: an
// assistant whose turn runs a researcher (which runs a nested helper) and
// dispatches a detached background run.
type traceKit struct {
	// bgStarted is told when the background child's first life runs;
	// the background child then waits for the runtime to close.
	bgStarted chan struct{}
	// bgDone is told when the parent's OnBgDone callback ran.
	bgDone chan agenttool.Result
	// bgEnded is told when the background child's turn ended (in either
	// life).
	bgEnded chan struct{}
	// delivered is told when a detached run's end is recorded delivered.
	delivered chan struct{}
	clock     *clockwork.FakeClock
}

type traceAssistant struct {
	chat.Base
	k *traceKit
}

func (a *traceAssistant) ChatModel() model.Model {
	return scripted.New(
		scripted.WithRules(scripted.Rule{Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("All done.")})}),
		scripted.WithDefault(scripted.Always(scripted.Reply{
			scripted.ToolCall("trace-researcher", researchInput{Query: "otel"}),
			scripted.ToolCall("background", struct{}{}),
		})))
}

func (a *traceAssistant) Tools() []chat.Tool {
	return []chat.Tool{
		agenttool.AgentTool[researchInput]("TraceResearcher", agenttool.ToolOptions{Description: "Research a topic."}),
		chat.NewTool("background", "Start background work.", func(ctx context.Context, _ struct{}) (string, error) {
			res, err := agenttool.RunAgentTool(ctx, a, "TraceBackground", agenttool.RunOptions{Input: "in the background",
				RunID: "bg-1", Detached: &agenttool.DetachedOptions{OnFinish: agent.Method(a.OnBgDone)}})
			return string(res.Status), err
		}),
	}
}

// OnBgDone is the detached run's durable callback.
func (a *traceAssistant) OnBgDone(ctx context.Context, run agenttool.Run, res agenttool.Result) error {
	a.k.bgDone <- res
	return nil
}

type traceResearcher struct {
	chat.Base
	k *traceKit
}

func (r *traceResearcher) ChatModel() model.Model {
	return scripted.New(
		scripted.WithRules(scripted.Rule{Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("Researched.")})}),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.ToolCall("trace-helper", researchInput{Query: "nested"})})))
}

func (r *traceResearcher) Tools() []chat.Tool {
	return []chat.Tool{agenttool.AgentTool[researchInput]("TraceHelper", agenttool.ToolOptions{Description: "Help."})}
}

type traceHelper struct {
	chat.Base
	k *traceKit
}

func (h *traceHelper) ChatModel() model.Model {
	return scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("Helped.")})))
}

// traceBackground blocks its first life until the runtime closes; the
// turn recovered after the restart answers.
type traceBackground struct {
	chat.Base
	k *traceKit
}

func (b *traceBackground) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	if !t.Recovering {
		close(b.k.bgStarted)
		<-ctx.Done()
		return context.Cause(ctx)
	}
	return t.RunLoop(ctx, chat.LoopOptions{Model: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("Background done.")})))})
}

func traceStart(t *testing.T, k *traceKit, dir string, tp *sdktrace.TracerProvider, mp *sdkmetric.MeterProvider) *testenv.Env {
	t.Helper()
	return startEnv(t, testenv.Options{
		Dir:            dir,
		Clock:          k.clock,
		TracerProvider: tp,
		MeterProvider:  mp,
		Classes: []agent.Class{
			{Name: "TraceAssistant", New: func() agent.Agent { return &traceAssistant{k: k} }, Public: true},
			{Name: "TraceResearcher", New: func() agent.Agent { return &traceResearcher{k: k} }},
			{Name: "TraceHelper", New: func() agent.Agent { return &traceHelper{k: k} }},
			{Name: "TraceBackground", New: func() agent.Agent { return &traceBackground{k: k} }},
		},
	}, chat.Config{}, agenttool.Options{}, func(rt *agent.Runtime) {
		unsubscribe := rt.Diag().Subscribe(diag.ChannelChat, func(e diag.Event) {
			if e.Type == "turn" && strings.Contains(e.Agent, "TraceBackground") {
				k.bgEnded <- struct{}{}
			}
		})
		t.Cleanup(unsubscribe)
		unsubscribe = rt.Diag().Subscribe(diag.ChannelAgentTool, func(e diag.Event) {
			if e.Type == "detached:delivered" {
				k.delivered <- struct{}{}
			}
		})
		t.Cleanup(unsubscribe)
	})
}

// TestOneTraceAcrossTheTree (issue 15): a turn that runs a researcher, a
// helper nested in it and a detached background run makes one trace, and
// the background run's work after a restart (its recovered turn, its model
// call, the delivery of its end to the parent) joins the same trace.
func TestOneTraceAcrossTheTree(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	k := &traceKit{bgStarted: make(chan struct{}), bgDone: make(chan agenttool.Result, 1), bgEnded: make(chan struct{}, 2),
		delivered: make(chan struct{}, 1),
		clock:     clockwork.NewFakeClock()}
	ctx := testCtx(t)

	env := traceStart(t, k, "", tp, mp)
	a, err := env.RT.Get(ctx, agent.Root("TraceAssistant", "a"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.(*traceAssistant).SaveMessages(ctx, []message.Message{userMsg("research otel")})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn: %+v, %v", res, err)
	}
	select {
	case <-k.bgStarted:
	case <-ctx.Done():
		t.Fatal("the background run did not start")
	}
	env.Close()
	before := len(exp.GetSpans())

	env2 := traceStart(t, k, env.Dir, tp, mp)
	// The background child wakes with the runtime and finishes its
	// recovered turn; the parent's reconcile tick (due 5 s after the
	// dispatch) then collects the run and delivers its end.
	select {
	case <-k.bgEnded:
	case <-ctx.Done():
		t.Fatal("the background turn did not end after the restart")
	}
	k.clock.Advance(5 * time.Second)
	select {
	case r := <-k.bgDone:
		if r.Status != agenttool.StatusCompleted || r.Summary != "Background done." {
			t.Fatalf("background result = %+v", r)
		}
	case <-ctx.Done():
		t.Fatal("the background run's end was not delivered after the restart")
	}
	// The delivery is recorded before its span ends; Close waits for that
	// work.
	select {
	case <-k.delivered:
	case <-ctx.Done():
		t.Fatal("the background run's delivery was not recorded")
	}
	env2.Close()

	spans := exp.GetSpans()
	root := findSpan(t, spans[:before], "chat.turn", agent.AttrClass.String("TraceAssistant"))
	if root.Parent.IsValid() {
		t.Fatalf("the assistant's turn has a parent span %v", root.Parent)
	}
	trace := root.SpanContext.TraceID()
	for _, s := range spans {
		if s.SpanContext.TraceID() != trace {
			t.Errorf("span %q (%v) is in trace %v, want %v", s.Name, s.Attributes, s.SpanContext.TraceID(), trace)
		}
	}
	// Every link of the tree is there, each child below its parent.
	byID := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byID[s.SpanContext.SpanID().String()] = s
	}
	chain := func(s tracetest.SpanStub) []string {
		var names []string
		for s.Parent.IsValid() {
			p, ok := byID[s.Parent.SpanID().String()]
			if !ok {
				t.Fatalf("span %q: parent %v not recorded", s.Name, s.Parent.SpanID())
			}
			names = append(names, p.Name)
			s = p
		}
		return names
	}
	helperTurn := findSpan(t, spans[:before], "chat.turn", agent.AttrClass.String("TraceHelper"))
	want := []string{"agent_tool.run TraceHelper", "chat.tool trace-helper", "chat.turn",
		"agent_tool.run TraceResearcher", "chat.tool trace-researcher", "chat.turn"}
	if got := chain(helperTurn); !slices.Equal(got, want) {
		t.Fatalf("the helper turn's ancestors = %v, want %v", got, want)
	}
	// Model calls: the assistant's two steps, the researcher's two, the
	// helper's one; each with its token counts.
	models := 0
	for _, s := range spans[:before] {
		if s.Name != "chat.model" {
			continue
		}
		models++
		if in, ok := attrOf(s.Attributes, "gen_ai.usage.input_tokens"); !ok || in.AsInt64() <= 0 {
			t.Errorf("model span attributes %v: no input token count", s.Attributes)
		}
		if out, ok := attrOf(s.Attributes, "gen_ai.usage.output_tokens"); !ok || out.AsInt64() <= 0 {
			t.Errorf("model span attributes %v: no output token count", s.Attributes)
		}
	}
	if models != 5 {
		t.Errorf("%d model spans before the restart, want 5", models)
	}
	// After the restart: the background child's recovered turn, its model
	// call, and the delivery to the parent.
	after := spans[before:]
	bgTurn := findSpan(t, after, "chat.turn", agent.AttrClass.String("TraceBackground"))
	if got := chain(bgTurn); len(got) < 3 || got[0] != "agent_tool.run TraceBackground" || got[1] != "chat.tool background" {
		t.Fatalf("the recovered background turn's ancestors = %v", got)
	}
	if rec, ok := attrOf(bgTurn.Attributes, "agentry.chat.recovering"); !ok || !rec.AsBool() {
		t.Fatalf("the background turn after the restart is not marked recovering: %v", bgTurn.Attributes)
	}
	findSpan(t, after, "chat.model", agent.AttrAgent.String(agent.BaseOf(a).Path().Child("TraceBackground", "bg-1").String()))
	deliver := findSpan(t, after, "agent_tool.deliver")
	if got := chain(deliver); len(got) == 0 || got[0] != "agent_tool.run TraceBackground" {
		t.Fatalf("the delivery's ancestors = %v", got)
	}

	// The metrics of both runtimes: three runs finished completed (the
	// background one after the restart), every turn counted, tokens
	// counted, and the queue depth back to zero.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range d.DataPoints {
					if m.Name == "agentry.agent_tool.runs.finished" {
						if v, _ := p.Attributes.Value("agentry.agent_tool.status"); v.AsString() != "completed" {
							continue
						}
					}
					if m.Name == "agentry.chat.turns" {
						if v, _ := p.Attributes.Value("agentry.chat.outcome"); v.AsString() == "interrupted" {
							sums["interrupted turns"] += p.Value
							continue
						}
					}
					sums[m.Name] += p.Value
				}
			}
		}
	}
	for name, want := range map[string]int64{
		"agentry.agent_tool.runs.started":  3,
		"agentry.agent_tool.runs.finished": 3,
		"agentry.chat.turns":               4, // the assistant, researcher, helper, background (second life)
		"agentry.chat.queue.depth":         0,
		"interrupted turns":                1, // the background's first life
	} {
		if sums[name] != want {
			t.Errorf("%s = %d, want %d (all: %v)", name, sums[name], want, sums)
		}
	}
	if sums["agentry.model.tokens"] <= 0 {
		t.Errorf("no tokens counted: %v", sums)
	}
}

// findSpan returns the only span named name that has every attribute of
// attrs.
func findSpan(t *testing.T, spans tracetest.SpanStubs, name string, attrs ...attribute.KeyValue) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.Name != name {
			continue
		}
		ok := true
		for _, kv := range attrs {
			if v, has := attrOf(s.Attributes, string(kv.Key)); !has || v != kv.Value {
				ok = false
			}
		}
		if ok {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name)
		}
		t.Fatalf("%d spans %q with %v among %s", len(found), name, attrs, strings.Join(names, ", "))
	}
	return found[0]
}

func attrOf(kvs []attribute.KeyValue, key string) (attribute.Value, bool) {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}
