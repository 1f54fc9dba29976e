// Command replayfloor measures what the npm client alone costs for a
// connect replay, without any server work: it records the frames a running
// server sends to a new WebSocket connection, then serves those exact
// frames to every new connection, framed in advance and written in one
// piece, so that the time from dial to the last frame is the client's own
// (the npm AgentClient and the driver's handler, parsing every frame).
//
//	replayfloor -record ws://127.0.0.1:18811/agents/assistant/p -out frames.ws
//	replayfloor -serve 127.0.0.1:18831 -frames frames.ws
//	replayfloor -measure ws://127.0.0.1:18811/agents/assistant/p -frames frames.ws
//
// With -record it reads text frames until none has arrived for -quiet and
// writes them, already framed as unmasked WebSocket text frames, to -out;
// it prints the frame count and their bytes. With -serve it answers every
// WebSocket upgrade on any path by writing the recorded frames and then
// discarding what the client sends until it closes. With -measure it
// dials -reps times with a Go client, which reads far faster than the
// npm client, and prints the median time from dial to the last of as many
// frames as -frames holds: the pace of the server itself. It is a
// benchmark tool for loopback use, not a server.
package main

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/coder/websocket"
)

func main() {
	record := flag.String("record", "", "WebSocket URL to record a connect replay from")
	out := flag.String("out", "frames.ws", "where -record writes the framed replay")
	quiet := flag.Duration("quiet", time.Second, "with -record: stop after this long without a frame")
	serve := flag.String("serve", "", "loopback address to serve a recorded replay on")
	frames := flag.String("frames", "frames.ws", "with -serve and -measure: the recorded replay")
	measure := flag.String("measure", "", "WebSocket URL to time connect replays from, with a Go client")
	reps := flag.Int("reps", 10, "with -measure: how many replays to time")
	flag.Parse()
	var err error
	switch {
	case *record != "":
		err = recordReplay(context.Background(), *record, *out, *quiet)
	case *serve != "":
		err = serveReplay(*serve, *frames)
	case *measure != "":
		err = measureReplay(context.Background(), *measure, *frames, *reps)
	default:
		err = errors.New("give -record URL, -serve ADDR or -measure URL")
	}
	if err != nil {
		log.Fatalf("replayfloor: %v", err)
	}
}

// recordReplay dials url and writes every text frame it receives, framed
// for sending, to path, until no frame has come for quiet.
func recordReplay(ctx context.Context, url, path string, quiet time.Duration) error {
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return fmt.Errorf("dial %s: %w", url, err)
	}
	defer c.CloseNow()
	c.SetReadLimit(16 << 20)
	var framed []byte
	var n, size int
	for {
		rctx, cancel := context.WithTimeout(ctx, quiet)
		typ, msg, err := c.Read(rctx)
		cancel()
		if err != nil {
			if rctx.Err() != nil {
				break
			}
			return fmt.Errorf("read frame %d: %w", n+1, err)
		}
		if typ != websocket.MessageText {
			continue
		}
		framed = appendTextFrame(framed, msg)
		n++
		size += len(msg)
	}
	if err := os.WriteFile(path, framed, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	fmt.Printf("recorded %d frames, %d bytes of payload, to %s\n", n, size, path)
	return nil
}

// appendTextFrame appends msg as one unmasked, final WebSocket text frame.
func appendTextFrame(b, msg []byte) []byte {
	b = append(b, 0x81)
	switch {
	case len(msg) < 126:
		b = append(b, byte(len(msg)))
	case len(msg) <= 0xffff:
		b = append(b, 126)
		b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	default:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(len(msg)))
	}
	return append(b, msg...)
}

// serveReplay answers every WebSocket upgrade on addr with the framed
// replay recorded in path, written at once.
func serveReplay(addr, path string) error {
	framed, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Sec-WebSocket-Key")
		if key == "" {
			http.Error(w, "a WebSocket upgrade only", http.StatusBadRequest)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			base64.StdEncoding.EncodeToString(sum[:]))
		if err := rw.Flush(); err != nil {
			return
		}
		if _, err := conn.Write(framed); err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, bufio.NewReader(conn))
	})
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	return srv.ListenAndServe()
}

// measureReplay times reps connect replays from url with a Go client:
// from dial to the last of as many text frames as the recording in path
// holds.
func measureReplay(ctx context.Context, url, path string, reps int) error {
	framed, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	want, err := countFrames(framed)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var took []time.Duration
	for range reps {
		t0 := time.Now()
		c, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			return fmt.Errorf("dial %s: %w", url, err)
		}
		c.SetReadLimit(16 << 20)
		// One watchdog for the whole replay rather than a deadline per
		// read, which would cost a timer a frame and slow the client.
		watchdog := time.AfterFunc(30*time.Second, func() { c.CloseNow() })
		for n := 0; n < want; {
			typ, _, err := c.Read(ctx)
			if err != nil {
				watchdog.Stop()
				c.CloseNow()
				return fmt.Errorf("frame %d of %d: %w", n+1, want, err)
			}
			if typ == websocket.MessageText {
				n++
			}
		}
		took = append(took, time.Since(t0))
		watchdog.Stop()
		c.CloseNow()
		time.Sleep(300 * time.Millisecond) // as the npm driver does between replays
	}
	slices.Sort(took)
	fmt.Printf("Go client, %d frames: median %.1f ms (min %.1f, max %.1f) over %d replays\n", want,
		ms(took[(len(took)-1)/2]), ms(took[0]), ms(took[len(took)-1]), len(took))
	return nil
}

// countFrames counts the frames of a recording written by recordReplay.
func countFrames(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		if len(b) < 2 {
			return 0, errors.New("a truncated frame")
		}
		size, head := uint64(b[1]&0x7f), 2
		switch size {
		case 126:
			if len(b) < 4 {
				return 0, errors.New("a truncated frame")
			}
			size, head = uint64(binary.BigEndian.Uint16(b[2:])), 4
		case 127:
			if len(b) < 10 {
				return 0, errors.New("a truncated frame")
			}
			size, head = binary.BigEndian.Uint64(b[2:]), 10
		}
		if uint64(len(b)-head) < size {
			return 0, errors.New("a truncated frame")
		}
		b = b[head+int(size):]
		n++
	}
	return n, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
