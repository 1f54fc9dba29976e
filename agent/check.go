package agent

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Hook describes an optional hook interface that agents implement (OnStart,
// SystemPrompt, OnAgentToolFinish, …). The runtime checks every class
// against the hooks declared with DeclareHooks: a method whose name is a
// hook's but whose signature is not is a mistake (the hook would be
// silently ignored), and Register or Start refuses the class.
type Hook struct {
	// Interface is the hook's interface type, such as
	// reflect.TypeFor[agent.Starter]().
	Interface reflect.Type
	// Layer, when set, limits the hook to classes that embed this layer
	// type (such as chat.Base): only those call it.
	Layer reflect.Type
}

// HookFor returns the Hook of interface type I (limited to classes that
// embed layer L when L is not nil).
func HookFor[I any](layer reflect.Type) Hook {
	return Hook{Interface: reflect.TypeFor[I](), Layer: layer}
}

// hooks are the runtime's own hooks (hooks.go).
var hooks = []Hook{
	HookFor[Starter](nil),
	HookFor[Connector](nil),
	HookFor[MessageHandler](nil),
	HookFor[Closer](nil),
	HookFor[RequestHandler](nil),
	HookFor[SubAgentGate](nil),
	HookFor[StateValidator](nil),
	HookFor[StateObserver](nil),
}

// ErrStarted is returned by set-up calls (DeclareHooks, AddCheck, and the
// layers' Configure and Install) made after Start.
var ErrStarted = errors.New("agent: the runtime has started; set it up before Start")

// Started reports whether Start has been called.
func (rt *Runtime) Started() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.started
}

// DeclareHooks adds hook interfaces of a layer to the runtime's check of
// its classes (see Hook); the classes registered so far are checked at
// once, later ones by Register, and all again by Start.
func (rt *Runtime) DeclareHooks(hs ...Hook) error {
	if rt.Started() {
		return ErrStarted
	}
	rt.hooks = append(rt.hooks, hs...)
	for _, ci := range rt.classes {
		if err := checkHooks(ci, hs); err != nil {
			return err
		}
	}
	return nil
}

// AddCheck adds a check that Start runs before it starts anything: a layer
// checks there what only the whole set-up shows (an agent tool naming a
// class that is not registered). An error fails Start.
func (rt *Runtime) AddCheck(check func(ctx context.Context) error) error {
	if rt.Started() {
		return ErrStarted
	}
	rt.checks = append(rt.checks, check)
	return nil
}

// Classes returns the registered classes.
func (rt *Runtime) Classes() []Class {
	out := make([]Class, 0, len(rt.classes))
	for _, ci := range rt.classes {
		out = append(out, ci.Class)
	}
	return out
}

// check runs the start-time checks: every class against every declared
// hook, then the layers' checks.
func (rt *Runtime) check(ctx context.Context) error {
	var errs []error
	for _, ci := range rt.classes {
		if err := checkHooks(ci, rt.allHooks()); err != nil {
			errs = append(errs, err)
		}
	}
	for _, c := range rt.checks {
		if err := c(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (rt *Runtime) allHooks() []Hook { return append(append([]Hook(nil), hooks...), rt.hooks...) }

// checkHooks reports the first method of the class that has a hook's name
// but not its signature.
func checkHooks(ci *classInfo, hs []Hook) error {
	for _, h := range hs {
		if h.Layer != nil && !ci.embeds(h.Layer) {
			continue
		}
		if ci.typ.Implements(h.Interface) {
			continue
		}
		for i := 0; i < h.Interface.NumMethod(); i++ {
			want := h.Interface.Method(i)
			got, ok := ci.typ.MethodByName(want.Name)
			if !ok {
				continue
			}
			return fmt.Errorf("agent: class %s: method %s is %s, but the hook %s wants %s: fix its signature (or rename it)",
				ci.Name, want.Name, signature(got.Type, true), h.Interface, signature(want.Type, false))
		}
	}
	return nil
}

// embeds reports whether the class embeds the layer type.
func (ci *classInfo) embeds(layer reflect.Type) bool {
	for _, l := range ci.layers {
		if l.typ == layer {
			return true
		}
	}
	return false
}

// signature spells a method's type as func(…) …, without the receiver of
// a method expression's type.
func signature(t reflect.Type, hasRecv bool) string {
	var in, out []string
	for i := 0; i < t.NumIn(); i++ {
		if i == 0 && hasRecv {
			continue
		}
		in = append(in, t.In(i).String())
	}
	for i := 0; i < t.NumOut(); i++ {
		out = append(out, t.Out(i).String())
	}
	s := "func(" + strings.Join(in, ", ") + ")"
	switch len(out) {
	case 0:
	case 1:
		s += " " + out[0]
	default:
		s += " (" + strings.Join(out, ", ") + ")"
	}
	return s
}
