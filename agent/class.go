package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"unicode"
	"unicode/utf8"
)

// Class describes an agent class to register with a Runtime.
type Class struct {
	// Name is the class name, such as "Counter" or "AIAssistant". Clients
	// address it by its kebab-case route name (see Kebab).
	Name string
	// New returns a fresh, zero instance. The runtime binds it, loads its
	// state and calls OnStart before it is used.
	New func() Agent
	// Callable lists the method names clients may call over RPC, in the
	// wire spelling ("increment", "countTo"). Each maps to the exported Go
	// method of the same name with its first letter upper-cased. A method
	// whose first parameter after an optional context.Context is a *Stream
	// is a streaming method.
	Callable []string
	// Concurrent lets the instance take its inputs concurrently: RPC calls,
	// frames, schedule callbacks and framework deliveries then run as they
	// arrive, each on its own goroutine, and the agent guards its own data.
	// It is the class's own risk (docs/concurrency.md); the default is one
	// input at a time.
	Concurrent bool
	// Public lets clients reach the class's root instances through the
	// server (/agents/{route}/{name}). A class without it is reachable by
	// clients only as a sub-agent, through its parent's route and gate
	// (OnBeforeSubAgent and the layers' gates): child-only classes, such
	// as the helpers an agent runs as tools, leave it false. Go code
	// (Runtime.Get, SubAgent, Call, Connect) is not affected. Public is
	// about routing, not identity: combine it with the server's
	// authorization.
	Public bool

	typ reflect.Type // the instance type a ClassHandle promises, if any
}

// Agent is implemented by every agent type by embedding Base.
type Agent interface {
	base() *Base
}

type classInfo struct {
	Class
	route     string
	typ       reflect.Type
	callables map[string]*method
	layers    []layerRef // embedded layers, innermost first
}

var (
	ctxType    = reflect.TypeFor[context.Context]()
	errType    = reflect.TypeFor[error]()
	streamType = reflect.TypeFor[*Stream]()
)

// method is a reflected agent method that can be invoked with JSON arguments.
type method struct {
	name      string // Go name
	index     int    // method index on the pointer type
	hasCtx    bool
	streaming bool
	params    []reflect.Type // after ctx and stream
	hasResult bool
	hasErr    bool
}

func newClassInfo(c Class) (*classInfo, error) {
	if c.Name == "" || c.New == nil {
		return nil, fmt.Errorf("agent: class needs a Name and a New function")
	}
	sample := c.New()
	if sample == nil {
		return nil, fmt.Errorf("agent: class %s: New returned nil", c.Name)
	}
	ci := &classInfo{Class: c, route: Kebab(c.Name), typ: reflect.TypeOf(sample), callables: map[string]*method{}}
	if c.typ != nil && ci.typ != c.typ {
		return nil, fmt.Errorf("agent: class %s: New returns a %s, but its handle is a ClassHandle[%s]", c.Name, ci.typ, c.typ)
	}
	if ci.route == "sub" || ci.route == "" {
		return nil, fmt.Errorf("agent: class %s: route name %q is reserved", c.Name, ci.route)
	}
	if ci.typ.Kind() != reflect.Pointer || ci.typ.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("agent: class %s: New must return a pointer to a struct that embeds agent.Base", c.Name)
	}
	layers, err := findLayers(sample)
	if err != nil {
		return nil, fmt.Errorf("agent: class %s: %w", c.Name, err)
	}
	ci.layers = layers
	for _, wire := range c.Callable {
		if from, ok := ci.frameworkMethod(goMethodName(wire)); ok {
			return nil, fmt.Errorf("agent: class %s: callable %q: %s is a framework method (of %s), which clients must not call; "+
				"give the agent's own method another name", c.Name, wire, goMethodName(wire), from)
		}
		m, err := reflectMethod(ci.typ, goMethodName(wire))
		if err != nil {
			return nil, fmt.Errorf("agent: class %s: callable %q: %w", c.Name, wire, err)
		}
		ci.callables[wire] = m
	}
	return ci, nil
}

