package agent

import (
	"context"
	"net/http"
)

// Layer is implemented by framework layers that agent types embed, such as
// chat.Base. The runtime finds every embedded layer (at any depth) by
// reflection when the class is registered, so several layers can be
// embedded side by side without their hooks shadowing each other, and calls
// their hooks innermost first. Agent code does not implement Layer; it uses
// the ordinary hooks (OnStart, OnConnect, …).
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
