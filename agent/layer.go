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
