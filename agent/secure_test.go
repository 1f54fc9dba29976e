package agent_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
)

// Shadow declares its own methods named like framework ones: Destroy
// shadows agent.Base's, Put and Keys are free names since storage moved to
// agent.Storage.
type Shadow struct{ agent.Base }

func (s *Shadow) Destroy(ctx context.Context) error  { return nil }
func (s *Shadow) Put(ctx context.Context, v int) int { return v }
func (s *Shadow) Keys() []string                     { return nil }

// Register refuses a callable that names a framework method (one of
// agent.Base's, even when the agent shadows it), and says which method and
// why; the storage methods live on agent.Storage, so "put" and "keys" are
// the agent's own names.
func TestRegisterRefusesFrameworkMethods(t *testing.T) {
	e := newRuntime(t, rtOptions{})
	for _, c := range []struct {
		callable, method string
		shadow           bool
	}{
		{"destroy", "Destroy", false},
		{"destroy", "Destroy", true},
		{"setState", "SetState", false},
		{"storage", "Storage", false},
		{"deleteSubAgent", "DeleteSubAgent", false},
		{"scheduleAfter", "ScheduleAfter", false},
	} {
		newAgent := func() agent.Agent { return &Probe{} }
		if c.shadow {
			newAgent = func() agent.Agent { return &Shadow{} }
		}
		err := e.rt.Register(agent.Class{Name: "Bad", New: newAgent, Callable: []string{c.callable}})
		if err == nil {
			t.Errorf("callable %q (shadowed %v) was registered", c.callable, c.shadow)
			continue
		}
		for _, want := range []string{`"` + c.callable + `"`, c.method + " is a framework method", "agent.Base", "must not call"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("callable %q: error %q does not say %q", c.callable, err, want)
			}
		}
	}
	if e.rt.HasClass("Bad") {
		t.Error("a refused class was registered")
	}
	// put and keys are framework methods no longer: a Probe has none.
	for _, name := range []string{"put", "keys"} {
		err := e.rt.Register(agent.Class{Name: "NoPut", New: func() agent.Agent { return &Probe{} }, Callable: []string{name}})
		if err == nil || !strings.Contains(err.Error(), "no method") {
			t.Errorf("callable %q on Probe: %v, want no such method", name, err)
		}
	}
	// and an agent may declare them as its own callables.
	if err := e.rt.Register(agent.Class{Name: "Shadow", New: func() agent.Agent { return &Shadow{} }, Callable: []string{"put", "keys"}}); err != nil {
		t.Errorf("own put/keys refused: %v", err)
	}
}
