package agent_test

import (
	"context"
	"testing"

	"github.com/agentry/agentry/agent"
)

// greetLayer and countLayer are two framework layers for the layer tests.
// Each records the agent it was started for.
type greetLayer struct{ self agent.Agent }

func (l *greetLayer) GreetLayer() *greetLayer { return l }

func (l *greetLayer) StartLayer(ctx context.Context, self agent.Agent) error {
	l.self = self
	return nil
}

type countLayer struct{ self agent.Agent }

func (l *countLayer) CountLayer() *countLayer { return l }

func (l *countLayer) StartLayer(ctx context.Context, self agent.Agent) error {
	l.self = self
	return nil
}

// greetMixin embeds a layer under an unexported name: the runtime must
// reach it all the same.
type greetMixin struct{ greetLayer }

// twoLayers embeds both layers side by side, one of them through an
// unexported embedded field.
type twoLayers struct {
	agent.Base
	greetMixin
	countLayer
}

// TestLayersFoundThroughEmbedding: layers embedded side by side, one
// through an unexported field, are each found through their accessor and
// started with the agent; LayerOf returns the embedded values themselves.
func TestLayersFoundThroughEmbedding(t *testing.T) {
	e := startRuntime(t, rtOptions{classes: []agent.Class{
		{Name: "TwoLayers", New: func() agent.Agent { return &twoLayers{} }},
	}})
	a, release, err := e.rt.Acquire(context.Background(), agent.Root("TwoLayers", "one"))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	tl := a.(*twoLayers)
	if tl.greetLayer.self != a || tl.countLayer.self != a {
		t.Fatalf("started with %v and %v, want the agent %p", tl.greetLayer.self, tl.countLayer.self, a)
	}
	if g, ok := agent.LayerOf[*greetLayer](a); !ok || g != &tl.greetLayer {
		t.Errorf("LayerOf greetLayer = %p, %v; want the embedded %p", g, ok, &tl.greetLayer)
	}
	if c, ok := agent.LayerOf[*countLayer](a); !ok || c != &tl.countLayer {
		t.Errorf("LayerOf countLayer = %p, %v; want the embedded %p", c, ok, &tl.countLayer)
	}
}

// noAccessor is a layer without an accessor.
type noAccessor struct{}

func (l *noAccessor) StartLayer(context.Context, agent.Agent) error { return nil }

type withNoAccessor struct {
	agent.Base
	noAccessor
}

// twoAccessors is a layer with two methods that could be its accessor.
type twoAccessors struct{}

func (l *twoAccessors) StartLayer(context.Context, agent.Agent) error { return nil }
func (l *twoAccessors) First() *twoAccessors                          { return l }
func (l *twoAccessors) Second() *twoAccessors                         { return l }

type withTwoAccessors struct {
	agent.Base
	twoAccessors
}

// hidesAccessor declares a method of the accessor's name, which hides it.
type hidesAccessor struct {
	agent.Base
	countLayer
}

func (h *hidesAccessor) CountLayer() string { return "mine" }

// wrongLayer's accessor returns a layer other than its receiver.
type wrongLayer struct{ other *wrongLayer }

func (l *wrongLayer) StartLayer(context.Context, agent.Agent) error { return nil }
func (l *wrongLayer) WrongLayer() *wrongLayer                       { return l.other }

type withWrongLayer struct {
	agent.Base
	wrongLayer
}

// withCountTwice embeds the same layer twice, at two depths: the accessor
// reaches only the outer one.
type countTwiceInner struct{ countLayer }

type withCountTwice struct {
	agent.Base
	countLayer
	countTwiceInner
}

// TestRegisterRefusesUnreachableLayer: a layer the runtime cannot reach
// through exactly one accessor is refused at registration, with an error
// that names the class, the layer and the cause.
func TestRegisterRefusesUnreachableLayer(t *testing.T) {
	e := newRuntime(t, rtOptions{})
	assertRefused(t, e.rt, []refusal{
		{agent.Class{Name: "NoAccessor", New: func() agent.Agent { return &withNoAccessor{} }},
			[]string{"class NoAccessor", "agent_test.noAccessor has no accessor", "func() *agent_test.noAccessor"}},
		{agent.Class{Name: "TwoAccessors", New: func() agent.Agent { return &withTwoAccessors{} }},
			[]string{"class TwoAccessors", "several accessors (First, Second)"}},
		{agent.Class{Name: "HidesAccessor", New: func() agent.Agent { return &hidesAccessor{} }},
			[]string{"class HidesAccessor", "agent_test.countLayer (embedded as countLayer) is hidden", "CountLayer"}},
		{agent.Class{Name: "WrongLayer", New: func() agent.Agent { return &withWrongLayer{wrongLayer: wrongLayer{other: &wrongLayer{}}} }},
			[]string{"class WrongLayer", "accessor WrongLayer returns another value"}},
		{agent.Class{Name: "CountTwice", New: func() agent.Agent { return &withCountTwice{countTwiceInner: countTwiceInner{}} }},
			[]string{"class CountTwice", "countTwiceInner.countLayer", "embedded twice"}},
	})
}
