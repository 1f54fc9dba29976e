package chat_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/internal/testkit/teststore"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

var pg pgtest.Cluster

func TestMain(m *testing.M) { goleak.VerifyTestMain(pg.Wrap(m)) }

// waitLimit bounds every wait: a deadline for a broken test, never a way to
// let time pass.
const waitLimit = 15 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// ---------------------------------------------------------------------------
// Test agents.

// kit configures the test agents of one class.
type kit struct {
	model    model.Model
	tools    []chat.Tool
	maxSteps int
	handle   func(ctx context.Context, t *chat.Turn) error
	policy   chat.Recovery
	// ended receives every turn result (OnTurnEnd); nil means none.
	ended chan chat.TurnResult
}

// hooks are the kit-driven hooks shared by the test agents. (The agents
// embed chat.Base directly: the runtime's layer search does not support a
// chat.Base nested in another embedded struct; see the report.)
type hooks struct{ k *kit }

func (h *hooks) ChatModel() model.Model { return h.k.model }
func (h *hooks) Tools() []chat.Tool     { return h.k.tools }
func (h *hooks) MaxSteps() int          { return h.k.maxSteps }
func (h *hooks) OnTurnEnd(ctx context.Context, r chat.TurnResult) {
	if h.k.ended != nil {
		h.k.ended <- r
	}
}

// chatAgent is a declarative chat agent.
type chatAgent struct {
	chat.Base
	hooks
}

// handlerAgent writes its turns itself (OnChatMessage).
type handlerAgent struct {
	chat.Base
	hooks
}

func (a *handlerAgent) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	return a.k.handle(ctx, t)
}

// policyAgent chooses how its interrupted turns recover.
type policyAgent struct {
	chat.Base
	hooks
}

func (a *policyAgent) RecoverTurn(ctx context.Context, partial message.Message) chat.Recovery {
	return a.k.policy
}

func chatClass(name string, k *kit) agent.Class {
	return agent.Class{Name: name, New: func() agent.Agent { return &chatAgent{hooks: hooks{k}} }, Public: true}
}

func handlerClass(name string, k *kit) agent.Class {
	return agent.Class{Name: name, New: func() agent.Agent { return &handlerAgent{hooks: hooks{k}} }, Public: true}
}

func policyClass(name string, k *kit) agent.Class {
	return agent.Class{Name: name, New: func() agent.Agent { return &policyAgent{hooks: hooks{k}} }, Public: true}
}

// chatter is what the tests use of a chat agent.
type chatter interface {
	agent.Agent
	SaveMessages(ctx context.Context, msgs []message.Message) (chat.TurnResult, error)
	SubmitMessages(ctx context.Context, msgs []message.Message, opts chat.SubmitOptions) (string, error)
	WaitTurn(ctx context.Context, id string) (chat.TurnResult, error)
	CancelTurn(id string) bool
	Messages() []message.Message
	ClearMessages(ctx context.Context) error
	BusyTurn() (string, bool)
	InstanceID() int64
}

func getChat(t *testing.T, rt *agent.Runtime, class, name string) chatter {
	t.Helper()
	a, err := rt.Get(testCtx(t), agent.Root(class, name))
	if err != nil {
		t.Fatal(err)
	}
	c, ok := a.(chatter)
	if !ok {
		t.Fatalf("%T is not a chat agent", a)
	}
	return c
}

func userMsg(text string) message.Message {
	return message.Message{Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: text}}}
}

func assistants(msgs []message.Message) []message.Message {
	var out []message.Message
	for _, m := range msgs {
		if m.Role == message.RoleAssistant {
			out = append(out, m)
		}
	}
	return out
}

