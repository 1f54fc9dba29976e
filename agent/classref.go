package agent

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"strings"
)

// ClassName is the constraint of parameters that name a class: a string, or
// a typed ClassHandle. Functions that take one accept both, so a typed
// handle goes wherever a class name goes.
type ClassName interface{ ~string }

// ClassHandle is a typed handle of a class whose instances are T: its value
// is the class name, so it is accepted wherever a class name is (Root,
// SubAgent, agenttool.AgentTool, agenttool.RunAgentTool, …), and a
// misspelt handle does not compile where a misspelt string would only fail
// when used. Create one with NewClass and register it with Class.
type ClassHandle[T Agent] string

// NewClass returns the typed handle of the class named name.
//
//	var Researcher = agent.NewClass[*Researcher]("Researcher")
//	rt.Register(Researcher.Class(agent.Class{}))
func NewClass[T Agent](name string) ClassHandle[T] { return ClassHandle[T](name) }

// Name returns the class name.
func (h ClassHandle[T]) Name() string { return string(h) }

// Class completes c as the handle's class: its Name is the handle's, its
// New (when nil) returns a zero T, and Register checks that New returns a T.
func (h ClassHandle[T]) Class(c Class) Class {
	c.Name = string(h)
	c.typ = reflect.TypeFor[T]()
	if c.New == nil {
		c.New = func() Agent {
			t := reflect.TypeFor[T]()
			if t.Kind() != reflect.Pointer {
				var zero T
				return zero
			}
			return reflect.New(t.Elem()).Interface().(Agent)
		}
	}
	return c
}

// Root returns the path of the class's root instance name.
func (h ClassHandle[T]) Root(name string) Path { return Root(h, name) }

// Get returns the class's instance at path (see Runtime.Get), typed.
func (h ClassHandle[T]) Get(ctx context.Context, rt *Runtime, path Path) (T, error) {
	var zero T
	if leaf := path.Leaf(); leaf.Class != string(h) {
		return zero, fmt.Errorf("agent: %s is not an instance of %s", path, string(h))
	}
	a, err := rt.Get(ctx, path)
	if err != nil {
		return zero, err
	}
	t, ok := a.(T)
	if !ok {
		return zero, fmt.Errorf("agent: %s is a %T, not a %T", path, a, zero)
	}
	return t, nil
}

// Method returns the durable key of a method value — the method's name —
// for the APIs that take a callback by name because it must survive a
// restart (schedules, agenttool.DetachedOptions.OnFinish, whose typed
// form is agenttool.OnFinish): the key is stored, and resolved again on
// the rehydrated instance when the callback is due. Passing the method
// value instead of its name lets the compiler check that the method
// exists:
//
//	b.ScheduleAfter(ctx, time.Hour, agent.Method(a.Remind), payload)
//
// How the key is derived: a method value x.M is a function whose code is
// a wrapper the compiler names after the method, "pkg.(*T).M-fm" (or
// "pkg.T.M-fm", "pkg.I.M-fm" for an interface, where T is the type that
// declares M, also when x embeds it). Method reads that name with
// runtime.FuncForPC and keeps what follows the last dot before "-fm": M,
// which is also the name the instance's method set has for it. The API
// that takes the key checks it when the callback is given (a schedule
// when it is created, an OnFinish when its run is dispatched): an
// instance without a method of that name and signature is refused then,
// not when the callback is due.
//
// fn must be a method value (x.M): for anything else (a function, a
// closure, a method expression (*T).M, nil) Method returns a key that no
// method has, which those APIs refuse. TestMethodKeyDerivation pins the
// compiler's spelling.
func Method(fn any) string {
	v := reflect.ValueOf(fn)
	if v.Kind() != reflect.Func || v.IsNil() {
		return invalidMethod
	}
	f := runtime.FuncForPC(v.Pointer())
	if f == nil {
		return invalidMethod
	}
	// A method value's function is the compiler's wrapper
	// "pkg.(*T).Name-fm" (or "pkg.T.Name-fm").
	name, ok := strings.CutSuffix(f.Name(), "-fm")
	if !ok {
		return invalidMethod
	}
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	if name == "" {
		return invalidMethod
	}
	return name
}

// invalidMethod is Method's key for a value that is not a method value: no
// Go method can have this name.
const invalidMethod = "(not a method value)"
