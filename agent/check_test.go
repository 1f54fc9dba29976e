package agent_test

import (
	"context"
	"errors"
	"go/token"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/internal/testkit/teststore"
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
	assertRefused(t, e.rt, []refusal{
		{agent.Class{Name: "BadStart", New: func() agent.Agent { return &badStart{} }},
			[]string{"BadStart", "OnStart", "func() error", "agent.Starter", "func(context.Context) error"}},
		{agent.Class{Name: "BadConnect", New: func() agent.Agent { return &badConnect{} }},
			[]string{"BadConnect", "OnConnect", "agent.Connector", "func(context.Context, *agent.Conn) error"}},
	})
	// A right signature registers.
	if err := e.rt.Register(probeClass(newHooks())); err != nil {
		t.Fatal(err)
	}
}

// refusal is a class that Register must refuse, and what its error must
// say.
type refusal struct {
	class agent.Class
	want  []string
}

// assertRefused checks that rt.Register refuses each class with an error
// that says every want, and leaves it unregistered.
func assertRefused(t *testing.T, rt *agent.Runtime, cases []refusal) {
	t.Helper()
	for _, tc := range cases {
		err := rt.Register(tc.class)
		if err == nil {
			t.Errorf("%s registered", tc.class.Name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.class.Name, err, w)
			}
		}
		if rt.HasClass(tc.class.Name) {
			t.Errorf("%s is registered after the error", tc.class.Name)
		}
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

// keyInner declares methods that keyOuter promotes.
type keyInner struct{}

func (keyInner) ByValue()    {}
func (*keyInner) ByPointer() {}

type keyOuter struct {
	agent.Base
	keyInner
}

func (*keyOuter) Own() {}

// keyGeneric is a generic type with a method.
type keyGeneric[T any] struct{}

func (*keyGeneric[T]) Generic() {}

func keyFunc() {}

// TestMethodKeyDerivation pins the derivation agent.Method documents: the
// key of a method value is the method's name, for pointer and value
// receivers, promoted methods, generic types and interface method values,
// and is also the name the instance's method set has; anything else
// (a function, a closure, a method expression, nil, not a function) gets
// one key that no method has. A Go toolchain that spells method values
// differently fails here.
func TestMethodKeyDerivation(t *testing.T) {
	o := &keyOuter{}
	var i interface{ Own() } = o
	for _, tc := range []struct {
		what string
		fn   any
		want string
	}{
		{"own method", o.Own, "Own"},
		{"promoted pointer method", o.ByPointer, "ByPointer"},
		{"promoted value method", o.ByValue, "ByValue"},
		{"generic type's method", (&keyGeneric[int]{}).Generic, "Generic"},
		{"interface method value", i.Own, "Own"},
	} {
		got := agent.Method(tc.fn)
		if got != tc.want {
			t.Errorf("%s: Method = %q, want %q", tc.what, got, tc.want)
		}
		if _, ok := reflect.TypeOf(o).MethodByName(got); !ok && tc.what != "generic type's method" {
			t.Errorf("%s: *keyOuter has no method %q", tc.what, got)
		}
	}
	var nilFunc func()
	invalid := agent.Method(nil)
	if token.IsIdentifier(invalid) {
		t.Fatalf("the key of nil is %q, a name a method could have", invalid)
	}
	for _, tc := range []struct {
		what string
		fn   any
	}{
		{"function", keyFunc},
		{"closure", func() {}},
		{"method expression", (*keyOuter).Own},
		{"nil func", nilFunc},
		{"not a function", 42},
	} {
		if got := agent.Method(tc.fn); got != invalid {
			t.Errorf("%s: Method = %q, want the invalid key %q", tc.what, got, invalid)
		}
	}
}

// logRecords is a slog.Handler that keeps the messages of the records it
// gets, for tests that check what the runtime logged.
type logRecords struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Level.String()+" "+r.Message)
	return nil
}

func (l *logRecords) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// greeter is a hook of greetLayer (layer_test.go), declared by the test.
type greeter interface {
	OnGreet(ctx context.Context) error
}

// lookalikes has methods that look like hooks but are none, beside a
// real hook and a callback named as the seed names its own.
type lookalikes struct{ agent.Base }

func (l *lookalikes) OnStart(ctx context.Context) error                  { return nil } // a hook
func (l *lookalikes) OnStrat(ctx context.Context) error                  { return nil } // misspelt OnStart
func (l *lookalikes) OnConect(ctx context.Context, c *agent.Conn) error  { return nil } // misspelt OnConnect
func (l *lookalikes) OnStateUpdated(ctx context.Context, s []byte) error { return nil } // OnStateUpdate, two edits
func (l *lookalikes) OnGreet(ctx context.Context) error                  { return nil } // a hook of a layer it does not embed
func (l *lookalikes) OnImportDone(ctx context.Context) error             { return nil } // a callback, far from every hook
func (l *lookalikes) OnStop(ctx context.Context) error                   { return nil } // far from OnStart

// greets embeds the layer whose hook OnGreet is.
type greets struct {
	agent.Base
	greetLayer
}

func (g *greets) OnGreet(ctx context.Context) error { return nil }

// TestHookLookalikeWarning: Start logs one warning for each method named
// On… that is no hook the class has but looks like one (a small edit
// from a hook's name, or the hook of a layer the class does not embed),
// and none for hooks, a layer's hook on a class that embeds it, or a
// callback far from every hook name. The class still starts: a
// lookalike may be a callback named elsewhere.
func TestHookLookalikeWarning(t *testing.T) {
	ctx := context.Background()
	logs := &logRecords{}
	db := teststore.Open(t, &pg, t.TempDir())
	t.Cleanup(func() { db.Close() })
	rt, err := agent.New(ctx, agent.Options{DB: db, Clock: clockwork.NewFakeClockAt(epoch), IdleTimeout: -1, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	rt.MustRegister(agent.Class{Name: "Lookalikes", New: func() agent.Agent { return &lookalikes{} }})
	rt.MustRegister(agent.Class{Name: "Greets", New: func() agent.Agent { return &greets{} }})
	if err := rt.DeclareHooks(agent.HookFor[greeter](reflect.TypeFor[greetLayer]())); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"OnStrat":        "looks like the hook OnStart (agent.Starter)",
		"OnConect":       "looks like the hook OnConnect (agent.Connector)",
		"OnStateUpdated": "looks like the hook OnStateUpdate (agent.StateObserver)",
		"OnGreet":        "is the hook agent_test.greeter of agent_test.greetLayer, which the class does not embed",
	}
	got := map[string]int{}
	for _, m := range logs.messages() {
		if !strings.Contains(m, "nothing calls it") {
			continue
		}
		if !strings.HasPrefix(m, "WARN agent: class Lookalikes: method ") {
			t.Errorf("unexpected warning %q", m)
			continue
		}
		method, _, _ := strings.Cut(strings.TrimPrefix(m, "WARN agent: class Lookalikes: method "), " ")
		got[method]++
		if w, ok := want[method]; !ok || !strings.Contains(m, w) {
			t.Errorf("warning %q, want one that says %q", m, w)
		}
	}
	for method := range want {
		if got[method] != 1 {
			t.Errorf("%s: %d warnings, want 1 (logs: %q)", method, got[method], logs.messages())
		}
	}
}
