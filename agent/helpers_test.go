package agent_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/internal/testkit/teststore"
	"github.com/agentry/agentry/store"
)

var pg pgtest.Cluster

func TestMain(m *testing.M) { goleak.VerifyTestMain(pg.Wrap(m)) }

// waitLimit bounds every wait on a channel; it is a deadline for a broken
// test, never a way to let time pass.
const waitLimit = 10 * time.Second

// epoch is the fake clock's start: a whole second, so that schedule due
// times stored in milliseconds are exact.
var epoch = time.Date(2025, 1, 1, 0, 0, 30, 0, time.UTC)

// notifyDB wraps a store.DB and signals after every write transaction, so
// tests can wait for a database condition without sleeping.
type notifyDB struct {
	store.DB
	changed chan struct{}
}

func (d *notifyDB) Update(ctx context.Context, fn func(store.Tx) error) error {
	err := d.DB.Update(ctx, fn)
	select {
	case d.changed <- struct{}{}:
	default:
	}
	return err
}

// rtEnv is a runtime on a real SQLite file with a fake clock.
type rtEnv struct {
	t      testing.TB
	dir    string
	clock  *clockwork.FakeClock
	sqlite store.DB // the database under db (SQLite or, with AGENTRY_TEST_STORE=postgres, PostgreSQL)
	db     *notifyDB
	rt     *agent.Runtime

	closeOnce sync.Once
}

type rtOptions struct {
	dir     string
	clock   *clockwork.FakeClock
	idle    time.Duration // 0 means eviction disabled
	classes []agent.Class
	// maxCalls and maxInstances are the runtime's limits; 0 means the
	// defaults.
	maxCalls, maxInstances int
	place                  agent.Placement // nil: a single node
	log                    *slog.Logger    // nil: slog.Default()
}

