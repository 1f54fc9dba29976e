package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/wire"
)

// emptyMCP is the MCP frame of an agent with no MCP servers.
var emptyMCP = []byte(`{"type":"` + wire.MCPServers + `","mcp":{"servers":{},"tools":[],"prompts":[],"resources":[]}}`)

// Connect attaches a client connection to the instance at path: it hydrates
// the instance, sends the connect frames (identity, state, MCP servers), lets
// layers add theirs, and runs OnConnect. The instance stays in memory until
// the connection is closed with Disconnect.
func (rt *Runtime) Connect(ctx context.Context, path Path, id string, r *http.Request, t Transport) (*Conn, error) {
	in, err := rt.acquire(ctx, path)
	if err != nil {
		return nil, err
	}
	c := &Conn{id: id, inst: in, transport: t, request: r}
	in.mu.Lock()
	if in.destroyed {
		in.mu.Unlock()
		in.release()
		return nil, ErrDestroyed
	}
	if in.moved {
		// Drained or dropped since it was looked up: its connections
		// were closed, and one attached now would never be.
		in.mu.Unlock()
		in.release()
		return nil, fmt.Errorf("%w: %s is moving to another node", ErrNotOwner, path)
	}
	in.conns[c] = struct{}{}
	// Queue the connect frames before releasing in.mu: a broadcast snapshots
	// in.conns under in.mu, so none can reach this connection ahead of its
	// identity frame, and a state set concurrently is either the one sent
	// here or broadcast after it (never an older state after a newer one).
	// Transport.Send does not block.
	state := in.state
	leaf := path.Leaf()
	c.Send(wire.IdentityFrame{Type: wire.Identity, Name: leaf.Name, Agent: in.class.route, StateFollows: state != nil})
	if state != nil {
		c.Send(wire.StateFrame{Type: wire.State, State: state})
	}
	c.SendRaw(emptyMCP)
	in.mu.Unlock()
	cctx := WithConn(c.withRequestValues(ctx), c)
	for _, l := range in.layers {
		if lc, ok := l.(LayerConnector); ok {
			lc.LayerConnect(cctx, c)
		}
	}
	rt.tel.connections.Add(ctx, 1, metric.WithAttributes(AttrClass.String(in.class.Name)))
	rt.diag.Publish(ctx, diag.ChannelAgent, "connect", in.key, map[string]any{"connection": id})
	if h, ok := in.agent.(Connector); ok {
		err := Enter(cctx, in.agent, func(ctx context.Context) error { return h.OnConnect(ctx, c) })
		if err != nil {
			rt.log.Warn("OnConnect refused a connection", "agent", in.key, "err", err)
			var ce *CloseError
			if errors.As(err, &ce) {
				c.Close(ce.Code, ce.Reason)
			} else {
				c.Close(1011, "connection refused by agent")
			}
		}
	}
	return c, nil
}

// Disconnect detaches a closed connection and runs OnClose. The transport
// calls it exactly once, when the socket is gone.
func (c *Conn) Disconnect(code int, reason string) {
	if c.closed.Swap(true) {
		return
	}
	in := c.inst
	in.mu.Lock()
	delete(in.conns, c)
	in.mu.Unlock()
	cctx := WithConn(c.withRequestValues(in.rt.ctx), c)
	for _, l := range in.layers {
		if lc, ok := l.(LayerCloser); ok {
			lc.LayerClose(cctx, c)
		}
	}
	if h, ok := in.agent.(Closer); ok {
		err := Enter(cctx, in.agent, func(ctx context.Context) error {
			h.OnClose(ctx, c, code, reason)
			return nil
		})
		if err != nil {
			in.rt.log.Warn("OnClose skipped", "agent", in.key, "err", err)
		}
	}
	in.rt.tel.connections.Add(in.rt.ctx, -1, metric.WithAttributes(AttrClass.String(in.class.Name)))
	in.rt.diag.Publish(in.rt.ctx, diag.ChannelAgent, "close", in.key, map[string]any{"connection": c.id, "code": code})
	in.release()
}

