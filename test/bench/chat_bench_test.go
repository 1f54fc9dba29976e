package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/mcpserver"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/postgres"
	"github.com/agentry/agentry/store/sqlite"
	"github.com/agentry/agentry/wire"
)

// ---------------------------------------------------------------------------
// Shared by the chat and agent-tool benchmarks: a server whose store.DB
// counts write transactions.

// txCountDB wraps the SQLite store and counts write transactions (Update
// calls), as the chat tests' countingDB does, and read transactions (View
// calls).
type txCountDB struct {
	store.DB
	updates atomic.Int64
	views   atomic.Int64
	// trace, when set, is told of every transaction (write or read) with
	// its caller's stack; the transaction census uses it.
	trace atomic.Pointer[func(write bool)]
}

func (d *txCountDB) Update(ctx context.Context, fn func(store.Tx) error) error {
	d.updates.Add(1)
	if t := d.trace.Load(); t != nil {
		(*t)(true)
	}
	return d.DB.Update(ctx, fn)
}

func (d *txCountDB) View(ctx context.Context, fn func(store.Tx) error) error {
	d.views.Add(1)
	if t := d.trace.Load(); t != nil {
		(*t)(false)
	}
	return d.DB.View(ctx, fn)
}

// benchEnv is a real server: SQLite file, runtime (agent.New with the
// counting wrapper), chat configured, optionally agent tools installed, and
// the HTTP/WebSocket server on 127.0.0.1.
type benchEnv struct {
	db   *txCountDB
	sq   *sqlite.DB   // nil on PostgreSQL
	path string       // the SQLite file; "" on PostgreSQL
	pq   *postgres.DB // with BENCH_STORE=postgres
	rt   *agent.Runtime
	srv  *server.Server
	hs   *httptest.Server
	host string
}

// sendQueue, when given, is the server's SendQueue (frames queued per
// client); the default is the server's (4096).
func startBenchEnv(b *testing.B, classes []agent.Class, agentTools bool, sendQueue ...int) *benchEnv {
	b.Helper()
	ctx := context.Background()
	var base store.DB
	var sq *sqlite.DB
	var pq *postgres.DB
	var err error
	var path string
	if os.Getenv("BENCH_STORE") == "postgres" {
		pq, err = postgres.Open(ctx, pg.URL(b))
		base = pq
	} else {
		path = filepath.Join(b.TempDir(), "agentry.db")
		sq, err = sqlite.OpenOptions(ctx, path, benchStoreOptions(b))
		base = sq
	}
	if err != nil {
		b.Fatal(err)
	}
	db := &txCountDB{DB: base}
	rt, err := agent.New(ctx, agent.Options{DB: db, IdleTimeout: -1})
	if err != nil {
		base.Close()
		b.Fatal(err)
	}
	chat.Configure(rt, chat.Config{})
	if agentTools {
		agenttool.Install(rt, agenttool.Options{})
	}
	for _, c := range classes {
		if err := rt.Register(c); err != nil {
			b.Fatal(err)
		}
	}
	if err := rt.Start(ctx); err != nil {
		b.Fatal(err)
	}
	so := server.Options{Runtime: rt}
	if len(sendQueue) > 0 {
		so.SendQueue = sendQueue[0]
	}
	srv := server.New(so)
	mcpH := mcpserver.New(mcpserver.Options{Runtime: rt, Front: srv})
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpH)
	mux.Handle("/mcp/", mcpH)
	mux.Handle("/", srv)
	hs := httptest.NewServer(mux)
	e := &benchEnv{db: db, sq: sq, path: path, pq: pq, rt: rt, srv: srv, hs: hs, host: strings.TrimPrefix(hs.URL, "http://")}
	b.Cleanup(func() {
		e.srv.Close()
		mcpH.Close()
		e.hs.Close()
		e.rt.Close()
		base.Close()
	})
	return e
}

// benchStoreOptions reads the SQLite options of a benchmark server from the
// environment, to measure one store lever at a time: BENCH_SQLITE_MAXBATCH=1
// turns group commit off, BENCH_SQLITE_STMTCACHE=-1 the statement cache.
func benchStoreOptions(b *testing.B) sqlite.Options {
	var o sqlite.Options
	for name, dst := range map[string]*int{"BENCH_SQLITE_MAXBATCH": &o.MaxBatch, "BENCH_SQLITE_STMTCACHE": &o.StatementCache} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				b.Fatalf("%s=%q: %v", name, v, err)
			}
			*dst = n
		}
	}
	return o
}

func (e *benchEnv) url(path string) string { return "ws://" + e.host + path }

