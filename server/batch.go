package server

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// maxBatchBytes bounds what a batchConn holds before it writes: a burst
// of frames (a connect replay of 1,000 runs is 28,000 frames) goes out in
// writes of at most this size instead of one system call per frame.
const maxBatchBytes = 64 << 10

// batchConn is the network connection under one WebSocket. While its
// socket's writer has more frames queued (hold … release), the bytes of
// each frame are kept and written together; otherwise every write goes
// straight through. Every write to the network has a deadline of timeout,
// which is how a client that stops reading is detected (the WebSocket
// library's per-frame contexts would cost a timer and a callback a frame).
type batchConn struct {
	net.Conn
	timeout time.Duration
	bufs    *sync.Pool // of *[]byte: a batch's buffer is taken at hold and given back at release

	mu   sync.Mutex // serializes writes to the network and guards the fields below
	held bool
	buf  []byte
	err  error // the first write error; every later write returns it
}

// Write writes p, or keeps it while the connection is held.
func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if b.held {
		if len(b.buf)+len(p) > maxBatchBytes {
			if err := b.flushLocked(); err != nil {
				return 0, err
			}
		}
		if len(p) <= maxBatchBytes {
			if b.buf == nil && b.bufs != nil {
				b.buf = (*b.bufs.Get().(*[]byte))[:0]
			}
			b.buf = append(b.buf, p...)
			return len(p), nil
		}
	}
	if err := b.flushLocked(); err != nil {
		return 0, err
	}
	return b.writeLocked(p)
}

// hold starts keeping writes until release.
func (b *batchConn) hold() {
	b.mu.Lock()
	b.held = true
	b.mu.Unlock()
}

// release writes what was kept since hold, and lets later writes through.
func (b *batchConn) release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held = false
	if b.err != nil {
		return b.err
	}
	err := b.flushLocked()
	// The buffer goes back to the server's pool: an idle connection holds
	// none (a thousand sockets would otherwise keep up to 64 KiB each).
	if b.buf != nil && b.bufs != nil && cap(b.buf) <= 2*maxBatchBytes {
		buf := b.buf[:0]
		b.bufs.Put(&buf)
	}
	b.buf = nil
	return err
}

func (b *batchConn) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.writeLocked(b.buf)
	b.buf = b.buf[:0]
	return err
}

func (b *batchConn) writeLocked(p []byte) (int, error) {
	if err := b.Conn.SetWriteDeadline(time.Now().Add(b.timeout)); err != nil {
		b.err = err
		return 0, err
	}
	n, err := b.Conn.Write(p)
	if err != nil {
		b.err = err
	}
	return n, err
}

// batchWriter is the http.ResponseWriter handed to websocket.Accept: its
// Hijack returns the connection wrapped in a batchConn, with a write
// buffer over it.
type batchWriter struct {
	http.ResponseWriter
	timeout time.Duration
	bufs    *sync.Pool // the batch buffers of the server's connections
	conn    *batchConn // set by Hijack
}

// Hijack implements http.Hijacker.
func (w *batchWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("server: the response writer cannot be hijacked")
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Writer.Flush(); err != nil {
		c.Close()
		return nil, nil, err
	}
	w.conn = &batchConn{Conn: c, timeout: w.timeout, bufs: w.bufs}
	return w.conn, bufio.NewReadWriter(brw.Reader, bufio.NewWriterSize(w.conn, 4096)), nil
}
