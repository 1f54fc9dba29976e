// Package flood checks that a hostile client cannot hurt others: while one
// client floods the server, another client's chat completes intact and in
// order.
package flood

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/examples/echochat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait: a deadline for a broken test, never a way
// to let time pass.
const waitLimit = 30 * time.Second

// dial opens a raw WebSocket for a hostile client (testenv.DialRaw): one
// that floods, or never reads.
func dial(t *testing.T, env *testenv.Env, path string) *websocket.Conn {
	t.Helper()
	return testenv.DialRaw(t, waitLimit, env.URL(path))
}

// flood runs send in a loop until stop is closed, and drains what the
// server answers, signalling started once the first answer that contains
// want arrived.
func flood(t *testing.T, wg *sync.WaitGroup, c *websocket.Conn, stop <-chan struct{}, started chan<- string, name, want string, send func(i int) []byte) {
	ctx, cancel := context.WithCancel(context.Background())
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer cancel()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := c.Write(ctx, websocket.MessageText, send(i)); err != nil {
				select {
				case <-stop:
				default:
					t.Errorf("%s: write %d: %v", name, i, err)
				}
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		signalled := false
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			if !signalled && bytes.Contains(data, []byte(want)) {
				signalled = true
				started <- name
			}
		}
	}()
}

type chunk struct {
	Type  string `json:"type"`
	Delta string `json:"delta"`
}

// chatTurn sends one chat request on c and reads its response frames: they
// must be in order (consecutive seq), and it returns the streamed text.
// The request carries the whole transcript, as the npm clients send it:
// history and the new user message.
func chatTurn(t *testing.T, c *testenv.WSClient[wire.ChatResponseFrame], history []message.Message, id, text string) string {
	t.Helper()
	msgs := append(append([]message.Message(nil), history...), message.Message{
		ID: "u-" + id, Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: text}}})
	body, _ := json.Marshal(map[string]any{"trigger": "submit-message", "messages": msgs})
	c.Send(map[string]any{"type": wire.ChatRequest, "id": id,
		"init": map[string]any{"method": "POST", "body": string(body)}})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var streamed strings.Builder
	next := -1
	for {
		fr, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("bystander connection failed during turn %s: %v", id, err)
		}
		if fr.Err != nil {
			t.Fatalf("bystander frame %s: %v", fr.Raw, fr.Err)
		}
		f := fr.Value
		if f.Type != wire.ChatResponse || f.ID != id {
			continue
		}
		if f.Error {
			t.Fatalf("turn %s failed: %s", id, fr.Raw)
		}
		if f.Done {
			if f.Outcome != "completed" {
				t.Fatalf("turn %s ended with %s", id, fr.Raw)
			}
			return streamed.String()
		}
		if f.Seq == nil {
			t.Fatalf("chunk without seq: %s", fr.Raw)
		}
		if next >= 0 && *f.Seq != next {
			t.Fatalf("turn %s: chunk seq %d after %d (out of order or lost)", id, *f.Seq, next-1)
		}
		next = *f.Seq + 1
		var ch chunk
		if err := json.Unmarshal([]byte(f.Body), &ch); err != nil {
			t.Fatalf("chunk body %q: %v", f.Body, err)
		}
		if ch.Type == "text-delta" {
			streamed.WriteString(ch.Delta)
		}
	}
}

// TestBystanderChatDuringFlood: one client pipelines RPCs without end to a
// method that waits (refused beyond the calls in flight), another sends
// oversized frames without end (each discarded), and five never read their
// 20 MiB connect replay (over the send budget, the largest are closed).
// Meanwhile a bystander's chat turns complete: every chunk, in order, the
// full text, and the transcript over HTTP agrees.
func TestBystanderChatDuringFlood(t *testing.T) {
	release := make(chan struct{})
	replayed := make(chan string, 16)
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{
			echochat.Class(echochat.Options{}),
			testenv.ParkerClass(release, nil),
			testenv.ReplayerClass(testenv.ReplayOptions{Frames: 320, FrameBytes: 64 << 10, Sent: replayed}),
		},
		Setup:  func(rt *agent.Runtime) error { chat.Configure(rt, chat.Config{}); return nil },
		Server: server.Options{SendBudgetBytes: 64 << 20},
	})
	defer close(release)

	stop := make(chan struct{})
	started := make(chan string, 4)
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()

	pipe := dial(t, env, "/agents/parker/flood")
	flood(t, &wg, pipe, stop, started, "pipelined rpc", "too many calls in flight", func(i int) []byte {
		return fmt.Appendf(nil, `{"type":%q,"id":"p%d","method":"park","args":[]}`, wire.RPC, i)
	})
	big := bytes.Repeat([]byte("x"), 2<<20) // twice MaxFrameBytes
	oversized := dial(t, env, "/agents/echo-chat/flood")
	flood(t, &wg, oversized, stop, started, "oversized frames", `"too_large"`, func(int) []byte { return big })
	for i := range 5 {
		dial(t, env, fmt.Sprintf("/agents/replayer/big?_pk=slow%d", i)) // never read
		select {
		case <-replayed:
		case <-time.After(waitLimit):
			t.Fatalf("replay %d was not queued", i)
		}
	}
	for range 2 {
		select {
		case name := <-started:
			t.Logf("flood under way: %s", name)
		case <-time.After(waitLimit):
			t.Fatal("a flood did not start")
		}
	}

	by := testenv.DialWS[wire.ChatResponseFrame](t, waitLimit, env.URL("/agents/echo-chat/bystander"))
	const turns = 3
	var want []string
	var history []message.Message
	for i := range turns {
		text := fmt.Sprintf("turn %d: %s", i, strings.Repeat("the quick brown fox jumps over the lazy dog ", 8))
		got := chatTurn(t, by, history, fmt.Sprintf("req-%d", i), text)
		if w := "You said: " + text; got != w {
			t.Fatalf("turn %d streamed %q, want %q", i, got, w)
		}
		want = append(want, text, "You said: "+text)
		history = transcript(t, env)
		if len(history) != len(want) {
			t.Fatalf("transcript has %d messages after turn %d, want %d", len(history), i, len(want))
		}
		for j, m := range history {
			if got := chat.MessageText(m); got != want[j] {
				t.Fatalf("message %d after turn %d = %q, want %q", j, i, got, want[j])
			}
		}
	}
	if q := env.Server.QueuedBytes(); q > 64<<20 {
		t.Errorf("send queues hold %d bytes, over the budget", q)
	}
}

// transcript reads the bystander's messages over HTTP (get-messages).
func transcript(t *testing.T, env *testenv.Env) []message.Message {
	t.Helper()
	resp, err := http.Get("http://" + env.Host + "/agents/echo-chat/bystander/get-messages")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var msgs []message.Message
	if err := json.Unmarshal(raw, &msgs); err != nil {
		t.Fatalf("get-messages %d %s: %v", resp.StatusCode, raw, err)
	}
	return msgs
}
