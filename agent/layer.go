package agent

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
)

// Layer is implemented by framework layers that agent types embed, such as
// chat.Base. The runtime finds every embedded layer (at any depth) when the
// class is registered, so several layers can be embedded side by side
// without their hooks shadowing each other, and calls their hooks innermost
// first. Agent code does not implement Layer; it uses the ordinary hooks
// (OnStart, OnConnect, …).
//
// A layer type L has an accessor: one exported method of *L that takes no
// arguments and returns *L, its receiver (chat.Base's is ChatBase). Go
// promotes it to the agent type through every embedded field, exported or
// not, and the runtime reaches the layer of each instance by calling it.
// Give it a name of the layer's own: two layers with the same accessor
// name side by side would hide each other's. Register refuses a class
// whose layer has no accessor, or whose accessor the agent type hides (a
// method of its own of that name, or the layer embedded twice), or whose
// accessor returns something other than the embedded layer.
type Layer interface {
	// StartLayer runs when the instance is hydrated, after its state is
	// loaded and before OnStart. self is the agent value that embeds the
	// layer, for finding the agent's own hooks.
	StartLayer(ctx context.Context, self Agent) error
}

// LayerConnector is a Layer that sends frames to a new connection right
// after the connect frames (identity, state, MCP) and before OnConnect.
type LayerConnector interface {
	LayerConnect(ctx context.Context, conn *Conn)
}

// LayerFrameHandler is a Layer that claims client frames by type. It
// reports whether it handled the frame; frames no layer handles go to
// OnMessage or are answered with an error.
type LayerFrameHandler interface {
	LayerFrame(ctx context.Context, conn *Conn, frameType string, data []byte) bool
}

// LayerHTTPHandler is a Layer that claims plain HTTP requests to the
// instance (r.URL.Path is the part after the instance) before OnRequest.
type LayerHTTPHandler interface {
	LayerHTTP(ctx context.Context, w http.ResponseWriter, r *http.Request) bool
}

// LayerCloser is a Layer told when a connection closes, before OnClose.
type LayerCloser interface {
	LayerClose(ctx context.Context, conn *Conn)
}

// LayerStarted is a Layer told after the agent's OnStart returned, for work
// that must wait for the agent's own start-up (agent-tool recovery).
type LayerStarted interface {
	LayerStarted(ctx context.Context)
}

// LayerGate is a Layer that takes part in deciding whether a client may
// reach a sub-agent through this instance's route. It runs before the
// agent's OnBeforeSubAgent; a non-nil error refuses the request as
// SubAgentGate describes.
type LayerGate interface {
	LayerGate(ctx context.Context, r *http.Request, class, name string) error
}

// layerRef is how the runtime reaches one layer a class embeds.
type layerRef struct {
	typ    reflect.Type // the layer's struct type
	method int          // index of its accessor in the agent type's method set
}

var layerType = reflect.TypeFor[Layer]()

// findLayers returns the layers that sample's type embeds, innermost
// first: the struct fields embedded (at any depth) whose pointer
// implements Layer, each with its accessor. It calls each accessor on
// sample to check that it returns the embedded field.
func findLayers(sample Agent) ([]layerRef, error) {
	v := reflect.ValueOf(sample)
	var out []layerRef
	for _, path := range layerPaths(v.Type().Elem(), nil) {
		field := v.Elem().FieldByIndex(path)
		lt := field.Type()
		name, err := layerAccessor(lt)
		if err != nil {
			return nil, err
		}
		where := fieldPath(v.Type().Elem(), path)
		m, ok := v.Type().MethodByName(name)
		if !ok || m.Type.NumIn() != 1 || m.Type.NumOut() != 1 || m.Type.Out(0) != reflect.PointerTo(lt) {
			return nil, fmt.Errorf("layer %s (embedded as %s) is hidden: %s does not promote its accessor %s "+
				"(the agent has a method of that name, or embeds the layer twice)", lt, where, v.Type(), name)
		}
		// Pointer reads the field's address without unsafe; the field may
		// sit behind an unexported embedding, which the accessor passes.
		if got := v.Method(m.Index).Call(nil)[0]; got.Pointer() != field.Addr().Pointer() {
			return nil, fmt.Errorf("layer %s (embedded as %s): its accessor %s returns another value than the embedded layer "+
				"(an accessor returns its receiver), or the layer is embedded twice", lt, where, name)
		}
		out = append(out, layerRef{typ: lt, method: m.Index})
	}
	return out, nil
}

