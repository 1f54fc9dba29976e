package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Frame is one frame a WSClient received.
type Frame[F any] struct {
	// MessageType is the WebSocket message type (text or binary).
	MessageType websocket.MessageType
	// Raw is the frame's payload.
	Raw json.RawMessage
	// Value is what json.Unmarshal made of Raw.
	Value F
	// Err is the error of json.Unmarshal, if Raw is not JSON of F's shape.
	Err error
}

// WSClient is a WebSocket test client: a goroutine reads every frame,
// decodes it into F and keeps it, and the test waits for conditions on the
// frames kept so far (Wait) or takes them one by one (Next).
type WSClient[F any] struct {
	t     testing.TB
	conn  *websocket.Conn
	limit time.Duration
	done  chan struct{} // closed when the reader returned

	mu     sync.Mutex
	frames []Frame[F]
	change chan struct{} // closed and replaced on every frame; closed at the end
	closed bool          // the reader returned, with err
	err    error

	next int // the frame Next returns next
}

// DialWS connects to the WebSocket url within limit, which also bounds
// Send, and closes the connection on the test's cleanup. Frames have no
// size limit.
func DialWS[F any](t testing.TB, limit time.Duration, url string) *WSClient[F] {
	t.Helper()
	return DialWSHeader[F](t, limit, url, nil)
}

// DialWSHeader is DialWS with the handshake request's headers h (nil for
// none).
func DialWSHeader[F any](t testing.TB, limit time.Duration, url string, h http.Header) *WSClient[F] {
	t.Helper()
	c, resp, err := TryDialWS[F](t, limit, url, h)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("%v (status %d)", err, status)
	}
	return c
}

// TryDialWS is DialWSHeader for a handshake that may be refused: it
// returns the handshake's HTTP response (its body closed; status and
// headers readable; nil when no response came) and the error instead of
// failing the test. The client is nil when err is not.
func TryDialWS[F any](t testing.TB, limit time.Duration, url string, h http.Header) (*WSClient[F], *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c, resp, err := dialConn(ctx, url, h)
	if err != nil {
		return nil, resp, err
	}
	cl := &WSClient[F]{t: t, conn: c, limit: limit, done: make(chan struct{}), change: make(chan struct{})}
	go cl.read()
	t.Cleanup(cl.Close)
	return cl, resp, nil
}

// dialConn dials url with headers h within ctx, closes the handshake
// response's body and lifts the read limit. It is the test kit's one
// WebSocket dial.
func dialConn(ctx context.Context, url string, h http.Header) (*websocket.Conn, *http.Response, error) {
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return nil, resp, fmt.Errorf("dial %s: %w", url, err)
	}
	c.SetReadLimit(-1)
	return c, resp, nil
}

// UpgradeStatus attempts a WebSocket upgrade of url with headers h (nil
// for none) within limit and returns the HTTP status: 101 when it was
// accepted, in which case the connection is closed normally at once. No
// HTTP response fails the test.
func UpgradeStatus(t testing.TB, limit time.Duration, url string, h http.Header) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c, resp, err := dialConn(ctx, url, h)
	if err == nil {
		c.Close(websocket.StatusNormalClosure, "")
	}
	if resp == nil {
		t.Fatalf("upgrade %s: %v", url, err)
	}
	return resp.StatusCode
}

