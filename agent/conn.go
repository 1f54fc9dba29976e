package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
)

// Transport carries frames to one client. The server implements it over a
// WebSocket; tests may implement it in memory.
type Transport interface {
	// Send queues one text frame without blocking; frames are delivered in
	// the order they were queued. It returns false when the frame could not
	// be queued (the connection is closed or its queue is full, in which case
	// the transport closes the connection so that the client reconnects and
	// resumes).
	Send(frame []byte) bool
	// Close closes the connection with a WebSocket close code and reason.
	Close(code int, reason string)
}

// Conn is one client connection to an agent instance.
type Conn struct {
	id        string
	inst      *instance
	transport Transport
	request   *http.Request

	mu     sync.Mutex
	state  json.RawMessage
	values map[any]any
	closed atomic.Bool
	calls  atomic.Int32 // RPC calls in flight (Options.MaxCallsPerConn)
}

// ID returns the connection id the client chose (the _pk query parameter).
// It is not guaranteed to be unique: compare *Conn values instead.
func (c *Conn) ID() string { return c.id }

// Request returns the HTTP request that opened the connection.
func (c *Conn) Request() *http.Request { return c.request }

// Path returns the path of the instance the connection belongs to.
func (c *Conn) Path() Path { return c.inst.path }

// Send marshals v as JSON and queues it as one frame.
func (c *Conn) Send(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	c.SendRaw(data)
	return nil
}

// SendRaw queues an already encoded frame.
func (c *Conn) SendRaw(frame []byte) {
	if c.closed.Load() {
		return
	}
	c.transport.Send(frame)
}

// Close closes the connection.
func (c *Conn) Close(code int, reason string) { c.transport.Close(code, reason) }

// State returns the per-connection state set with SetState.
func (c *Conn) State() json.RawMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// SetState stores per-connection state. It lives as long as the connection
// and is not sent to the client.
func (c *Conn) SetState(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.state = data
	c.mu.Unlock()
	return nil
}

// Value returns a value a layer attached to the connection with SetValue.
func (c *Conn) Value(key any) any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.values[key]
}

// SetValue attaches a value to the connection under key, in the manner of
// context keys: use an unexported key type.
func (c *Conn) SetValue(key, v any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.values == nil {
		c.values = map[any]any{}
	}
	c.values[key] = v
}

type connKey struct{}

// ConnFromContext returns the connection whose frame is being handled, if
// any (inside RPC methods and frame handlers).
func ConnFromContext(ctx context.Context) *Conn {
	c, _ := ctx.Value(connKey{}).(*Conn)
	return c
}

// WithConn returns a context that carries conn.
func WithConn(ctx context.Context, conn *Conn) context.Context {
	return context.WithValue(ctx, connKey{}, conn)
}