// layerPaths returns the index paths of the struct fields embedded (at any
// depth) in t whose pointer implements Layer, innermost first.
func layerPaths(t reflect.Type, prefix []int) [][]int {
	var out [][]int
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.Anonymous || f.Type.Kind() != reflect.Struct {
			continue
		}
		idx := append(append([]int(nil), prefix...), i)
		inner := layerPaths(f.Type, idx)
		out = append(out, inner...)
		// A struct that embeds a layer implements Layer by promotion: it is
		// that layer, not another one.
		if len(inner) == 0 && reflect.PointerTo(f.Type).Implements(layerType) {
			out = append(out, idx)
		}
	}
	return out
}

// layerAccessor returns the name of layer type lt's accessor: its one
// exported method of *lt that takes nothing and returns *lt.
func layerAccessor(lt reflect.Type) (string, error) {
	pt := reflect.PointerTo(lt)
	var names []string
	for i := 0; i < pt.NumMethod(); i++ {
		m := pt.Method(i) // In(0) is the receiver
		if m.Type.NumIn() == 1 && m.Type.NumOut() == 1 && m.Type.Out(0) == pt {
			names = append(names, m.Name)
		}
	}
	switch len(names) {
	case 1:
		return names[0], nil
	case 0:
		return "", fmt.Errorf("layer %s has no accessor: a method func() %s that returns its receiver (see agent.Layer)", lt, pt)
	default:
		return "", fmt.Errorf("layer %s has several accessors (%s): it needs exactly one method func() %s (see agent.Layer)",
			lt, strings.Join(names, ", "), pt)
	}
}

// fieldPath spells the field index path in t as the selector a reader
// writes, such as "detParent.Base".
func fieldPath(t reflect.Type, path []int) string {
	names := make([]string, len(path))
	for i, j := range path {
		f := t.Field(j)
		names[i] = f.Name
		t = f.Type
	}
	return strings.Join(names, ".")
}

// layersOf returns the embedded layers of a, innermost first, each through
// its accessor.
func (ci *classInfo) layersOf(a Agent) []Layer {
	if len(ci.layers) == 0 {
		return nil
	}
	v := reflect.ValueOf(a)
	out := make([]Layer, 0, len(ci.layers))
	for _, l := range ci.layers {
		out = append(out, v.Method(l.method).Call(nil)[0].Interface().(Layer))
	}
	return out
}

// Extension adds a layer to every instance of a runtime, whatever its
// class: Use registers a function that builds the layer for each hydrated
// instance. Agent tools use it, since every agent can run them.
type Extension func(a Agent) Layer

// Use registers an extension. Call it before Start: after it, Use
// returns ErrStarted.
func (rt *Runtime) Use(ext Extension) error {
	if rt.Started() {
		return ErrStarted
	}
	rt.extensions = append(rt.extensions, ext)
	return nil
}

// LayerOf returns the layer of type T of agent a (embedded or added by an
// extension), if it has one.
func LayerOf[T Layer](a Agent) (T, bool) {
	for _, l := range a.base().in.layers {
		if t, ok := l.(T); ok {
			return t, true
		}
	}
	var zero T
	return zero, false
}

type agentKey struct{}

// WithAgent returns a context that carries the agent whose code runs in it.
func WithAgent(ctx context.Context, a Agent) context.Context {
	return context.WithValue(ctx, agentKey{}, a)
}

// FromContext returns the agent whose code runs in ctx (inside RPC methods,
// schedule callbacks, hooks and chat turns), if any.
func FromContext(ctx context.Context) (Agent, bool) {
	a, ok := ctx.Value(agentKey{}).(Agent)
	return a, ok
}
