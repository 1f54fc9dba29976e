package agent

import (
	"context"
	"encoding/json"
	"net/http"
)

// The hooks below are optional: an agent type implements the ones it needs
// and the runtime finds them by type assertion.

// Starter is implemented by agents that run code after every (re)hydration:
// on first use, after an eviction and after a process restart.
type Starter interface {
	OnStart(ctx context.Context) error
}

// Connector is implemented by agents that want to know about new
// connections. It runs after the connect frames (identity, state, MCP) were
// sent. Returning an error closes the connection with code 1011.
type Connector interface {
	OnConnect(ctx context.Context, conn *Conn) error
}

// MessageHandler receives frames that are not part of the protocol: frames
// whose type the runtime and the agent's frame handlers do not know, and text
// that is not JSON.
type MessageHandler interface {
	OnMessage(ctx context.Context, conn *Conn, data []byte) error
}

// Closer is told when a connection closes.
type Closer interface {
	OnClose(ctx context.Context, conn *Conn, code int, reason string)
}

// RequestHandler answers plain HTTP requests to the instance's path, with
// the instance prefix stripped from r.URL.Path.
type RequestHandler interface {
	OnRequest(ctx context.Context, w http.ResponseWriter, r *http.Request)
}

// SubAgentGate decides whether a client may reach a sub-agent through this
// agent's route (…/sub/{class}/{name}). Returning nil admits the request; a
// *HTTPError refuses it with its status and message, and any other error
// refuses it with 404. A refused request creates nothing.
type SubAgentGate interface {
	OnBeforeSubAgent(ctx context.Context, r *http.Request, class, name string) error
}

// StateValidator checks state sent by a client (a cf_agent_state frame, the
// npm clients' setState) before it is persisted. Client writes are closed by
// default: an agent without this hook refuses every one, and a state with a
// number that is not a finite float64 (1e999999) is refused before the hook
// runs. A returned error refuses the update. The client is told of any
// refusal with {"type":"cf_agent_state_error","error":"State update
// rejected"}; it keeps its optimistic state (the reference's behaviour).
type StateValidator interface {
	ValidateState(ctx context.Context, next json.RawMessage, from *Conn) error
}

// StateObserver is told after the state changed, from a client (from is the
// sending connection) or from the server (from is nil).
type StateObserver interface {
	OnStateUpdate(ctx context.Context, state json.RawMessage, from *Conn)
}

// HTTPError is an error with an HTTP status, used by hooks to refuse a
// request with a specific answer.
type HTTPError struct {
	Status  int
	Message string
}

func (e *HTTPError) Error() string { return e.Message }

// CloseError asks the server to accept a WebSocket and close it at once with
// Code (1008 or 4000–4999 make the npm client stop retrying) and Reason.
type CloseError struct {
	Code   int
	Reason string
}

func (e *CloseError) Error() string { return e.Reason }
