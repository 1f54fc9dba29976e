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
// hook, then the layers' checks. It also logs a warning for each method
// that looks like a hook but is none (hookLookalikes).
func (rt *Runtime) check(ctx context.Context) error {
	var errs []error
	for _, ci := range rt.classes {
		if err := checkHooks(ci, rt.allHooks()); err != nil {
			errs = append(errs, err)
		}
		for _, w := range hookLookalikes(ci, rt.allHooks()) {
			rt.log.Warn("agent: class "+ci.Name+": "+w.String(), "class", ci.Name, "method", w.method, "hook", w.hook)
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

// lookalike is a method of a class that looks like a hook but is none, so
// nothing calls it.
type lookalike struct {
	method string // the class's method
	hook   string // the hook method it resembles, or has the name of
	iface  reflect.Type
	layer  reflect.Type // set when the method is the hook of a layer the class does not embed
}

func (l lookalike) String() string {
	if l.layer != nil {
		return fmt.Sprintf("method %s is the hook %s of %s, which the class does not embed: nothing calls it", l.method, l.iface, l.layer)
	}
	return fmt.Sprintf("method %s looks like the hook %s (%s) but is none: nothing calls it as a hook "+
		"(rename it if it is a misspelt hook; a callback named elsewhere, such as a schedule's, is fine)", l.method, l.hook, l.iface)
}

// hookLookalikes returns the class's own exported methods named On… that
// are no hook the class has: the hook method of a layer the class does not
// embed, or a name at most a small edit distance (lookalikeDistance) from
// a hook method's. Methods farther from every hook, such as a detached
// run's OnImportDone callback, are taken as the agent's own.
func hookLookalikes(ci *classInfo, hs []Hook) []lookalike {
	type hookMethod struct {
		iface, layer reflect.Type
		applies      bool
	}
	byName := map[string]hookMethod{}
	for _, h := range hs {
		applies := h.Layer == nil || ci.embeds(h.Layer)
		for i := 0; i < h.Interface.NumMethod(); i++ {
			name := h.Interface.Method(i).Name
			if prev, ok := byName[name]; !ok || (applies && !prev.applies) {
				byName[name] = hookMethod{h.Interface, h.Layer, applies}
			}
		}
	}
	callable := map[string]bool{}
	for wire := range ci.callables {
		callable[goMethodName(wire)] = true
	}
	var out []lookalike
	for i := 0; i < ci.typ.NumMethod(); i++ {
		name := ci.typ.Method(i).Name
		if !strings.HasPrefix(name, "On") || callable[name] {
			continue
		}
		if _, ok := ci.frameworkMethod(name); ok {
			continue
		}
		if hm, ok := byName[name]; ok {
			if !hm.applies {
				out = append(out, lookalike{method: name, hook: name, iface: hm.iface, layer: hm.layer})
			}
			continue
		}
		best, bestD := "", -1
		for hook := range byName {
			if d := editDistance(name, hook); d <= lookalikeDistance(hook) && (bestD < 0 || d < bestD || (d == bestD && hook < best)) {
				best, bestD = hook, d
			}
		}
		if bestD >= 0 {
			out = append(out, lookalike{method: name, hook: best, iface: byName[best].iface})
		}
	}
	return out
}

// lookalikeDistance is how many single-letter edits make a name look like
// the hook method name: one for short names (OnStart, OnClose), two from
// twelve letters (OnChatMessage, OnAgentToolFinish).
func lookalikeDistance(hook string) int {
	if len(hook) >= 12 {
		return 2
	}
	return 1
}

// editDistance is the number of single-letter edits (insert, delete,
// replace, swap two neighbours) between a and b: their optimal string
// alignment distance, in bytes (Go method names here are ASCII).
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
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