func durMetric(d time.Duration, unit string) float64 {
	switch unit {
	case "µs":
		return float64(d.Nanoseconds()) / 1e3
	default:
		return float64(d.Nanoseconds()) / 1e6
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration, name, unit string, ps ...int) {
	slices.Sort(lat)
	for _, p := range ps {
		b.ReportMetric(durMetric(percentile(lat, p), unit), fmt.Sprintf("%s-p%d-%s", name, p, unit))
	}
}

// ---------------------------------------------------------------------------
// Chat agents of the benchmarks.

// benchChat is a declarative chat agent on a scripted model.
type benchChat struct {
	chat.Base
	m model.Model
}

func (c *benchChat) ChatModel() model.Model { return c.m }

func chatClassOf(name string, m model.Model) agent.Class {
	return agent.Class{Name: name, Public: true, New: func() agent.Agent { return &benchChat{m: m} }}
}

// echoModel answers "You said: <text>" in chunks of 8 characters, with no
// delay: the framework's overhead is all that is measured.
func echoModel() model.Model {
	return scripted.New(scripted.WithChunkSize(8), scripted.WithDelay(0))
}

// longModel answers one text of deltas chunks of 8 characters each.
func longModel(deltas int, delay time.Duration) model.Model {
	text := strings.Repeat("abcdefgh", deltas)
	return scripted.New(scripted.WithChunkSize(8), scripted.WithDelay(delay),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text(text)})))
}

func userText(text string) message.Message {
	return message.Message{Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: text}}}
}

func getChatAgent(b *testing.B, e *benchEnv, class, name string) *benchChat {
	b.Helper()
	a, err := e.rt.Get(context.Background(), agent.Root(class, name))
	if err != nil {
		b.Fatal(err)
	}
	return a.(*benchChat)
}

// chatRequestFrame is the cf_agent_use_chat_request of the npm clients.
func chatRequestFrame(id string, msgs ...message.Message) []byte {
	body, _ := json.Marshal(map[string]any{"messages": msgs, "trigger": "submit-message"})
	f, _ := json.Marshal(map[string]any{"type": wire.ChatRequest, "id": id,
		"init": map[string]any{"method": "POST", "body": string(body)}})
	return f
}

// ---------------------------------------------------------------------------
// 1a. Overhead to the first chunk.

// BenchmarkChatFirstChunk measures the framework's overhead from a new turn
// to its first streamed chunk, with a scripted model that has no delay
// ("You said: hi", 2 text deltas).
//
//   - ws: a WebSocket client sends cf_agent_use_chat_request (its whole
//     transcript: one new user message) and times the first
//     cf_agent_use_chat_response chunk frame (the "start" chunk) and the first
//     text-delta frame; it then reads to the done frame before the next op.
//   - headless/history=N: SubmitMessages (what SaveMessages does) on an
//     agent whose transcript holds N messages, then FollowStream; the time to
//     the first chunk the follower receives. The transcript is cleared
//     before each op when N is 0, and grows by two messages per op
//     otherwise.
func BenchmarkChatFirstChunk(b *testing.B) {
	b.Run("ws", benchFirstChunkWS)
	for _, h := range []int{0, 1000} {
		b.Run(fmt.Sprintf("headless/history=%d", h), func(b *testing.B) { benchFirstChunkHeadless(b, h) })
	}
}

func benchFirstChunkWS(b *testing.B) {
	e := startBenchEnv(b, []agent.Class{chatClassOf("EchoChat", echoModel())}, false)
	ctx := context.Background()
	c, err := testenv.DialRawUntil(ctx, e.url("/agents/echo-chat/first"), wire.ChatMessages)
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseNow()
	first := make([]time.Duration, 0, b.N)
	delta := make([]time.Duration, 0, b.N)
	total := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprintf("req-%d", i)
		req := chatRequestFrame(id, message.Message{ID: fmt.Sprintf("u-%d", i), Role: message.RoleUser,
			Parts: []message.Part{{Type: message.PartText, Text: "hi"}}})
		idKey := []byte(`"id":"` + id + `"`)
		t0 := time.Now()
		if err := c.Write(ctx, websocket.MessageText, req); err != nil {
			b.Fatal(err)
		}
		gotFirst, gotDelta := false, false
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if testenv.FrameType(data) != wire.ChatResponse || !bytes.Contains(data, idKey) {
				continue
			}
			now := time.Since(t0)
			if bytes.Contains(data, []byte(`"done":true`)) {
				if bytes.Contains(data, []byte(`"error":true`)) || !bytes.Contains(data, []byte(`"outcome":"completed"`)) {
					b.Fatalf("turn %s did not complete: %s", id, data)
				}
				total = append(total, now)
				break
			}
			if !gotFirst {
				gotFirst = true
				first = append(first, now)
			}
			if !gotDelta && bytes.Contains(data, []byte(`text-delta`)) {
				gotDelta = true
				delta = append(delta, now)
			}
		}
		if !gotFirst || !gotDelta {
			b.Fatalf("turn %s: no chunk frames", id)
		}
	}
	b.StopTimer()
	reportPercentiles(b, first, "first-chunk", "µs", 50, 99)
	reportPercentiles(b, delta, "first-delta", "µs", 50, 99)
	reportPercentiles(b, total, "turn", "µs", 50)
}