func toolParts(m message.Message) []message.Part {
	var out []message.Part
	for _, p := range m.Parts {
		if p.IsTool() {
			out = append(out, p)
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Storage and runtimes built by hand (for the instrumented DB).

// countingDB wraps a store.DB: it counts write transactions and signals
// after each one, so tests can wait for something to be persisted.
type countingDB struct {
	store.DB
	updates atomic.Int64
	urgent  atomic.Int64 // the updates marked store.WithUrgent
	// chatReads counts the statements of read transactions that read a
	// chat table (not the runtime's own reads, as its scheduler's).
	chatReads atomic.Int64
	changed   chan struct{}
}

func (d *countingDB) View(ctx context.Context, fn func(store.Tx) error) error {
	return d.DB.View(ctx, func(tx store.Tx) error { return fn(chatReadTx{tx, &d.chatReads}) })
}

// chatReadTx counts the statements that read a chat table.
type chatReadTx struct {
	store.Tx
	n *atomic.Int64
}

func (t chatReadTx) count(q string) {
	if strings.Contains(q, "FROM chat_") {
		t.n.Add(1)
	}
}

func (t chatReadTx) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	t.count(q)
	return t.Tx.Query(ctx, q, args...)
}

func (t chatReadTx) QueryRow(ctx context.Context, q string, args ...any) *sql.Row {
	t.count(q)
	return t.Tx.QueryRow(ctx, q, args...)
}

func newCountingDB(db store.DB) *countingDB {
	return &countingDB{DB: db, changed: make(chan struct{}, 1)}
}

func (d *countingDB) Update(ctx context.Context, fn func(store.Tx) error) error {
	err := d.DB.Update(ctx, fn)
	d.updates.Add(1)
	if store.IsUrgent(ctx) {
		d.urgent.Add(1)
	}
	select {
	case d.changed <- struct{}{}:
	default:
	}
	return err
}

// waitFor waits until cond holds, re-checking after every write
// transaction.
func (d *countingDB) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(waitLimit)
	for !cond() {
		select {
		case <-d.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// rig is a runtime on a SQLite file, without a server.
type rig struct {
	dir   string
	sq    store.DB
	db    *countingDB
	rt    *agent.Runtime
	hub   *diag.Hub
	turns *eventLog
	once  sync.Once
}

type rigOptions struct {
	dir     string
	classes []agent.Class
	cfg     chat.Config
	clock   clockwork.Clock
	logger  *slog.Logger         // nil means slog.Default()
	meter   metric.MeterProvider // nil means the global one
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	ctx := context.Background()
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	if o.clock == nil {
		o.clock = clockwork.NewFakeClock()
	}
	sq := teststore.Open(t, &pg, o.dir)
	db := newCountingDB(sq)
	hub := diag.New(nil, o.clock.Now)
	r := &rig{dir: o.dir, sq: sq, db: db, hub: hub, turns: watch(hub, diag.ChannelChat)}
	rt, err := agent.New(ctx, agent.Options{DB: db, Clock: o.clock, IdleTimeout: -1, Diag: hub, Logger: o.logger, MeterProvider: o.meter})
	if err != nil {
		sq.Close()
		t.Fatal(err)
	}
	r.rt = rt
	chat.Configure(rt, o.cfg)
	for _, c := range o.classes {
		if err := rt.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(r.close)
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// close stops the runtime (canceling its work, as a crash would stop it)
// and closes the database.
func (r *rig) close() {
	r.once.Do(func() {
		r.rt.Close()
		r.sq.Close()
	})
}

// count runs a COUNT(*) query.
func count(t *testing.T, db store.DB, query string, args ...any) int {
	t.Helper()
	var n int
	err := db.View(context.Background(), func(tx store.Tx) error {
		return tx.QueryRow(context.Background(), query, args...).Scan(&n)
	})
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// ---------------------------------------------------------------------------
// Observability events.

type eventLog struct {
	mu     sync.Mutex
	events []diag.Event
	signal chan struct{}
}

func watch(hub *diag.Hub, channel string) *eventLog {
	l := &eventLog{signal: make(chan struct{}, 1)}
	hub.Subscribe(channel, func(ev diag.Event) {
		l.mu.Lock()
		l.events = append(l.events, ev)
		l.mu.Unlock()
		select {
		case l.signal <- struct{}{}:
		default:
		}
	})
	return l
}

func (l *eventLog) matching(typ string, attr string, val any) []diag.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []diag.Event
	for _, ev := range l.events {
		if ev.Type == typ && (attr == "" || ev.Attrs[attr] == val) {
			out = append(out, ev)
		}
	}
	return out
}

// wait waits for an event of type typ whose attribute attr is val (any
// value when attr is "").
func (l *eventLog) wait(t *testing.T, typ, attr string, val any) diag.Event {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		if evs := l.matching(typ, attr, val); len(evs) > 0 {
			return evs[0]
		}
		select {
		case <-l.signal:
		case <-deadline:
			t.Fatalf("timed out waiting for chat event %s %s=%v", typ, attr, val)
		}
	}
}

// ---------------------------------------------------------------------------
// Fake model clock.

// step lets the scripted model, which waits on clk, emit its next event.
func step(t *testing.T, clk *clockwork.FakeClock, d time.Duration) {
	t.Helper()
	if err := clk.BlockUntilContext(testCtx(t), 1); err != nil {
		t.Fatalf("the model never waited on its clock: %v", err)
	}
	clk.Advance(d)
}

// pump advances clk by d whenever something waits on it, until stop is
// called.
func pump(clk *clockwork.FakeClock, d time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for clk.BlockUntilContext(ctx, 1) == nil {
			clk.Advance(d)
		}
	}()
	return func() { cancel(); <-done }
}

// ---------------------------------------------------------------------------
// Servers and WebSocket clients.

func startEnv(t *testing.T, dir string, rtClock clockwork.Clock, cfg chat.Config, classes ...agent.Class) (*testenv.Env, *eventLog) {
	t.Helper()
	var turns *eventLog
	env := testenv.Start(t, testenv.Options{
		Postgres: &pg,
		Dir:      dir,
		Clock:    rtClock,
		Classes:  classes,
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, cfg)
			turns = watch(rt.Diag(), diag.ChannelChat)
			return nil
		},
	})
	return env, turns
}

// frame is a server frame as the tests read it: testenv.WireFrame, the
// tests' one frame type.
type frame = testenv.WireFrame

// chunkOf decodes the UI message chunk a content frame carries.
func chunkOf(t *testing.T, f frame) message.Chunk {
	t.Helper()
	var c message.Chunk
	if err := json.Unmarshal([]byte(f.Body), &c); err != nil {
		t.Fatalf("frame body %q is not a chunk: %v", f.Body, err)
	}
	return c
}

// messagesOf decodes the transcript a chat messages frame carries.
func messagesOf(t *testing.T, f frame) []message.Message {
	t.Helper()
	var msgs []message.Message
	if len(f.Messages) > 0 {
		if err := json.Unmarshal(f.Messages, &msgs); err != nil {
			t.Fatalf("frame %s: messages: %v", f.Raw, err)
		}
	}
	return msgs
}

// messageOf decodes the message a message-updated frame carries (nil when
// it has none).
func messageOf(t *testing.T, f frame) *message.Message {
	t.Helper()
	if len(f.Message) == 0 || string(f.Message) == "null" {
		return nil
	}
	var m message.Message
	if err := json.Unmarshal(f.Message, &m); err != nil {
		t.Fatalf("frame %s: message: %v", f.Raw, err)
	}
	return &m
}

// isResponse reports whether f is a chat response (a chunk, an error or
// a turn's end).
func isResponse(f frame) bool { return f.Type == wire.ChatResponse }

// wsClient is a chat test's WebSocket connection (testenv.WSClient) that
// takes the frames one by one.
type wsClient struct {
	t  *testing.T
	ws *testenv.WSClient[frame]
	// all is every frame read so far, in order.
	all []frame
}

func dial(t *testing.T, env *testenv.Env, path string) *wsClient {
	t.Helper()
	return dialURL(t, env.URL(path))
}

func dialURL(t *testing.T, url string) *wsClient {
	t.Helper()
	return &wsClient{t: t, ws: testenv.DialWS[frame](t, waitLimit, url)}
}

// next returns the next frame; a connection that ends first, or no frame
// within waitLimit, fails the test.
func (c *wsClient) next() frame {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	fr, err := c.ws.Next(ctx)
	if err != nil {
		c.t.Fatalf("waiting for a frame: %v", err)
	}
	if fr.Err != nil {
		c.t.Fatalf("frame %s: %v", fr.Raw, fr.Err)
	}
	f := fr.Value
	c.all = append(c.all, f)
	return f
}

// until reads frames until pred accepts one, and returns the frames read
// (the accepted one last).
func (c *wsClient) until(pred func(frame) bool) []frame {
	c.t.Helper()
	var got []frame
	for {
		f := c.next()
		got = append(got, f)
		if pred(f) {
			return got
		}
	}
}

func (c *wsClient) expect(typ string) frame {
	c.t.Helper()
	f := c.next()
	if f.Type != typ {
		c.t.Fatalf("got frame %s, want type %s", f.Raw, typ)
	}
	return f
}

// handshake reads the connect frames up to the chat transcript and returns
// the transcript frame.
func (c *wsClient) handshake() frame {
	c.t.Helper()
	fs := c.until(func(f frame) bool { return f.Type == wire.ChatMessages })
	f := fs[len(fs)-1]
	if !f.Connect {
		c.t.Fatalf("first transcript frame %s lacks connect:true", f.Raw)
	}
	return f
}

func (c *wsClient) send(v any) {
	c.t.Helper()
	c.ws.Send(v)
}

// request sends a cf_agent_use_chat_request carrying msgs.
func (c *wsClient) request(id string, msgs ...message.Message) {
	c.t.Helper()
	body, err := json.Marshal(map[string]any{"messages": msgs, "trigger": "submit-message"})
	if err != nil {
		c.t.Fatal(err)
	}
	c.send(map[string]any{"type": wire.ChatRequest, "id": id,
		"init": map[string]any{"method": "POST", "body": string(body)}})
}

func (c *wsClient) probe(probeID string) {
	c.send(map[string]any{"type": wire.StreamResumeRequest, "probeId": probeID})
}

func (c *wsClient) ack(id string) {
	c.send(map[string]any{"type": wire.StreamResumeAck, "id": id})
}

func isDone(id string) func(frame) bool {
	return func(f frame) bool { return isResponse(f) && f.ID == id && f.Ended() }
}

// getMessages fetches the transcript over HTTP.
func getMessages(t *testing.T, base, path string) []message.Message {
	t.Helper()
	resp, err := http.Get(base + path + "/get-messages")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("get-messages: %s", resp.Status)
	}
	var msgs []message.Message
	if err := json.NewDecoder(resp.Body).Decode(&msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// seqs returns the seq of every content frame of stream id.
func seqs(t *testing.T, fs []frame, id string) []int {
	t.Helper()
	var out []int
	for _, f := range fs {
		if f.IsChatChunk() && f.ID == id {
			if f.Seq == nil {
				t.Fatalf("content frame without seq: %s", f.Raw)
			}
			out = append(out, *f.Seq)
		}
	}
	return out
}

// consecutive fails unless s is from, from+1, …
func consecutive(t *testing.T, what string, s []int, from int) {
	t.Helper()
	for i, v := range s {
		if v != from+i {
			t.Fatalf("%s: seqs %v: want consecutive from %d (gap or duplicate at %d)", what, s, from, i)
		}
	}
}
