package agent_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// ScheduleAfter and ScheduleAt fire the named method with the payload when
// the clock reaches the due time, not before, and then forget the schedule.
func TestScheduleAfterAndAtFireWithPayload(t *testing.T) {
	h := newHooks()
	e := newRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ev := record(t, e.rt.Diag(), diag.ChannelSchedule)
	e.start()
	ctx := context.Background()
	path := agent.Root("Probe", "sched")
	p := getProbe(t, e.rt, path)

	after, err := p.ScheduleAfter(ctx, 10*time.Second, "Tick", Payload{N: 7, Note: "after"})
	if err != nil {
		t.Fatal(err)
	}
	if after.ID == "" || after.Kind != agent.ScheduleDelayed || !after.DueAt.Equal(epoch.Add(10*time.Second)) {
		t.Fatalf("ScheduleAfter returned %+v", after)
	}
	created := ev.wait(t, "create", path.String())
	if created.Attrs["id"] != after.ID || created.Attrs["method"] != "Tick" {
		t.Errorf("create event attrs = %v", created.Attrs)
	}
	at, err := p.ScheduleAt(ctx, epoch.Add(time.Hour), "Tock", Payload{N: 8, Note: "at"})
	if err != nil {
		t.Fatal(err)
	}
	list, err := p.Schedules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != after.ID || list[1].ID != at.ID || string(list[0].Payload) != `{"n":7,"note":"after"}` {
		t.Fatalf("Schedules = %+v, want after then at", list)
	}

	e.blockUntil(1)
	e.clock.Advance(9 * time.Second)
	select {
	case f := <-h.fired:
		t.Fatalf("%s fired before it was due", f.method)
	default:
	}
	e.clock.Advance(time.Second)
	f := h.nextFired(t)
	if f.method != "Tick" || f.payload != (Payload{N: 7, Note: "after"}) || f.path != path.String() {
		t.Fatalf("fired %+v", f)
	}
	fire := ev.wait(t, "fire", path.String())
	if fire.Attrs["id"] != after.ID || fire.Attrs["error"] != nil {
		t.Errorf("fire event attrs = %v", fire.Attrs)
	}
	e.waitDB("the fired one-shot schedule to be deleted", func() bool {
		return e.queryInt(`SELECT count(*) FROM schedules WHERE id = ?`, after.ID) == 0
	})

	e.blockUntil(1)
	e.clock.Advance(time.Hour)
	f = h.nextFired(t)
	if f.method != "Tock" || f.payload != (Payload{N: 8, Note: "at"}) {
		t.Fatalf("fired %+v", f)
	}
	e.waitDB("all schedules to be deleted", func() bool {
		return e.queryInt(`SELECT count(*) FROM schedules`) == 0
	})
	e.close()
	if len(h.fired) != 0 {
		t.Fatalf("%d extra callbacks", len(h.fired))
	}
}

