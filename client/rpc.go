package client

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/agentry/agentry/wire"
	"github.com/google/uuid"
)

// RPCError is a call the agent answered with success:false. Message is the
// server's error text, such as "Method nope does not exist".
type RPCError struct {
	Method  string
	Message string
}

// Error describes the failed call.
func (e *RPCError) Error() string {
	return fmt.Sprintf("client: rpc %s: %s", e.Method, e.Message)
}

// call is an RPC in flight. The reading goroutine queues its streamed
// chunks and its end; the caller's goroutine consumes them, so a slow
// onChunk never holds up the connection.
type call struct {
	method string

	mu     sync.Mutex
	chunks []json.RawMessage
	ended  bool
	result json.RawMessage
	err    error
	signal chan struct{} // capacity 1: something was queued
}

func newCall(method string) *call {
	return &call{method: method, signal: make(chan struct{}, 1)}
}

func (cl *call) notify() {
	select {
	case cl.signal <- struct{}{}:
	default:
	}
}

func (cl *call) chunk(v json.RawMessage) {
	cl.mu.Lock()
	if !cl.ended {
		cl.chunks = append(cl.chunks, v)
	}
	cl.mu.Unlock()
	cl.notify()
}

func (cl *call) finish(result json.RawMessage, err error) {
	cl.mu.Lock()
	if !cl.ended {
		cl.ended, cl.result, cl.err = true, result, err
	}
	cl.mu.Unlock()
	cl.notify()
}

// rpcResponse is an rpc frame from the server.
type rpcResponse struct {
	ID      string          `json:"id"`
	Success bool            `json:"success"`
	Result  json.RawMessage `json:"result"`
	Done    *bool           `json:"done"`
	Error   string          `json:"error"`
}

// handleRPC routes a response to its call with the npm client's rules: a
// failure rejects; done:false is a streamed chunk; done:true, or a
// response without done, resolves. Responses for unknown ids are dropped.
func (c *Conn) handleRPC(data []byte) {
	var r rpcResponse
	if json.Unmarshal(data, &r) != nil || r.ID == "" {
		return
	}
	c.mu.Lock()
	cl := c.calls[r.ID]
	final := !r.Success || r.Done == nil || *r.Done
	if cl != nil && final {
		delete(c.calls, r.ID)
	}
	c.mu.Unlock()
	if cl == nil {
		return
	}
	switch {
	case !r.Success:
		cl.finish(nil, &RPCError{Method: cl.method, Message: r.Error})
	case !final:
		cl.chunk(r.Result)
	default:
		cl.finish(r.Result, nil)
	}
}

// Call calls a callable method of the agent with args (each encoded as
// JSON) and returns its result; the result is nil when the method returned
// nothing. A method the agent refuses or that fails gives an *RPCError. The
// call is not bounded by a default timeout (the npm client's is 30 s): use
// ctx. Canceling ctx abandons the call; the server still runs it.
//
// Streamed chunks of a streaming method are ignored; use CallStream.
func (c *Conn) Call(ctx context.Context, method string, args ...any) (json.RawMessage, error) {
	return c.CallStream(ctx, method, nil, args...)
}

// CallStream calls a streaming method: onChunk, if not nil, receives each
// streamed chunk (done:false) in order, on the calling goroutine, and the
// final result (done:true) is returned.
func (c *Conn) CallStream(ctx context.Context, method string, onChunk func(json.RawMessage), args ...any) (json.RawMessage, error) {
	raw := make([]json.RawMessage, len(args))
	for i, a := range args {
		b, err := json.Marshal(a)
		if err != nil {
			return nil, fmt.Errorf("client: rpc %s: encode argument %d: %w", method, i, err)
		}
		raw[i] = b
	}
	id := uuid.NewString()
	cl := newCall(method)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, fmt.Errorf("client: rpc %s: %w", method, err)
	}
	c.calls[id] = cl
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
	}
	req := struct {
		Args   []json.RawMessage `json:"args"`
		ID     string            `json:"id"`
		Method string            `json:"method"`
		Type   string            `json:"type"`
	}{raw, id, method, wire.RPC}
	if err := c.Send(ctx, req); err != nil {
		forget()
		return nil, fmt.Errorf("client: rpc %s: %w", method, err)
	}
	for {
		cl.mu.Lock()
		chunks := cl.chunks
		cl.chunks = nil
		ended, result, err := cl.ended, cl.result, cl.err
		cl.mu.Unlock()
		if onChunk != nil {
			for _, ch := range chunks {
				onChunk(ch)
			}
		}
		if ended {
			if err != nil {
				if _, ok := err.(*RPCError); ok {
					return nil, err
				}
				return nil, fmt.Errorf("client: rpc %s: %w", method, err)
			}
			return result, nil
		}
		select {
		case <-cl.signal:
		case <-ctx.Done():
			forget()
			return nil, fmt.Errorf("client: rpc %s: %w", method, ctx.Err())
		}
	}
}
