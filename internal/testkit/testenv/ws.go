package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Frame is one frame a WSClient received.
type Frame[F any] struct {
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
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, nil)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.SetReadLimit(-1)
	cl := &WSClient[F]{t: t, conn: c, limit: limit, done: make(chan struct{}), change: make(chan struct{})}
	go cl.read()
	t.Cleanup(cl.Close)
	return cl
}

func (c *WSClient[F]) read() {
	defer close(c.done)
	for {
		_, data, err := c.conn.Read(context.Background())
		c.mu.Lock()
		if err != nil {
			c.closed, c.err = true, err
			close(c.change)
			c.mu.Unlock()
			return
		}
		f := Frame[F]{Raw: data}
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

// Frames returns the frames received so far.
func (c *WSClient[F]) Frames() []Frame[F] {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames[:len(c.frames):len(c.frames)]
}