// ScheduleEvery repeats at its interval until CancelSchedule stops it.
func TestScheduleEveryUntilCanceled(t *testing.T) {
	h := newHooks()
	e := newRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ev := record(t, e.rt.Diag(), diag.ChannelSchedule)
	e.start()
	ctx := context.Background()
	path := agent.Root("Probe", "every")
	p := getProbe(t, e.rt, path)

	every, err := p.ScheduleEvery(ctx, 10*time.Second, "Tick", Payload{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e.blockUntil(1)
		e.clock.Advance(10 * time.Second)
		if f := h.nextFired(t); f.method != "Tick" || f.payload.N != 1 {
			t.Fatalf("fire %d: %+v", i, f)
		}
		ev.wait(t, "fire", path.String())
		want := epoch.Add(time.Duration(i+2) * 10 * time.Second).UnixMilli()
		e.waitDB("the interval schedule to be re-armed", func() bool {
			return e.queryInt(`SELECT count(*) FROM schedules WHERE id = ? AND due_at = ?`, every.ID, want) == 1
		})
	}

	ok, err := p.CancelSchedule(ctx, every.ID)
	if err != nil || !ok {
		t.Fatalf("CancelSchedule = %v, %v", ok, err)
	}
	if c := ev.wait(t, "cancel", path.String()); c.Attrs["id"] != every.ID {
		t.Errorf("cancel event attrs = %v", c.Attrs)
	}
	if ok, err := p.CancelSchedule(ctx, every.ID); err != nil || ok {
		t.Fatalf("second CancelSchedule = %v, %v; want false", ok, err)
	}
	if list, _ := p.Schedules(ctx); len(list) != 0 {
		t.Fatalf("Schedules after cancel = %+v", list)
	}

	// A sentinel proves the scheduler ran past the canceled due time.
	if _, err := p.ScheduleAfter(ctx, 30*time.Second, "Tock", nil); err != nil {
		t.Fatal(err)
	}
	e.blockUntil(1)
	e.clock.Advance(30 * time.Second)
	if f := h.nextFired(t); f.method != "Tock" {
		t.Fatalf("after cancel, %s fired", f.method)
	}
	e.close() // waits for every callback
	if len(h.fired) != 0 {
		t.Fatalf("the canceled schedule fired %d more times", len(h.fired))
	}
}

// ScheduleCron fires by the cron expression, in UTC, repeatedly.
func TestScheduleCron(t *testing.T) {
	h := newHooks()
	e := startRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ctx := context.Background()
	p := getProbe(t, e.rt, agent.Root("Probe", "cron"))

	sc, err := p.ScheduleCron(ctx, "*/5 * * * *", "Tick", Payload{Note: "cron"})
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2025, 1, 1, 0, 5, 0, 0, time.UTC); !sc.DueAt.Equal(want) || sc.Kind != agent.ScheduleCron {
		t.Fatalf("cron schedule %+v, want due at %v", sc, want)
	}
	e.blockUntil(1)
	e.clock.Advance(4*time.Minute + 29*time.Second) // 00:04:59
	select {
	case f := <-h.fired:
		t.Fatalf("cron fired early: %+v", f)
	default:
	}
	e.clock.Advance(time.Second) // 00:05:00
	if f := h.nextFired(t); f.payload.Note != "cron" {
		t.Fatalf("fired %+v", f)
	}
	next := time.Date(2025, 1, 1, 0, 10, 0, 0, time.UTC).UnixMilli()
	e.waitDB("the cron schedule to be re-armed for 00:10", func() bool {
		return e.queryInt(`SELECT count(*) FROM schedules WHERE id = ? AND due_at = ?`, sc.ID, next) == 1
	})
	e.blockUntil(1)
	e.clock.Advance(5 * time.Minute)
	if f := h.nextFired(t); f.payload.Note != "cron" {
		t.Fatalf("second fire %+v", f)
	}

	if _, err := p.ScheduleCron(ctx, "not a cron", "Tick", nil); err == nil {
		t.Error("an invalid cron expression was accepted")
	}
}

// A sub-agent's schedule calls the sub-agent's method.
func TestScheduleOnSubAgent(t *testing.T) {
	h := newHooks()
	e := newRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ev := record(t, e.rt.Diag(), diag.ChannelSchedule)
	e.start()
	ctx := context.Background()
	parent := getProbe(t, e.rt, agent.Root("Probe", "parent"))
	child, err := agent.SubAgent[*Probe](ctx, parent, "Probe", "kid")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := child.ScheduleAfter(ctx, time.Minute, "NoArgs", nil); err != nil {
		t.Fatal(err)
	}
	if list, _ := parent.Schedules(ctx); len(list) != 0 {
		t.Fatalf("the child's schedule is listed on the parent: %+v", list)
	}
	// Evict the child: the schedule must rehydrate it.
	if !e.rt.Evict(child.Path()) {
		t.Fatal("could not evict the child")
	}
	e.blockUntil(1)
	e.clock.Advance(time.Minute)
	f := h.nextFired(t)
	want := agent.Root("Probe", "parent").Child("Probe", "kid").String()
	if f.path != want || f.method != "NoArgs" {
		t.Fatalf("fired %+v, want NoArgs on %s", f, want)
	}
	if fe := ev.wait(t, "fire", ""); fe.Agent != want {
		t.Errorf("fire event agent = %q, want %q", fe.Agent, want)
	}
}