// newRuntime opens the DB and creates the runtime without starting it, so a
// test can subscribe to diag channels before Start.
func newRuntime(t testing.TB, o rtOptions) *rtEnv {
	t.Helper()
	ctx := context.Background()
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	if o.clock == nil {
		o.clock = clockwork.NewFakeClockAt(epoch)
	}
	if o.idle == 0 {
		o.idle = -1
	}
	sdb := teststore.Open(t, &pg, o.dir)
	db := &notifyDB{DB: sdb, changed: make(chan struct{}, 1)}
	rt, err := agent.New(ctx, agent.Options{DB: db, Clock: o.clock, IdleTimeout: o.idle,
		MaxCallsPerConn: o.maxCalls, MaxInstances: o.maxInstances, Placement: o.place, Logger: o.log})
	if err != nil {
		sdb.Close()
		t.Fatal(err)
	}
	for _, c := range o.classes {
		if err := rt.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	e := &rtEnv{t: t, dir: o.dir, clock: o.clock, sqlite: sdb, db: db, rt: rt}
	t.Cleanup(e.close)
	return e
}

func startRuntime(t testing.TB, o rtOptions) *rtEnv {
	t.Helper()
	e := newRuntime(t, o)
	e.start()
	return e
}

func (e *rtEnv) start() {
	e.t.Helper()
	if err := e.rt.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

func (e *rtEnv) close() {
	e.closeOnce.Do(func() {
		e.rt.Close()
		e.sqlite.Close()
	})
}

// waitDB waits until cond holds, re-checking after every write transaction.
func (e *rtEnv) waitDB(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-e.db.changed:
		case <-deadline.C:
			e.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// blockUntil waits until the fake clock has n waiters (timers, tickers).
func (e *rtEnv) blockUntil(n int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := e.clock.BlockUntilContext(ctx, n); err != nil {
		e.t.Fatalf("fake clock never got %d waiters: %v", n, err)
	}
}

// queryInt runs a one-value query directly on the database.
func (e *rtEnv) queryInt(q string, args ...any) int {
	e.t.Helper()
	var n int
	err := e.sqlite.View(context.Background(), func(tx store.Tx) error {
		return tx.QueryRow(context.Background(), q, args...).Scan(&n)
	})
	if err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// userTables lists the instances' own tables as u<id>_<name>: on SQLite
// the physical tables of that name in sqlite_master, on PostgreSQL the
// (instance, name) pairs that have rows in the shared tables.
func (e *rtEnv) userTables() map[string]bool {
	e.t.Helper()
	out := map[string]bool{}
	ctx := context.Background()
	scan := func(rows *sql.Rows, name func(string) string) error {
		defer rows.Close()
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				return err
			}
			out[name(n)] = true
		}
		return rows.Err()
	}
	err := e.sqlite.View(ctx, func(tx store.Tx) error {
		if e.sqlite.Dialect() != "postgres" {
			rows, err := tx.Query(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB 'u[0-9]*_*'`)
			if err != nil {
				return err
			}
			return scan(rows, func(n string) string { return n })
		}
		rows, err := tx.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'ut\_%'`)
		if err != nil {
			return err
		}
		var shared []string
		if err := scan(rows, func(n string) string { shared = append(shared, n); return "" }); err != nil {
			return err
		}
		delete(out, "")
		for _, table := range shared {
			name := table[len("ut_"):strings.LastIndexByte(table, '_')]
			rows, err := tx.Query(ctx, `SELECT DISTINCT CAST(agentry_instance AS TEXT) FROM `+table)
			if err != nil {
				return err
			}
			if err := scan(rows, func(id string) string { return "u" + id + "_" + name }); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// recorder collects diag events of one channel.
type recorder struct {
	ch    chan diag.Event
	unsub func()
}

func record(t *testing.T, hub *diag.Hub, channel string) *recorder {
	t.Helper()
	r := &recorder{ch: make(chan diag.Event, 4096)}
	r.unsub = hub.Subscribe(channel, func(ev diag.Event) {
		select {
		case r.ch <- ev:
		default:
			t.Errorf("diag recorder for %s overflowed", channel)
		}
	})
	t.Cleanup(r.unsub)
	return r
}

// wait returns the next event of type typ for agent key (any agent when
// key is ""), skipping others.
func (r *recorder) wait(t *testing.T, typ, key string) diag.Event {
	t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for {
		select {
		case ev := <-r.ch:
			if ev.Type == typ && (key == "" || ev.Agent == key) {
				return ev
			}
		case <-deadline.C:
			t.Fatalf("timed out waiting for diag event %s on %q", typ, key)
		}
	}
}

// waitAll waits for an event of type typ for each of keys, in any order.
func (r *recorder) waitAll(t *testing.T, typ string, keys ...string) {
	t.Helper()
	missing := map[string]bool{}
	for _, k := range keys {
		missing[k] = true
	}
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for len(missing) > 0 {
		select {
		case ev := <-r.ch:
			if ev.Type == typ {
				delete(missing, ev.Agent)
			}
		case <-deadline.C:
			t.Fatalf("timed out waiting for diag events %s on %v", typ, missing)
		}
	}
}

// drain returns the events received so far without waiting.
func (r *recorder) drain() []diag.Event {
	var out []diag.Event
	for {
		select {
		case ev := <-r.ch:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// fakeTransport is an in-memory agent.Transport.
type fakeTransport struct {
	frames chan []byte
	kept   [][]byte // frames moved out of the channel by drainInto
	once   sync.Once
	closed chan int // receives the close code once
}

func newTransport() *fakeTransport {
	return &fakeTransport{frames: make(chan []byte, 1024), closed: make(chan int, 1)}
}

func (f *fakeTransport) Send(frame []byte) bool {
	select {
	case f.frames <- frame:
		return true
	default:
		return false
	}
}

func (f *fakeTransport) Close(code int, reason string) {
	f.once.Do(func() { f.closed <- code })
}

func (f *fakeTransport) next(t *testing.T) map[string]any {
	t.Helper()
	select {
	case b := <-f.frames:
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("frame %s: %v", b, err)
		}
		return m
	case <-time.After(waitLimit):
		t.Fatal("timed out waiting for a frame")
		return nil
	}
}

// drainInto moves queued frames to the transport's kept list.
func drainInto(f *fakeTransport) {
	for {
		select {
		case b := <-f.frames:
			f.kept = append(f.kept, b)
		default:
			return
		}
	}
}

// all returns every frame received so far, decoded.
func (f *fakeTransport) all() []map[string]any {
	drainInto(f)
	out := make([]map[string]any, 0, len(f.kept))
	for _, b := range f.kept {
		var m map[string]any
		json.Unmarshal(b, &m)
		out = append(out, m)
	}
	return out
}

// closedWith returns the close code, failing if the transport was not
// closed.
func (f *fakeTransport) closedWith(t *testing.T) int {
	t.Helper()
	select {
	case c := <-f.closed:
		return c
	case <-time.After(waitLimit):
		t.Fatal("transport was not closed")
		return 0
	}
}

func (f *fakeTransport) isClosed() bool {
	select {
	case c := <-f.closed:
		f.closed <- c
		return true
	default:
		return false
	}
}

// Probe is the agent class of the runtime tests. Its hooks report to the
// shared probeHooks of the test that registered it.
type Probe struct {
	agent.Base
	h *probeHooks
}

type fired struct {
	path    string
	method  string
	payload Payload
}

type probeHooks struct {
	starts  atomic.Int32
	fired   chan fired
	entered chan struct{}
	release chan struct{}
}

func newHooks() *probeHooks {
	return &probeHooks{fired: make(chan fired, 256), entered: make(chan struct{}, 16), release: make(chan struct{})}
}

// Payload is the schedule payload of the tests.
type Payload struct {
	N    int    `json:"n"`
	Note string `json:"note"`
}

func probeClass(h *probeHooks) agent.Class {
	return agent.Class{
		Name:     "Probe",
		New:      func() agent.Agent { return &Probe{h: h} },
		Callable: []string{"wait", "bump", "echo", "park"},
	}
}

func (p *Probe) OnStart(ctx context.Context) error {
	p.h.starts.Add(1)
	return nil
}

// Tick and Tock are schedule callbacks.
func (p *Probe) Tick(ctx context.Context, pl Payload) error {
	p.h.fired <- fired{path: p.Path().String(), method: "Tick", payload: pl}
	return nil
}

func (p *Probe) Tock(ctx context.Context, pl Payload) error {
	p.h.fired <- fired{path: p.Path().String(), method: "Tock", payload: pl}
	return nil
}

// NoArgs is a schedule callback without payload.
func (p *Probe) NoArgs() {
	p.h.fired <- fired{path: p.Path().String(), method: "NoArgs"}
}

// TwoArgs has a signature a schedule cannot call.
func (p *Probe) TwoArgs(ctx context.Context, a, b int) error { return nil }

// Streamy is a streaming method, not usable as a schedule callback.
func (p *Probe) Streamy(ctx context.Context, s *agent.Stream, n int) error { return nil }

// Wait blocks until the test releases it: an RPC in flight.
func (p *Probe) Wait(ctx context.Context) (string, error) {
	p.h.entered <- struct{}{}
	select {
	case <-p.h.release:
		return "released", nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Park waits at an await point until the test releases it, so the
// instance takes other inputs meanwhile: a call in flight that does not
// hold the gate.
func (p *Probe) Park(ctx context.Context) (string, error) {
	err := agent.Await(ctx, func() error {
		p.h.entered <- struct{}{}
		select {
		case <-p.h.release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	return "parked", err
}

type count struct {
	Count int `json:"count"`
}

func (p *Probe) Bump(ctx context.Context, by int) (int, error) {
	var s count
	if err := p.DecodeState(&s); err != nil {
		return 0, err
	}
	s.Count += by
	return s.Count, p.SetState(ctx, s)
}

func (p *Probe) Echo(v any) any { return v }

// nextFired waits for one schedule callback.
func (h *probeHooks) nextFired(t *testing.T) fired {
	t.Helper()
	select {
	case f := <-h.fired:
		return f
	case <-time.After(waitLimit):
		t.Fatal("timed out waiting for a schedule callback")
		return fired{}
	}
}

func getProbe(t *testing.T, rt *agent.Runtime, p agent.Path) *Probe {
	t.Helper()
	a, err := rt.Get(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	pr, ok := a.(*Probe)
	if !ok {
		t.Fatalf("%s is a %T", p, a)
	}
	return pr
}

// notes creates {notes} in the agent's private tables and stores text.
func writeNote(t *testing.T, p *Probe, text string) {
	t.Helper()
	err := p.Storage().Update(context.Background(), func(s *agent.SQL) error {
		if _, err := s.Exec(`CREATE TABLE IF NOT EXISTS {notes} (id INTEGER PRIMARY KEY, text TEXT NOT NULL)`); err != nil {
			return err
		}
		_, err := s.Exec(`INSERT INTO {notes} (text) VALUES (?)`, text)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func readNotes(t *testing.T, p *Probe) []string {
	t.Helper()
	var out []string
	err := p.Storage().View(context.Background(), func(s *agent.SQL) error {
		rows, err := s.Query(`SELECT text FROM {notes} ORDER BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var v string
			if err := rows.Scan(&v); err != nil {
				return err
			}
			out = append(out, v)
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func clockworkAt(t time.Time) *clockwork.FakeClock { return clockwork.NewFakeClockAt(t) }
