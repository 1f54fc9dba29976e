package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/store/sqlite"
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

// ClientMessage shows public errors (anywhere in the chain), argument
// errors, hook refusals and timeouts; anything else is an internal error id
// with the error logged under it.
func TestClientMessage(t *testing.T) {
	ctx := context.Background()
	var logs testenv.Logs
	sdb, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentry.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	rt, err := agent.New(ctx, agent.Options{DB: sdb, Logger: logs.Logger(), IdleTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	public := agent.Publicf("no room %q", "r1")
	for err, want := range map[error]string{
		public:                              `no room "r1"`,
		fmt.Errorf("db: %w", public):        `no room "r1"`,
		agent.Publicf("lookup: %w", io.EOF): "lookup: EOF",
		&agent.ArgumentError{Method: "M", Err: io.EOF}:           "invalid argument 0 for M: EOF",
		&agent.HTTPError{Status: 403, Message: "forbidden here"}: "forbidden here",
		fmt.Errorf("query: %w", context.DeadlineExceeded):        "timed out",
	} {
		if got := rt.ClientMessage(err); got != want {
			t.Errorf("ClientMessage(%v) = %q, want %q", err, got, want)
		}
	}
	if !errors.Is(agent.Publicf("lookup: %w", io.EOF), io.EOF) {
		t.Error("Publicf does not wrap %w")
	}
	if rt.ClientMessage(nil) != "" {
		t.Error("nil error has a message")
	}
	secret := fmt.Errorf("agent: put %q: %w", "k", errors.New("database is locked: /srv/data/agentry.db"))
	msg := rt.ClientMessage(secret, "agent", "Room/r1")
	id := logs.InternalError(t, msg, "database is locked: /srv/data/agentry.db", "agent=Room/r1")
	if other := rt.ClientMessage(secret); other == msg {
		t.Errorf("two internal errors share the id %s", id)
	}
}