// An unknown method or one a schedule cannot call is refused when the
// schedule is made, and nothing is stored.
func TestScheduleRefusesBadMethods(t *testing.T) {
	h := newHooks()
	e := startRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ctx := context.Background()
	p := getProbe(t, e.rt, agent.Root("Probe", "bad"))

	cases := []struct {
		name string
		call func() (agent.Schedule, error)
	}{
		{"unknown method", func() (agent.Schedule, error) { return p.ScheduleAfter(ctx, time.Second, "Nope", nil) }},
		{"wire spelling", func() (agent.Schedule, error) { return p.ScheduleAfter(ctx, time.Second, "tick", nil) }},
		{"two parameters", func() (agent.Schedule, error) { return p.ScheduleAt(ctx, epoch.Add(time.Hour), "TwoArgs", nil) }},
		{"streaming", func() (agent.Schedule, error) { return p.ScheduleEvery(ctx, time.Second, "Streamy", nil) }},
		{"cron unknown", func() (agent.Schedule, error) { return p.ScheduleCron(ctx, "@hourly", "Missing", nil) }},
		{"zero interval", func() (agent.Schedule, error) { return p.ScheduleEvery(ctx, 0, "Tick", nil) }},
		{"unmarshalable payload", func() (agent.Schedule, error) { return p.ScheduleAfter(ctx, time.Second, "Tick", make(chan int)) }},
	}
	for _, c := range cases {
		if s, err := c.call(); err == nil {
			t.Errorf("%s: schedule accepted: %+v", c.name, s)
		}
	}
	if n := e.queryInt(`SELECT count(*) FROM schedules`); n != 0 {
		t.Fatalf("%d refused schedules were stored", n)
	}
	_, err := p.ScheduleAfter(ctx, time.Second, "Nope", nil)
	if err == nil || !strings.Contains(err.Error(), "Nope") {
		t.Errorf("error %v does not name the method", err)
	}
}

