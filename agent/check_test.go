package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
)

// badStart has an OnStart whose signature is not the Starter hook's.
type badStart struct{ agent.Base }

func (b *badStart) OnStart() error { return nil }

// badConnect has an OnConnect that returns nothing.
type badConnect struct{ agent.Base }

func (b *badConnect) OnConnect(ctx context.Context, c *agent.Conn) {}

// TestRegisterRefusesWrongHookSignature: a method named as a hook but with
// another signature would be silently ignored; Register refuses the class,
// naming the method, the hook and both signatures.
func TestRegisterRefusesWrongHookSignature(t *testing.T) {
	e := newRuntime(t, rtOptions{})
	for _, tc := range []struct {
		class agent.Class
		want  []string
	}{
		{agent.Class{Name: "BadStart", New: func() agent.Agent { return &badStart{} }},
			[]string{"BadStart", "OnStart", "func() error", "agent.Starter", "func(context.Context) error"}},
		{agent.Class{Name: "BadConnect", New: func() agent.Agent { return &badConnect{} }},
			[]string{"BadConnect", "OnConnect", "agent.Connector", "func(context.Context, *agent.Conn) error"}},
	} {
		err := e.rt.Register(tc.class)
		if err == nil {
			t.Errorf("%s registered", tc.class.Name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.class.Name, err, w)
			}
		}
		if e.rt.HasClass(tc.class.Name) {
			t.Errorf("%s is registered after the error", tc.class.Name)
		}
	}
	// A right signature registers.
	if err := e.rt.Register(probeClass(newHooks())); err != nil {
		t.Fatal(err)
	}
}

// customHook is a layer's hook interface for TestDeclareHooks.
type customHook interface{ Greeting() string }

type badGreeting struct{ agent.Base }

func (b *badGreeting) Greeting() []byte { return nil }

// TestDeclareHooks: a layer's hooks are checked for the classes registered
// before it declared them (DeclareHooks fails), for later ones (Register
// fails), and by Start.
func TestDeclareHooks(t *testing.T) {
	bad := agent.Class{Name: "BadGreeting", New: func() agent.Agent { return &badGreeting{} }}
	hook := agent.HookFor[customHook](nil)

	before := newRuntime(t, rtOptions{classes: []agent.Class{bad}})
	if err := before.rt.DeclareHooks(hook); err == nil || !strings.Contains(err.Error(), "Greeting") {
		t.Errorf("DeclareHooks after the class: %v, want an error naming Greeting", err)
	}
	if err := before.rt.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "BadGreeting") {
		t.Errorf("Start: %v, want an error naming BadGreeting", err)
	}

	after := newRuntime(t, rtOptions{})
	if err := after.rt.DeclareHooks(hook); err != nil {
		t.Fatal(err)
	}
	if err := after.rt.Register(bad); err == nil || !strings.Contains(err.Error(), "agent_test.customHook") {
		t.Errorf("Register after DeclareHooks: %v, want an error naming the hook", err)
	}
}

// TestSetupAfterStart: registering, declaring hooks, adding checks or
// extensions after Start is refused with ErrStarted, and Start runs once.
func TestSetupAfterStart(t *testing.T) {
	e := startRuntime(t, rtOptions{})
	if err := e.rt.Register(probeClass(newHooks())); !errors.Is(err, agent.ErrStarted) {
		t.Errorf("Register after Start: %v", err)
	}
	if err := e.rt.DeclareHooks(agent.HookFor[customHook](nil)); !errors.Is(err, agent.ErrStarted) {
		t.Errorf("DeclareHooks after Start: %v", err)
	}
	if err := e.rt.AddCheck(func(context.Context) error { return nil }); !errors.Is(err, agent.ErrStarted) {
		t.Errorf("AddCheck after Start: %v", err)
	}
	if err := e.rt.Use(func(agent.Agent) agent.Layer { return nil }); !errors.Is(err, agent.ErrStarted) {
		t.Errorf("Use after Start: %v", err)
	}
	if err := e.rt.Start(context.Background()); err == nil {
		t.Error("a second Start succeeded")
	}
}

// TestAddCheckFailsStart: a failing check fails Start before anything
// starts.
func TestAddCheckFailsStart(t *testing.T) {
	e := newRuntime(t, rtOptions{})
	boom := errors.New("the set-up is wrong")
	if err := e.rt.AddCheck(func(context.Context) error { return boom }); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Start(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Start: %v, want %v", err, boom)
	}
}

// probeHandle is the typed handle of the Probe class.
var probeHandle = agent.NewClass[*Probe]("Probe")

// TestClassHandle: a typed handle registers its class, goes wherever a
// class name goes (Root, SubAgent), and gets typed instances; a New that
// returns another type is refused.
func TestClassHandle(t *testing.T) {
	h := newHooks()
	e := newRuntime(t, rtOptions{})
	if err := e.rt.Register(probeHandle.Class(agent.Class{New: func() agent.Agent { return &Probe{h: h} }})); err != nil {
		t.Fatal(err)
	}
	wrong := agent.NewClass[*badStart]("Wrong").Class(agent.Class{New: func() agent.Agent { return &Probe{h: h} }})
	if err := e.rt.Register(wrong); err == nil || !strings.Contains(err.Error(), "ClassHandle") {
		t.Errorf("a handle whose New returns another type: %v", err)
	}
	e.start()
	ctx := context.Background()
	p, err := probeHandle.Get(ctx, e.rt, agent.Root(probeHandle, "typed"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "typed" || p.ClassName() != "Probe" {
		t.Fatalf("got %s of %s", p.Name(), p.ClassName())
	}
	child, err := agent.SubAgent[*Probe](ctx, p, probeHandle, "kid")
	if err != nil {
		t.Fatal(err)
	}
	if got := child.Path().String(); got != agent.Root("Probe", "typed").Child("Probe", "kid").String() {
		t.Fatalf("child path %s", got)
	}
	if _, err := probeHandle.Get(ctx, e.rt, agent.Root("Other", "x")); err == nil {
		t.Error("Get of another class's path succeeded")
	}
}

// TestMethodKey: Method gives a method value's name, the durable key of
// schedules; a function that is not a method value gets a key that the
// schedule APIs refuse.
func TestMethodKey(t *testing.T) {
	h := newHooks()
	e := startRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ctx := context.Background()
	p := getProbe(t, e.rt, agent.Root("Probe", "m"))
	if got := agent.Method(p.Tick); got != "Tick" {
		t.Fatalf("Method(p.Tick) = %q", got)
	}
	if got := agent.Method((*Probe).Tick); got == "Tick" {
		t.Fatalf("a method expression got the key %q", got)
	}
	s, err := p.ScheduleAfter(ctx, 10*time.Second, agent.Method(p.Tick), Payload{N: 3})
	if err != nil {
		t.Fatal(err)
	}
	if s.Method != "Tick" {
		t.Fatalf("schedule method %q", s.Method)
	}
	e.clock.Advance(10 * time.Second)
	select {
	case f := <-h.fired:
		if f.method != "Tick" || f.payload.N != 3 {
			t.Fatalf("fired %+v", f)
		}
	case <-time.After(waitLimit):
		t.Fatal("the schedule did not fire")
	}
	for _, fn := range []any{func(context.Context, Payload) error { return nil }, nil, 42} {
		if _, err := p.ScheduleAfter(ctx, time.Second, agent.Method(fn), nil); err == nil {
			t.Errorf("a schedule of Method(%T) was accepted", fn)
		}
	}
}
