package server

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// A socket holds a batch buffer only while it writes a burst: after
// release its buffer is back in the server's pool, and the next burst (of
// any socket) takes one from there.
func TestBatchBufferGoesBackToThePool(t *testing.T) {
	srv, cli := net.Pipe()
	defer srv.Close()
	defer cli.Close()
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(cli)
		got <- b
	}()
	taken := 0
	pool := &sync.Pool{New: func() any { taken++; b := make([]byte, 0, maxBatchBytes); return &b }}
	c := &batchConn{Conn: srv, timeout: time.Minute, bufs: pool}
	for burst := range 3 {
		c.hold()
		for _, s := range []string{"a", "bc", "def"} {
			if _, err := c.Write([]byte(s)); err != nil {
				t.Fatal(err)
			}
		}
		if c.buf == nil {
			t.Fatalf("burst %d: the held writes are not in a buffer", burst)
		}
		if err := c.release(); err != nil {
			t.Fatal(err)
		}
		if c.buf != nil {
			t.Fatalf("burst %d: the socket keeps its buffer after release", burst)
		}
	}
	if _, err := c.Write([]byte("!")); err != nil { // not held: straight through
		t.Fatal(err)
	}
	srv.Close()
	if b := <-got; string(b) != "abcdefabcdefabcdef!" {
		t.Errorf("written %q", b)
	}
	// sync.Pool may drop what it holds at a GC, so only an upper bound.
	if taken > 3 {
		t.Errorf("%d buffers made for 3 bursts", taken)
	}
	if taken == 0 {
		t.Error("no buffer taken from the pool")
	}
}