// Schedules that came due while the runtime was stopped fire exactly once
// when a new runtime on the same database starts: a one-shot is then
// deleted, an interval re-armed from the restart time (not once per missed
// interval).
func TestScheduleDueWhileStoppedFiresOnceOnRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	path := agent.Root("Probe", "sleeper")

	h1 := newHooks()
	e1 := startRuntime(t, rtOptions{dir: dir, classes: []agent.Class{probeClass(h1)}})
	p := getProbe(t, e1.rt, path)
	once, err := p.ScheduleAfter(ctx, time.Hour, "Tick", Payload{N: 1, Note: "missed"})
	if err != nil {
		t.Fatal(err)
	}
	every, err := p.ScheduleEvery(ctx, 10*time.Minute, "Tock", Payload{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	future, err := p.ScheduleAfter(ctx, 5*time.Hour, "Tick", Payload{N: 3, Note: "future"})
	if err != nil {
		t.Fatal(err)
	}
	e1.close()
	if len(h1.fired) != 0 {
		t.Fatalf("%d schedules fired before they were due", len(h1.fired))
	}

	// Three hours later, a new process on the same file.
	h2 := newHooks()
	restart := epoch.Add(3 * time.Hour)
	e2 := newRuntime(t, rtOptions{dir: dir, clock: clockworkAt(restart), classes: []agent.Class{probeClass(h2)}})
	ev := record(t, e2.rt.Diag(), diag.ChannelSchedule)
	e2.start()

	got := map[string]int{}
	for range 2 {
		f := h2.nextFired(t)
		got[f.method+"/"+f.payload.Note]++
		if f.path != path.String() {
			t.Errorf("fired on %s", f.path)
		}
	}
	if got["Tick/missed"] != 1 || got["Tock/"] != 1 {
		t.Fatalf("fired %v, want the missed one-shot and the interval once each", got)
	}
	for range 2 {
		ev.wait(t, "fire", path.String())
	}
	next := restart.Add(10 * time.Minute).UnixMilli()
	e2.waitDB("the one-shot to be deleted and the interval re-armed", func() bool {
		return e2.queryInt(`SELECT count(*) FROM schedules WHERE id = ?`, once.ID) == 0 &&
			e2.queryInt(`SELECT count(*) FROM schedules WHERE id = ? AND due_at = ?`, every.ID, next) == 1
	})
	if n := e2.queryInt(`SELECT count(*) FROM schedules WHERE id = ?`, future.ID); n != 1 {
		t.Fatalf("the schedule due later was lost (%d rows)", n)
	}
	if h2.starts.Load() != 1 {
		t.Errorf("OnStart ran %d times in the new runtime, want 1 (hydrated by the schedule)", h2.starts.Load())
	}
	e2.close()
	if len(h2.fired) != 0 {
		f := <-h2.fired
		t.Fatalf("a schedule fired more than once after the restart: %+v", f)
	}
	if evs := ev.drain(); len(evs) != 0 {
		for _, e := range evs {
			if e.Type == "fire" {
				t.Fatalf("extra fire event %+v", e)
			}
		}
	}
}

// movingPlacement owns every instance until the first write fenced after
// moveAtNextFence was set: that write is refused, as a node's is when the
// instance's shard has just moved to another node, and from then on the
// node owns nothing.
type movingPlacement struct {
	mu       sync.Mutex
	armed    bool
	moved    bool
	refusals int
}

var errMoved = errors.New("the shard moved to another node")

func (m *movingPlacement) moveAtNextFence() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.armed = true
}

func (m *movingPlacement) Owns(agent.Path) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.moved
}

func (m *movingPlacement) Epoch(agent.Path) (int64, bool) { return 1, true }

func (m *movingPlacement) Fence(ctx context.Context, tx store.Tx, path agent.Path, epoch int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.armed {
		m.armed, m.moved = false, true
	}
	if m.moved {
		m.refusals++
		return errMoved
	}
	return nil
}

// TestScheduleOfMovedInstanceIsNotAnError: a schedule whose instance moved
// to another node while it ran cannot record its firing here (the write is
// fenced); the row is the new owner's, which fires it again. That is the
// expected course of a hand-over, logged at Info, not as an error of this
// node (a rolling restart logged one error per schedule handed over).
func TestScheduleOfMovedInstanceIsNotAnError(t *testing.T) {
	h := newHooks()
	place := &movingPlacement{}
	logs := &logRecords{}
	e := newRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}, place: place, log: slog.New(logs)})
	ev := record(t, e.rt.Diag(), diag.ChannelSchedule)
	e.start()
	ctx := context.Background()
	path := agent.Root("Probe", "moved")
	p := getProbe(t, e.rt, path)
	if _, err := p.ScheduleAfter(ctx, time.Second, "Tick", Payload{N: 1}); err != nil {
		t.Fatal(err)
	}
	place.moveAtNextFence()
	e.blockUntil(1)
	e.clock.Advance(time.Second)
	if f := h.nextFired(t); f.method != "Tick" {
		t.Fatalf("fired %+v", f)
	}
	ev.wait(t, "fire", path.String()) // published after the finish write
	place.mu.Lock()
	refusals := place.refusals
	place.mu.Unlock()
	if refusals == 0 {
		t.Fatal("the finish write was not fenced: the test did not move the instance")
	}
	msgs := logs.messages()
	if slices.Contains(msgs, "ERROR scheduler: finish schedule") {
		t.Fatalf("the fenced finish of a moved instance was logged as a failure: %q", msgs)
	}
	if !slices.Contains(msgs, "INFO scheduler: schedule left to the instance's new owner") {
		t.Fatalf("the hand-over of the schedule was not logged at Info: %q", msgs)
	}
}
