package agent

import "context"

type identityKey struct{}

// WithIdentity returns a copy of ctx that carries id, the authenticated
// caller of a request (a user, an API key, a session: any value the
// application chooses, typically a pointer to its own type). An HTTP
// middleware sets it on the request context before the server sees the
// request:
//
//	next.ServeHTTP(w, r.WithContext(agent.WithIdentity(r.Context(), user)))
//
// and server.Options.Authenticate sets what it returns. IdentityFrom reads
// it back in every method the request or its connection runs.
func WithIdentity(ctx context.Context, id any) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// IdentityFrom returns the identity of the caller whose input ctx serves,
// set with WithIdentity (by the application's middleware or by
// server.Options.Authenticate), and whether there is one. It is there in:
//
//   - every hook a connection runs: OnConnect, OnMessage, OnClose, state
//     validation and the callable (RPC) methods it calls, including a call
//     that goes on after the client has gone;
//   - OnRequest and the layers' HTTP routes (get-messages), whose context is
//     the request's;
//   - a chat turn (its handler, OnChatMessage, and its tools) started by a
//     connection's chat request or by a method that has an identity, and
//     the agent-tool child runs those tools start.
//
// It is not persisted: a turn resumed after a restart, a schedule callback
// and OnStart run without one.
func IdentityFrom(ctx context.Context) (any, bool) {
	id := ctx.Value(identityKey{})
	return id, id != nil
}

// withValues is a context with the cancellation, deadline and values of
// Context, and then the values of vals, a context.WithoutCancel context.
// A connection's hooks get the values its request's context had (the
// application's middleware puts identity and the like there), but not its
// cancellation: they run on the runtime's, or the socket's, lifetime.
type withValues struct {
	context.Context
	vals context.Context
}

func (c withValues) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.vals.Value(key)
}

// withRequestValues returns ctx with the connection's request context's
// values beneath its own.
func (c *Conn) withRequestValues(ctx context.Context) context.Context {
	if c.request == nil {
		return ctx
	}
	return withValues{Context: ctx, vals: context.WithoutCancel(c.request.Context())}
}