var baseType = reflect.TypeFor[*Base]()

// frameworkMethod reports whether name is a method of the framework types
// the class embeds: agent.Base and every embedded layer (such as
// chat.Base), and names the type it belongs to. Such methods act on the
// instance as a whole (its storage, its transcript, its life), so they are
// never callable, even when the agent declares its own method of that name.
func (ci *classInfo) frameworkMethod(name string) (string, bool) {
	if _, ok := baseType.MethodByName(name); ok {
		return "agent.Base", true
	}
	for _, l := range ci.layers {
		if _, ok := reflect.PointerTo(l.typ).MethodByName(name); ok {
			return l.typ.String(), true
		}
	}
	return "", false
}

// goMethodName maps a wire method name to its Go spelling.
func goMethodName(wire string) string {
	r, n := utf8.DecodeRuneInString(wire)
	if r == utf8.RuneError {
		return wire
	}
	return string(unicode.ToUpper(r)) + wire[n:]
}

// reflectMethod finds and checks the signature of an exported method:
// func([ctx context.Context,] [s *Stream,] args...) [R] [error].
func reflectMethod(typ reflect.Type, name string) (*method, error) {
	rm, ok := typ.MethodByName(name)
	if !ok && name == invalidMethod {
		return nil, fmt.Errorf("no method on %s: the key is not a method's name (agent.Method takes a method value, such as a.Remind)", typ)
	}
	if !ok {
		return nil, fmt.Errorf("no method %s on %s", name, typ)
	}
	ft := rm.Type // receiver is In(0)
	m := &method{name: name, index: rm.Index}
	i := 1
	if i < ft.NumIn() && ft.In(i) == ctxType {
		m.hasCtx = true
		i++
	}
	if i < ft.NumIn() && ft.In(i) == streamType {
		m.streaming = true
		i++
	}
	if ft.IsVariadic() {
		return nil, fmt.Errorf("method %s: variadic methods are not supported", name)
	}
	for ; i < ft.NumIn(); i++ {
		m.params = append(m.params, ft.In(i))
	}
	switch ft.NumOut() {
	case 0:
	case 1:
		if ft.Out(0) == errType {
			m.hasErr = true
		} else {
			m.hasResult = true
		}
	case 2:
		if ft.Out(1) != errType {
			return nil, fmt.Errorf("method %s: second result must be error", name)
		}
		m.hasResult, m.hasErr = true, true
	default:
		return nil, fmt.Errorf("method %s: too many results", name)
	}
	return m, nil
}

// ArgumentError reports client arguments that do not fit a method.
type ArgumentError struct {
	Method string
	Index  int
	Err    error
}

func (e *ArgumentError) Error() string {
	return fmt.Sprintf("invalid argument %d for %s: %v", e.Index, e.Method, e.Err)
}

func (e *ArgumentError) Unwrap() error { return e.Err }

// invoke calls m on recv with JSON arguments. A panic in the method is
// returned as an error.
func (m *method) invoke(ctx context.Context, recv reflect.Value, stream *Stream, args []json.RawMessage) (result any, err error) {
	in := make([]reflect.Value, 0, len(m.params)+2)
	if m.hasCtx {
		in = append(in, reflect.ValueOf(ctx))
	}
	if m.streaming {
		in = append(in, reflect.ValueOf(stream))
	}
	for i, pt := range m.params {
		v := reflect.New(pt)
		if i < len(args) && len(args[i]) > 0 && string(args[i]) != "null" {
			if err := json.Unmarshal(args[i], v.Interface()); err != nil {
				return nil, &ArgumentError{Method: m.name, Index: i, Err: err}
			}
		}
		in = append(in, v.Elem())
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s panicked: %v", m.name, p)
		}
	}()
	out := recv.Method(m.index).Call(in)
	if m.hasErr {
		if e := out[len(out)-1]; !e.IsNil() {
			return nil, e.Interface().(error)
		}
	}
	if m.hasResult {
		return out[0].Interface(), nil
	}
	return nil, nil
}