func benchFirstChunkHeadless(b *testing.B, history int) {
	e := startBenchEnv(b, []agent.Class{chatClassOf("EchoChat", echoModel())}, false)
	ctx := context.Background()
	a := getChatAgent(b, e, "EchoChat", "headless")
	if history > 0 {
		msgs := make([]message.Message, history)
		for i := range msgs {
			role := message.RoleUser
			if i%2 == 1 {
				role = message.RoleAssistant
			}
			msgs[i] = message.Message{Role: role, Parts: []message.Part{{Type: message.PartText, Text: fmt.Sprintf("message %d of the history", i)}}}
		}
		if _, err := a.AppendMessages(ctx, msgs); err != nil {
			b.Fatal(err)
		}
	}
	first := make([]time.Duration, 0, b.N)
	total := make([]time.Duration, 0, b.N)
	updates := int64(0)
	b.ResetTimer()
	for range b.N {
		if history == 0 {
			b.StopTimer()
			if err := a.ClearMessages(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		got := make(chan time.Duration, 1)
		u0 := e.db.updates.Load()
		t0 := time.Now()
		id, err := a.SubmitMessages(ctx, []message.Message{userText("hi")}, chat.SubmitOptions{})
		if err != nil {
			b.Fatal(err)
		}
		stop, err := a.FollowStream(ctx, id, -1, func(seq int, body string) {
			select {
			case got <- time.Since(t0):
			default:
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		first = append(first, <-got)
		res, err := a.WaitTurn(ctx, id)
		total = append(total, time.Since(t0))
		stop()
		if err != nil || res.Outcome != chat.OutcomeCompleted || res.Text() != "You said: hi" {
			b.Fatalf("turn: %+v %v", res, err)
		}
		updates += e.db.updates.Load() - u0
	}
	b.StopTimer()
	reportPercentiles(b, first, "first-chunk", "µs", 50, 99)
	reportPercentiles(b, total, "turn", "µs", 50)
	b.ReportMetric(float64(updates)/float64(b.N), "tx/turn")
}

// ---------------------------------------------------------------------------
// 1b. Chunks per second to N clients.

// BenchmarkChatStream measures one long turn (5,000 text deltas of 8
// characters, no model delay: 5,006 chunks with start, start-step,
// text-start, text-end, finish-step and finish) streamed to N WebSocket
// clients connected to the agent. The turn is started headless
// (SubmitMessages), so every client is a plain watcher. One op is one turn,
// from the submission until every client has received the turn's done
// frame; every client must receive every chunk. chunks/s is the turn's
// chunks over that time; frames/s counts the chunk frames received by all
// clients together. The transcript is cleared between ops (not timed).
func BenchmarkChatStream(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { benchChatStream(b, n) })
	}
}

const streamDeltas = 5000

// streamWatcher is a client that counts the chunk frames of the turn in
// progress (one turn at a time: every cf_agent_use_chat_response frame
// until a done frame).
type streamWatcher struct {
	c      *websocket.Conn
	mu     sync.Mutex
	armed  bool
	chunks int
	done   chan struct{}
	err    error
	closed chan struct{}
}

func (w *streamWatcher) arm() {
	w.mu.Lock()
	w.armed = true
	w.chunks = 0
	w.done = make(chan struct{})
	w.mu.Unlock()
}

func (w *streamWatcher) read() {
	defer close(w.closed)
	for {
		_, data, err := w.c.Read(context.Background())
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		if testenv.FrameType(data) != wire.ChatResponse {
			continue
		}
		w.mu.Lock()
		if w.armed {
			if bytes.Contains(data, []byte(`"done":true`)) {
				w.armed = false
				close(w.done)
			} else {
				w.chunks++
			}
		}
		w.mu.Unlock()
	}
}

func benchChatStream(b *testing.B, clients int) {
	e := startBenchEnv(b, []agent.Class{chatClassOf("Streamer", longModel(streamDeltas, 0))}, false)
	ctx := context.Background()
	a := getChatAgent(b, e, "Streamer", "s1")
	ws := make([]*streamWatcher, clients)
	for i := range ws {
		c, err := testenv.DialRawUntil(ctx, e.url("/agents/streamer/s1"), wire.ChatMessages)
		if err != nil {
			b.Fatal(err)
		}
		w := &streamWatcher{c: c, closed: make(chan struct{})}
		go w.read()
		ws[i] = w
	}
	defer func() {
		for _, w := range ws {
			w.c.Close(websocket.StatusNormalClosure, "")
			<-w.closed
		}
	}()
	want := streamDeltas + 6
	var elapsed time.Duration
	var chunks, frames int64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if err := a.ClearMessages(ctx); err != nil {
			b.Fatal(err)
		}
		for _, w := range ws {
			w.arm()
		}
		b.StartTimer()
		t0 := time.Now()
		if _, err := a.SubmitMessages(ctx, []message.Message{userText("go")}, chat.SubmitOptions{}); err != nil {
			b.Fatal(err)
		}
		for i, w := range ws {
			select {
			case <-w.done:
			case <-w.closed:
				b.Fatalf("client %d was closed during the turn: %v", i, w.err)
			case <-time.After(2 * time.Minute):
				b.Fatalf("client %d: timed out", i)
			}
		}
		d := time.Since(t0)
		b.StopTimer()
		elapsed += d
		for i, w := range ws {
			w.mu.Lock()
			n := w.chunks
			w.mu.Unlock()
			if n != want {
				b.Fatalf("client %d received %d chunk frames, want %d", i, n, want)
			}
			frames += int64(n)
		}
		chunks += int64(want)
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(chunks)/elapsed.Seconds(), "chunks/s")
	b.ReportMetric(float64(frames)/elapsed.Seconds(), "frames/s")
	b.ReportMetric(float64(elapsed.Microseconds())/1e3/float64(b.N), "turn-ms")
}

// ---------------------------------------------------------------------------
// 1c. Storage transactions per 1,000 text deltas.

// BenchmarkChatStorage counts the write transactions (store.DB Update
// calls) of a headless turn of N text deltas with the default batching
// (FlushInterval 100 ms, FlushChunks 64): accept, start, the chunk flushes,
// the turn's end and the wake-flag clear. delay is the model's pause between
// deltas.
func BenchmarkChatStorage(b *testing.B) {
	for _, c := range []struct {
		deltas int
		delay  time.Duration
	}{{5000, 0}, {500, 2 * time.Millisecond}, {100, 20 * time.Millisecond}} {
		b.Run(fmt.Sprintf("deltas=%d/delay=%s", c.deltas, c.delay), func(b *testing.B) { benchChatStorage(b, c.deltas, c.delay) })
	}
}

func benchChatStorage(b *testing.B, deltas int, delay time.Duration) {
	e := startBenchEnv(b, []agent.Class{chatClassOf("Streamer", longModel(deltas, delay))}, false)
	ctx := context.Background()
	a := getChatAgent(b, e, "Streamer", "store")
	var tx, commits, trips int64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if err := a.ClearMessages(ctx); err != nil {
			b.Fatal(err)
		}
		u0, s0 := e.db.updates.Load(), e.storeStats()
		b.StartTimer()
		res, err := a.SaveMessages(ctx, []message.Message{userText("go")})
		if err != nil || res.Outcome != chat.OutcomeCompleted {
			b.Fatalf("turn: %+v %v", res, err)
		}
		b.StopTimer()
		// The worker clears the wake flag after the turn's waiters are
		// told: wait for that last transaction.
		waitStable(&e.db.updates)
		tx += e.db.updates.Load() - u0
		if e.pq != nil {
			s := e.storeStats()
			commits += s.pq.Committed - s0.pq.Committed
			trips += s.pq.RoundTrips - s0.pq.RoundTrips
		}
		b.StartTimer()
	}
	b.StopTimer()
	if e.pq != nil {
		b.ReportMetric(float64(commits)/float64(b.N), "commits/turn")
		b.ReportMetric(float64(trips)/float64(b.N), "roundtrips/turn")
	}
	b.ReportMetric(float64(tx)/float64(b.N), "tx/turn")
	b.ReportMetric(float64(tx)/float64(b.N)/float64(deltas)*1000, "tx/1000-deltas")
}

// waitStable returns once n has not changed for 20 ms.
func waitStable(n *atomic.Int64) {
	last := n.Load()
	for {
		time.Sleep(20 * time.Millisecond)
		if v := n.Load(); v == last {
			return
		} else {
			last = v
		}
	}
}