// SendError sends an agentry_error frame.
func (c *Conn) SendError(code, msg string) {
	c.Send(wire.ErrorFrame{Type: wire.Error, Code: code, Error: msg})
}

type frameHead struct {
	Type string `json:"type"`
}

// HandleFrame handles one text frame from the client. It never panics on bad
// input: malformed or unknown frames are answered with an agentry_error frame
// (or passed to OnMessage when the agent has one) and the connection goes on.
func (c *Conn) HandleFrame(ctx context.Context, data []byte) {
	in := c.inst
	ctx = WithConn(c.withRequestValues(ctx), c)
	var head frameHead
	if err := json.Unmarshal(data, &head); err != nil || head.Type == "" {
		if h, ok := in.agent.(MessageHandler); ok {
			c.onMessage(ctx, h, data)
			return
		}
		if err != nil {
			c.SendError("bad_json", "frame is not a JSON object: "+err.Error())
		} else {
			c.SendError("bad_frame", "frame has no type")
		}
		return
	}
	switch head.Type {
	case wire.RPC:
		c.handleRPC(ctx, data)
		return
	case wire.State:
		c.handleClientState(ctx, data)
		return
	}
	for _, l := range in.layers {
		if fh, ok := l.(LayerFrameHandler); ok && fh.LayerFrame(ctx, c, head.Type, data) {
			return
		}
	}
	if h, ok := in.agent.(MessageHandler); ok {
		c.onMessage(ctx, h, data)
		return
	}
	c.SendError("unknown_type", fmt.Sprintf("unknown frame type %q", head.Type))
}

func (c *Conn) onMessage(ctx context.Context, h MessageHandler, data []byte) {
	defer func() {
		if p := recover(); p != nil {
			c.inst.rt.log.Error("OnMessage panicked", "agent", c.inst.key, "panic", p)
			c.SendError("internal", "message handler failed")
		}
	}()
	ctx, leave, err := c.inst.enter(ctx)
	if err != nil {
		return
	}
	defer leave()
	if err := h.OnMessage(ctx, c, data); err != nil {
		c.SendError("message_failed", c.inst.rt.ClientMessage(err, "agent", c.inst.key, "in", "OnMessage"))
	}
}

// handleClientState validates, persists and broadcasts state sent by a client.
func (c *Conn) handleClientState(ctx context.Context, data []byte) {
	in := c.inst
	var f struct {
		State json.RawMessage `json:"state"`
	}
	if err := json.Unmarshal(data, &f); err != nil || len(f.State) == 0 {
		c.Send(wire.StateErrorFrame{Type: wire.StateError, Error: "State update rejected"})
		return
	}
	// Client writes are closed by default: only a class with a validator
	// accepts them, and only values that survive a JSON round trip.
	v, ok := in.agent.(StateValidator)
	if !ok {
		in.rt.log.Info("client state refused: the class has no ValidateState", "agent", in.key)
		c.Send(wire.StateErrorFrame{Type: wire.StateError, Error: "State update rejected"})
		return
	}
	if err := checkStateNumbers(f.State); err != nil {
		in.rt.log.Info("client state refused", "agent", in.key, "err", err)
		c.Send(wire.StateErrorFrame{Type: wire.StateError, Error: "State update rejected"})
		return
	}
	ctx, leave, err := in.enter(ctx)
	if err != nil {
		return
	}
	defer leave()
	if err := v.ValidateState(ctx, f.State, c); err != nil {
		in.rt.log.Info("client state rejected", "agent", in.key, "err", err)
		c.Send(wire.StateErrorFrame{Type: wire.StateError, Error: "State update rejected"})
		return
	}
	if err := in.setState(ctx, f.State, c); err != nil {
		in.rt.log.Error("persist client state", "agent", in.key, "err", err)
		c.Send(wire.StateErrorFrame{Type: wire.StateError, Error: "State update failed"})
	}
}

