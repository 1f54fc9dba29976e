package server_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/server"
)

// A burst of 20,000 small frames (5,000 under -race) (written in batches) reaches a reading
// client complete and in order, while a client that reads nothing of its
// 20 MiB burst is closed once a network write has waited WriteTimeout:
// batching keeps the write deadline.
func TestBatchedWritesDeadline(t *testing.T) {
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{testenv.ReplayerClass(testenv.ReplayOptions{Frames: 320, FrameBytes: 64 << 10})},
		Server:  server.Options{WriteTimeout: 300 * time.Millisecond},
	})
	closes := events(t, env, diag.ChannelServer)
	rawDial(t, env, "/agents/replayer/big?_pk=stalled") // never read
	waitEvent(t, closes, "close")                       // the only socket

	// Under the race detector a frame costs ten times as much: 5,000
	// frames (about 450 KB, seven batches) still cross batch bounds many
	// times, and a loaded machine reads them within the wait limit.
	frames := 20000
	if testenv.Race {
		frames = 5000
	}
	small := testenv.ReplayerClass(testenv.ReplayOptions{Frames: frames, FrameBytes: 60})
	env2 := testenv.Start(t, testenv.Options{Classes: []agent.Class{small}})
	c := rawDial(t, env2, "/agents/replayer/many")
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for range 2 { // identity, MCP servers
		if _, _, err := c.Read(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range frames {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if want := fmt.Appendf(nil, `{"type":"replay","i":%d,"pad":"`, i); !bytes.HasPrefix(data, want) {
			t.Fatalf("frame %d is %.40s", i, data)
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
}