// DialRaw connects to url within limit and returns the bare connection,
// which nothing reads until the test does and which is closed on the
// test's cleanup; frames have no size limit. It is for the tests whose
// point is the transport itself (a client that never reads, a flood of
// pipelined frames); every other test uses a WSClient.
func DialRaw(t testing.TB, limit time.Duration, url string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c, _, err := dialConn(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// DialRawUntil is DialRaw for code without a testing.TB and for
// benchmarks, which measure their own synchronous reads: it connects to
// url within ctx and reads the connect frames until one of type last
// arrived (wire.MCPServers ends the agent's connect sequence,
// wire.ChatMessages a chat's); with last "" it reads none. Frames have no
// size limit. The caller closes the connection.
func DialRawUntil(ctx context.Context, url, last string) (*websocket.Conn, error) {
	c, _, err := dialConn(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	for last != "" {
		_, data, err := c.Read(ctx)
		if err != nil {
			c.CloseNow()
			return nil, fmt.Errorf("connect frames of %s: %w", url, err)
		}
		if FrameType(data) == last {
			break
		}
	}
	return c, nil
}

// FrameType returns the "type" of a JSON frame, cheaply when it comes
// first (as in every frame the server writes), and "" when it has none.
func FrameType(data []byte) string {
	const key = `{"type":"`
	if !bytes.HasPrefix(data, []byte(key)) {
		var f struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(data, &f)
		return f.Type
	}
	rest := data[len(key):]
	if i := bytes.IndexByte(rest, '"'); i >= 0 {
		return string(rest[:i])
	}
	return ""
}

func (c *WSClient[F]) read() {
	defer close(c.done)
	for {
		typ, data, err := c.conn.Read(context.Background())
		c.mu.Lock()
		if err != nil {
			c.closed, c.err = true, err
			close(c.change)
			c.mu.Unlock()
			return
		}
		f := Frame[F]{MessageType: typ, Raw: data}
		f.Err = json.Unmarshal(data, &f.Value)
		c.frames = append(c.frames, f)
		close(c.change)
		c.change = make(chan struct{})
		c.mu.Unlock()
	}
}

// Close closes the connection without the close handshake and waits for
// the reader to return.
func (c *WSClient[F]) Close() {
	c.conn.CloseNow()
	<-c.done
}

// CloseNormally closes the connection with the close handshake (status
// 1000) and waits for the reader to return.
func (c *WSClient[F]) CloseNormally() {
	c.conn.Close(websocket.StatusNormalClosure, "")
	<-c.done
}

// Conn returns the connection, for what a WSClient does not do (closing
// with a chosen code).
func (c *WSClient[F]) Conn() *websocket.Conn { return c.conn }

// CloseError waits until the connection ended and returns the close frame
// the peer sent (its code and reason). When the connection ended without
// one, or ctx ended first, the code is -1 and the error says why.
func (c *WSClient[F]) CloseError(ctx context.Context) (websocket.CloseError, error) {
	select {
	case <-c.done:
	case <-ctx.Done():
		return websocket.CloseError{Code: -1}, fmt.Errorf("connection still open: %w", ctx.Err())
	}
	var ce websocket.CloseError
	if errors.As(c.err, &ce) { // c.err is set before done is closed
		return ce, nil
	}
	return websocket.CloseError{Code: -1}, fmt.Errorf("connection ended without a close frame: %w", c.err)
}

// SendRaw sends data as one frame of type typ within the limit given to
// DialWS, for frames that are not JSON of a value (malformed, binary);
// an error fails the test.
func (c *WSClient[F]) SendRaw(typ websocket.MessageType, data []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), c.limit)
	defer cancel()
	if err := c.conn.Write(ctx, typ, data); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// SendContext sends v as a JSON text frame.
func (c *WSClient[F]) SendContext(ctx context.Context, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.conn.Write(ctx, websocket.MessageText, data)
}

// Send sends v as a JSON text frame within the limit given to DialWS; an
// error fails the test.
func (c *WSClient[F]) Send(v any) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), c.limit)
	defer cancel()
	if err := c.SendContext(ctx, v); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// Wait calls cond with every frame received so far, now and after each new
// frame, until it returns true, and returns those frames. It returns them
// with an error when ctx ends first, or when the connection ended and cond
// is false of its last frames.
func (c *WSClient[F]) Wait(ctx context.Context, cond func([]Frame[F]) bool) ([]Frame[F], error) {
	for {
		c.mu.Lock()
		fs := c.frames[:len(c.frames):len(c.frames)]
		ch, closed, err := c.change, c.closed, c.err
		c.mu.Unlock()
		if cond(fs) {
			return fs, nil
		}
		if closed {
			return fs, fmt.Errorf("connection closed: %w", err)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fs, ctx.Err()
		}
	}
}

// Next returns the first frame that Next has not returned yet, waiting for
// it until ctx ends or the connection ends.
func (c *WSClient[F]) Next(ctx context.Context) (Frame[F], error) {
	fs, err := c.Wait(ctx, func(fs []Frame[F]) bool { return len(fs) > c.next })
	if err != nil {
		return Frame[F]{}, err
	}
	c.next++
	return fs[c.next-1], nil
}

// GetJSON GETs url, requires status 200 and decodes the JSON body into
// out; anything else fails the test.
func GetJSON(t testing.TB, url string, out any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// Unread returns the frames received so far that Next has not returned.
func (c *WSClient[F]) Unread() []Frame[F] {
	return c.Frames()[c.next:]
}

// Frames returns the frames received so far.
func (c *WSClient[F]) Frames() []Frame[F] {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames[:len(c.frames):len(c.frames)]
}