// checkStateNumbers refuses a state with a number that is not a finite
// float64 (1e999999): JavaScript would read it as Infinity and Go cannot
// decode it, so every client would see something else than was stored.
func checkStateNumbers(state json.RawMessage) error {
	dec := json.NewDecoder(bytes.NewReader(state))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("state is not JSON: %w", err)
		}
		if n, ok := tok.(json.Number); ok {
			if _, err := strconv.ParseFloat(string(n), 64); err != nil {
				return fmt.Errorf("state number %.40s is out of range", n)
			}
		}
	}
}

type rpcRequest struct {
	ID     string            `json:"id"`
	Method string            `json:"method"`
	Args   []json.RawMessage `json:"args"`
}

type rpcResponse struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Success bool   `json:"success"`
	Result  any    `json:"result,omitempty"`
	Done    *bool  `json:"done,omitempty"`
	Error   string `json:"error,omitempty"`
}

// done returns the value of an RPC response's done key.
func done(b bool) *bool { return &b }

// handleRPC starts an RPC call. It waits for the instance's input gate
// here, on the connection's reader, so calls start in arrival order; the
// call then runs on its own goroutine holding the gate, so a method that
// awaits (a streaming method, an agent-tool run) lets the connection's
// later frames in at its await points.
//
// At most Options.MaxCallsPerConn calls of one connection are in flight; a
// call beyond them is refused with an error response at once rather than
// waited for, so the reader goes on reading the connection's other frames
// (a chat cancel, a tool result) that the calls in flight may be waiting
// for.
func (c *Conn) handleRPC(ctx context.Context, data []byte) {
	var req rpcRequest
	if err := json.Unmarshal(data, &req); err != nil {
		c.SendError("bad_rpc", "malformed rpc frame: "+err.Error())
		return
	}
	if req.ID == "" {
		c.SendError("bad_rpc", "rpc frame has no id")
		return
	}
	in := c.inst
	m, err := in.lookupCallable(req.Method)
	if err != nil {
		c.Send(rpcResponse{Type: wire.RPC, ID: req.ID, Error: err.Error()})
		return
	}
	rt := in.rt
	if c.calls.Add(1) > int32(rt.maxCalls) {
		c.calls.Add(-1)
		c.Send(rpcResponse{Type: wire.RPC, ID: req.ID, Error: fmt.Sprintf(
			"too many calls in flight on this connection (the limit is %d); wait for a response before sending more", rt.maxCalls)})
		rt.diag.Publish(ctx, diag.ChannelRPC, "refuse", in.key, map[string]any{"method": req.Method, "connection": c.id})
		return
	}
	// The call's context is the runtime's, not the socket's: a call goes
	// on when the client disconnects, as in the reference. It has the
	// values of the request that opened the connection (IdentityFrom).
	callCtx, cancel := context.WithCancel(c.withRequestValues(rt.ctx))
	callCtx, leave, err := in.enterFor(ctx, WithConn(callCtx, c))
	if err != nil {
		cancel()
		c.calls.Add(-1)
		return // the connection is gone
	}
	in.pin()
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		defer in.release()
		defer cancel()
		defer leave()
		c.runRPC(callCtx, m, req)
	}()
}

// runRPC runs one call with ctx, which holds the instance's input gate.
// The call leaves the connection's calls in flight before its final
// response is sent, so a client that waits for a response before sending
// its next call is never refused.
func (c *Conn) runRPC(ctx context.Context, m *method, req rpcRequest) {
	in := c.inst
	rt := in.rt
	start := rt.clock.Now()
	var stream *Stream
	if m.streaming {
		stream = &Stream{conn: c, id: req.ID}
	} else if rt.rpcTTL > 0 {
		var tcancel context.CancelFunc
		ctx, tcancel = context.WithTimeout(ctx, rt.rpcTTL)
		defer tcancel()
	}
	ctx, span := rt.tel.tracer.Start(ctx, "rpc "+req.Method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(AttrAgent.String(in.key), AttrClass.String(in.class.Name), AttrMethod.String(req.Method)))
	result, err := m.invoke(WithAgent(ctx, in.agent), reflectValue(in.agent), stream, req.Args)
	elapsed := rt.clock.Since(start)
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	rt.tel.rpcDuration.Record(ctx, seconds(elapsed), metric.WithAttributes(AttrClass.String(in.class.Name),
		AttrMethod.String(req.Method), AttrResult.String(outcome)))
	defer func() { EndSpan(span, err) }()
	attrs := map[string]any{"method": req.Method, "streaming": m.streaming, "duration": elapsed}
	c.calls.Add(-1)
	if err != nil {
		attrs["error"] = err.Error()
		c.Send(rpcResponse{Type: wire.RPC, ID: req.ID, Error: rt.ClientMessage(err, "agent", in.key, "method", req.Method)})
	} else {
		if stream != nil {
			stream.mu.Lock()
			stream.ended = true
			stream.mu.Unlock()
		}
		c.Send(rpcResponse{Type: wire.RPC, ID: req.ID, Success: true, Result: result, Done: done(true)})
	}
	rt.diag.Publish(ctx, diag.ChannelRPC, "call", in.key, attrs)
}

// lookupCallable finds a callable by wire name, with the reference's error
// strings for methods that do not exist and methods that are not callable.
func (in *instance) lookupCallable(name string) (*method, error) {
	if m, ok := in.class.callables[name]; ok {
		return m, nil
	}
	if name != "" {
		if _, ok := in.class.typ.MethodByName(goMethodName(name)); ok {
			// The npm client shows this exact text.
			return nil, Publicf("Method %s is not callable", name)
		}
	}
	return nil, Publicf("Method %s does not exist", name)
}

// Stream is the first argument (after an optional context) of a streaming
// callable method. Each Send reaches the caller as a done:false chunk; the
// method's return value becomes the final done:true result, and a returned
// error fails the call.
type Stream struct {
	conn  *Conn
	id    string
	mu    sync.Mutex
	ended bool
}

// Send streams one chunk to the caller.
func (s *Stream) Send(v any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return errors.New("agent: stream already ended")
	}
	return s.conn.Send(rpcResponse{Type: wire.RPC, ID: s.id, Success: true, Result: v, Done: done(false)})
}

// Call invokes a callable method of the instance at path in process, with
// the same argument decoding and checks as a client RPC, as one input of
// that instance. Called from agent code, it is an await point of the
// caller (see Await): the caller's gate is released while the call runs, so
// a call cycle between two instances does not deadlock. Streaming methods
// are not supported.
func (rt *Runtime) Call(ctx context.Context, path Path, methodName string, args ...any) (out json.RawMessage, err error) {
	err = Await(ctx, func() error {
		out, err = rt.call(ctx, path, methodName, args)
		return err
	})
	return out, err
}

func (rt *Runtime) call(ctx context.Context, path Path, methodName string, args []any) (json.RawMessage, error) {
	in, err := rt.acquire(ctx, path)
	if err != nil {
		return nil, err
	}
	defer in.release()
	m, err := in.lookupCallable(methodName)
	if err != nil {
		return nil, err
	}
	if m.streaming {
		return nil, fmt.Errorf("agent: %s is a streaming method", methodName)
	}
	raw := make([]json.RawMessage, len(args))
	for i, a := range args {
		if raw[i], err = json.Marshal(a); err != nil {
			return nil, fmt.Errorf("agent: marshal argument %d: %w", i, err)
		}
	}
	if rt.rpcTTL > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rt.rpcTTL)
		defer cancel()
	}
	ctx, leave, err := in.enter(ctx)
	if err != nil {
		return nil, err
	}
	res, err := m.invoke(WithAgent(ctx, in.agent), reflectValue(in.agent), nil, raw)
	leave()
	if err != nil {
		return nil, err
	}
	out, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("agent: marshal result of %s: %w", methodName, err)
	}
	return out, nil
}
