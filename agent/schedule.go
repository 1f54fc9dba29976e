package agent

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/robfig/cron/v3"

	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// Schedule kinds.
const (
	ScheduleAt       = "at"       // once, at a time
	ScheduleDelayed  = "delayed"  // once, after a delay
	ScheduleCron     = "cron"     // repeatedly, by a cron expression
	ScheduleInterval = "interval" // repeatedly, every interval
)

// Schedule is a persisted call of one of the agent's methods.
type Schedule struct {
	ID       string          `json:"id"`
	Method   string          `json:"method"`
	Payload  json.RawMessage `json:"payload,omitempty"`
	Kind     string          `json:"kind"`
	Cron     string          `json:"cron,omitempty"`
	Interval time.Duration   `json:"interval,omitempty"`
	DueAt    time.Time       `json:"dueAt"`
}

// ScheduleAt persists a call of method (the Go method name) with payload at
// time at. The method has the signature func([ctx context.Context,]
// [payload T]) [error]; an unknown method or a wrong signature is refused
// here rather than when it comes due. A schedule that comes due while the
// process is down fires once when it starts again.
func (b *Base) ScheduleAt(ctx context.Context, at time.Time, method string, payload any) (Schedule, error) {
	return b.addSchedule(ctx, Schedule{Method: method, Kind: ScheduleAt, DueAt: at}, payload)
}

// ScheduleAfter persists a call of method with payload after delay d.
func (b *Base) ScheduleAfter(ctx context.Context, d time.Duration, method string, payload any) (Schedule, error) {
	return b.addSchedule(ctx, Schedule{Method: method, Kind: ScheduleDelayed, DueAt: b.in.rt.clock.Now().Add(d)}, payload)
}

// ScheduleCron persists a repeating call of method by a standard five-field
// cron expression (or a descriptor such as "@hourly"), in UTC.
func (b *Base) ScheduleCron(ctx context.Context, expr, method string, payload any) (Schedule, error) {
	sched, err := cron.ParseStandard(expr)
	if err != nil {
		return Schedule{}, fmt.Errorf("agent: cron %q: %w", expr, err)
	}
	return b.addSchedule(ctx, Schedule{Method: method, Kind: ScheduleCron, Cron: expr,
		DueAt: sched.Next(b.in.rt.clock.Now().UTC())}, payload)
}

// ScheduleEvery persists a call of method every interval, the first one
// interval from now.
func (b *Base) ScheduleEvery(ctx context.Context, interval time.Duration, method string, payload any) (Schedule, error) {
	if interval <= 0 {
		return Schedule{}, errors.New("agent: schedule interval must be positive")
	}
	return b.addSchedule(ctx, Schedule{Method: method, Kind: ScheduleInterval, Interval: interval,
		DueAt: b.in.rt.clock.Now().Add(interval)}, payload)
}

func (b *Base) addSchedule(ctx context.Context, s Schedule, payload any) (Schedule, error) {
	if strings.HasPrefix(s.Method, layerSchedulePrefix) {
		if b.in.layerScheduler(s.Method) == nil {
			return Schedule{}, fmt.Errorf("agent: schedule %s: no layer handles it", s.Method)
		}
	} else if _, err := scheduleMethod(b.in.class.typ, s.Method); err != nil {
		return Schedule{}, fmt.Errorf("agent: schedule %s: %w", s.Method, err)
	}
	if payload != nil {
		data, err := json.Marshal(payload)
		if err != nil {
			return Schedule{}, fmt.Errorf("agent: schedule %s: marshal payload: %w", s.Method, err)
		}
		s.Payload = data
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Schedule{}, err
	}
	s.ID = id.String()
	rt := b.in.rt
	err = b.in.db().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO schedules (id, instance_id, method, payload, kind, cron, interval_ms, due_at, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			s.ID, b.in.id, s.Method, nullString(s.Payload), s.Kind, s.Cron, s.Interval.Milliseconds(),
			s.DueAt.UnixMilli(), rt.clock.Now().UnixMilli())
		return err
	})
	if err != nil {
		return Schedule{}, fmt.Errorf("agent: schedule %s: %w", s.Method, err)
	}
	rt.diag.Publish(ctx, diag.ChannelSchedule, "create", b.in.key, map[string]any{"id": s.ID, "method": s.Method, "kind": s.Kind, "dueAt": s.DueAt})
	rt.sched.poke()
	return s, nil
}

// CancelSchedule deletes a schedule of this instance and reports whether it
// existed.
func (b *Base) CancelSchedule(ctx context.Context, id string) (bool, error) {
	var n int64
	err := b.in.db().Update(ctx, func(tx store.Tx) error {
		res, err := tx.Exec(ctx, `DELETE FROM schedules WHERE id = ? AND instance_id = ?`, id, b.in.id)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("agent: cancel schedule %s: %w", id, err)
	}
	if n > 0 {
		b.in.rt.diag.Publish(ctx, diag.ChannelSchedule, "cancel", b.in.key, map[string]any{"id": id})
		b.in.rt.sched.poke()
	}
	return n > 0, nil
}

// Schedules lists this instance's schedules, soonest first.
func (b *Base) Schedules(ctx context.Context) ([]Schedule, error) {
	var out []Schedule
	err := b.in.rt.db.View(ctx, func(tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, method, payload, kind, cron, interval_ms, due_at
			FROM schedules WHERE instance_id = ? ORDER BY due_at, id`, b.in.id)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			s, _, err := scanSchedule(rows, false)
			if err != nil {
				return err
			}
			out = append(out, s)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("agent: list schedules: %w", err)
	}
	return out, nil
}

type scanner interface{ Scan(dest ...any) error }

func scanSchedule(r scanner, withPath bool) (Schedule, string, error) {
	var s Schedule
	var payload, cronExpr sql.NullString
	var interval sql.NullInt64
	var due int64
	var path string
	dest := []any{&s.ID, &s.Method, &payload, &s.Kind, &cronExpr, &interval, &due}
	if withPath {
		dest = append(dest, &path)
	}
	if err := r.Scan(dest...); err != nil {
		return s, "", err
	}
	if payload.Valid {
		s.Payload = json.RawMessage(payload.String)
	}
	s.Cron = cronExpr.String
	s.Interval = time.Duration(interval.Int64) * time.Millisecond
	s.DueAt = time.UnixMilli(due)
	return s, path, nil
}

func nullString(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// scheduleMethod checks that typ has a method usable as a schedule callback.
func scheduleMethod(typ reflect.Type, name string) (*method, error) {
	m, err := reflectMethod(typ, name)
	if err != nil {
		return nil, err
	}
	if m.streaming || len(m.params) > 1 {
		return nil, fmt.Errorf("method %s must take (ctx, payload)", name)
	}
	return m, nil
}

// scheduler fires due schedules. One goroutine waits for the soonest due
// time (or a poke when schedules change); each due schedule runs on its own
// goroutine and is deleted (or re-armed, for repeating ones) after its call.
type scheduler struct {
	rt   *Runtime
	wake chan struct{}

	mu      sync.Mutex
	running map[string]bool
}

func newScheduler(rt *Runtime) *scheduler {
	return &scheduler{rt: rt, wake: make(chan struct{}, 1), running: map[string]bool{}}
}

func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *scheduler) start(ctx context.Context) error {
	s.rt.wg.Add(1)
	go s.loop()
	return nil
}

func (s *scheduler) loop() {
	rt := s.rt
	defer rt.wg.Done()
	for {
		s.fireDue()
		next, ok, err := s.nextDue()
		if err != nil {
			if rt.ctx.Err() != nil {
				return
			}
			rt.log.Error("scheduler: next due", "err", err)
			next, ok = rt.clock.Now().Add(time.Second), true
		}
		if !s.wait(next, ok) {
			return
		}
	}
}

// wait blocks until next (when ok), a poke, or shutdown; it reports false
// on shutdown.
func (s *scheduler) wait(next time.Time, ok bool) bool {
	rt := s.rt
	var timer <-chan time.Time
	if ok {
		t := rt.clock.NewTimer(max(next.Sub(rt.clock.Now()), 0))
		defer t.Stop()
		// The delay was measured before the timer was armed: a clock that
		// moved in between (a fake clock advanced to next by a test) left
		// the timer late, past next. Due by now means due.
		if !rt.clock.Now().Before(next) {
			return true
		}
		timer = t.Chan()
	}
	select {
	case <-rt.ctx.Done():
		return false
	case <-s.wake:
	case <-timer:
	}
	return true
}

// nextDue returns the soonest due time of a schedule that is not running.
func (s *scheduler) nextDue() (time.Time, bool, error) {
	rt := s.rt
	s.mu.Lock()
	skip := len(s.running)
	s.mu.Unlock()
	var found time.Time
	var ok bool
	if rt.place != nil {
		return s.nextOwnedDue(skip)
	}
	err := rt.db.View(rt.ctx, func(tx store.Tx) error {
		rows, err := tx.Query(rt.ctx, `SELECT id, due_at FROM schedules ORDER BY due_at LIMIT ?`, skip+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			var due int64
			if err := rows.Scan(&id, &due); err != nil {
				return err
			}
			s.mu.Lock()
			running := s.running[id]
			s.mu.Unlock()
			if !running {
				found, ok = time.UnixMilli(due), true
				return nil
			}
		}
		return rows.Err()
	})
	return found, ok, err
}

// ownedBatch is how many of the soonest schedules a cluster node reads to
// find the soonest one of its own instances.
const ownedBatch = 256

// nextOwnedDue is nextDue on a cluster node: the soonest schedule of an
// instance it owns. When the batch read holds none, it looks again at the
// batch's last due time (or in a second, whichever is sooner); acquiring
// shards pokes the scheduler (Runtime.Wake).
func (s *scheduler) nextOwnedDue(skip int) (time.Time, bool, error) {
	rt := s.rt
	var found time.Time
	var ok bool
	err := rt.db.View(rt.ctx, func(tx store.Tx) error {
		rows, err := tx.Query(rt.ctx, `SELECT s.id, s.due_at, i.path FROM schedules s JOIN instances i ON i.id = s.instance_id
			ORDER BY s.due_at LIMIT ?`, skip+ownedBatch)
		if err != nil {
			return err
		}
		defer rows.Close()
		n := 0
		var last int64
		for rows.Next() {
			var id, key string
			var due int64
			if err := rows.Scan(&id, &due, &key); err != nil {
				return err
			}
			n++
			last = due
			s.mu.Lock()
			running := s.running[id]
			s.mu.Unlock()
			if running {
				continue
			}
			if path, err := ParsePath(key); err == nil && rt.place.Owns(path) {
				found, ok = time.UnixMilli(due), true
				return nil
			}
		}
		if n == skip+ownedBatch {
			found, ok = time.UnixMilli(last), true
			if poll := rt.clock.Now().Add(time.Second); poll.Before(found) {
				found = poll
			}
		}
		return rows.Err()
	})
	return found, ok, err
}

// fireDue starts every due schedule that is not already running.
func (s *scheduler) fireDue() {
	rt := s.rt
	now := rt.clock.Now().UnixMilli()
	type due struct {
		s    Schedule
		path string
	}
	var list []due
	err := rt.db.View(rt.ctx, func(tx store.Tx) error {
		rows, err := tx.Query(rt.ctx, `SELECT s.id, s.method, s.payload, s.kind, s.cron, s.interval_ms, s.due_at, i.path
			FROM schedules s JOIN instances i ON i.id = s.instance_id
			WHERE s.due_at <= ? ORDER BY s.due_at, s.id`, now)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			sc, path, err := scanSchedule(rows, true)
			if err != nil {
				return err
			}
			if rt.place != nil {
				// A cluster node fires the schedules of its own instances.
				if p, err := ParsePath(path); err != nil || !rt.place.Owns(p) {
					continue
				}
			}
			list = append(list, due{sc, path})
		}
		return rows.Err()
	})
	if err != nil {
		if rt.ctx.Err() == nil {
			rt.log.Error("scheduler: load due schedules", "err", err)
		}
		return
	}
	for _, d := range list {
		s.mu.Lock()
		if s.running[d.s.ID] {
			s.mu.Unlock()
			continue
		}
		s.running[d.s.ID] = true
		s.mu.Unlock()
		rt.wg.Add(1)
		go func() {
			defer rt.wg.Done()
			s.run(d.s, d.path)
			s.mu.Lock()
			delete(s.running, d.s.ID)
			s.mu.Unlock()
			s.poke()
		}()
	}
}

// run calls one due schedule and then deletes or re-arms it.
func (s *scheduler) run(sc Schedule, key string) {
	rt := s.rt
	ctx := rt.ctx
	// fireDue's list may have been read before an earlier run of this
	// schedule committed (deleting or re-arming the row) and released its
	// running slot; holding the slot now, fire only if the row is still as
	// listed, so a schedule never fires twice for one due time.
	var current int
	err := rt.db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM schedules WHERE id = ? AND due_at = ?`,
			sc.ID, sc.DueAt.UnixMilli()).Scan(&current)
	})
	if err != nil || current == 0 {
		return
	}
	start := rt.clock.Now()
	callErr := func() error {
		path, err := ParsePath(key)
		if err != nil {
			return err
		}
		in, err := rt.acquire(ctx, path)
		if err != nil {
			return err
		}
		defer in.release()
		ctx, leave, err := in.enter(ctx)
		if err != nil {
			return err
		}
		defer leave()
		if strings.HasPrefix(sc.Method, layerSchedulePrefix) {
			return in.runLayerSchedule(WithAgent(ctx, in.agent), sc)
		}
		m, err := scheduleMethod(in.class.typ, sc.Method)
		if err != nil {
			return err
		}
		var args []json.RawMessage
		if sc.Payload != nil {
			args = []json.RawMessage{sc.Payload}
		}
		_, err = m.invoke(WithAgent(ctx, in.agent), reflectValue(in.agent), nil, args)
		return err
	}()
	if errors.Is(callErr, ErrNotOwner) {
		// Moved to another node before it fired: its owner fires it.
		return
	}
	if ctx.Err() != nil && callErr != nil {
		// Shut down mid-call: leave the row so the schedule fires again
		// after the restart.
		return
	}
	// The call finished: record it even if the runtime is closing now.
	ctx = context.WithoutCancel(ctx)
	attrs := map[string]any{"id": sc.ID, "method": sc.Method, "duration": rt.clock.Since(start)}
	if callErr != nil {
		attrs["error"] = callErr.Error()
		rt.log.Error("schedule callback failed", "agent", key, "method", sc.Method, "err", callErr)
	}

	var next time.Time
	switch {
	case errors.Is(callErr, ErrTooManyInstances):
		// Nothing ran: the instance could not be hydrated for lack of
		// room. Try again shortly rather than lose a one-shot schedule or
		// skip a run of a repeating one.
		next = rt.clock.Now().Add(scheduleRetry)
	case sc.Kind == ScheduleCron:
		if cs, err := cron.ParseStandard(sc.Cron); err == nil {
			next = cs.Next(rt.clock.Now().UTC())
		}
	case sc.Kind == ScheduleInterval:
		next = rt.clock.Now().Add(sc.Interval)
	}
	var db store.DB = rt.db
	path, perr := ParsePath(key)
	if perr == nil {
		// Fenced: a node that lost the instance meanwhile leaves the row
		// to its new owner, which fires it again (at least once).
		db = rt.dbFor(path)
	}
	err = db.Update(ctx, func(tx store.Tx) error {
		var err error
		if next.IsZero() {
			_, err = tx.Exec(ctx, `DELETE FROM schedules WHERE id = ? AND due_at = ?`, sc.ID, sc.DueAt.UnixMilli())
		} else {
			_, err = tx.Exec(ctx, `UPDATE schedules SET due_at = ? WHERE id = ? AND due_at = ?`, next.UnixMilli(), sc.ID, sc.DueAt.UnixMilli())
		}
		return err
	})
	switch {
	case err == nil || ctx.Err() != nil:
	case perr == nil && !rt.Owns(path):
		// The instance moved to another node during the call (a hand-over
		// or a lost lease): the row is its new owner's now, which fires
		// the schedule again. Expected during a hand-over, so not an error.
		rt.log.Info("scheduler: schedule left to the instance's new owner", "id", sc.ID, "agent", key, "err", err)
	default:
		rt.log.Error("scheduler: finish schedule", "id", sc.ID, "err", err)
	}
	// After the row's update: an observer of "fire" sees the schedule as
	// the firing left it (deleted or moved to its next due time).
	rt.diag.Publish(ctx, diag.ChannelSchedule, "fire", key, attrs)
}

// scheduleRetry is how long a schedule waits before it fires again when
// its instance could not be hydrated (ErrTooManyInstances).
const scheduleRetry = time.Second

// layerSchedulePrefix marks schedules owned by a framework layer rather
// than an agent method: "@layer/name".
const layerSchedulePrefix = "@"

// LayerScheduler is a Layer that owns schedules. Layers schedule with
// method names of the form "@layer/name" (through the usual Schedule
// methods); when one comes due the runtime calls LayerSchedule of the layer
// whose LayerScheduleName is "layer".
type LayerScheduler interface {
	LayerScheduleName() string
	LayerSchedule(ctx context.Context, name string, payload json.RawMessage) error
}

func (in *instance) layerScheduler(method string) LayerScheduler {
	layer, _, _ := strings.Cut(strings.TrimPrefix(method, layerSchedulePrefix), "/")
	for _, l := range in.layers {
		if ls, ok := l.(LayerScheduler); ok && ls.LayerScheduleName() == layer {
			return ls
		}
	}
	return nil
}

func (in *instance) runLayerSchedule(ctx context.Context, sc Schedule) error {
	ls := in.layerScheduler(sc.Method)
	if ls == nil {
		return fmt.Errorf("no layer handles schedule %s", sc.Method)
	}
	_, name, _ := strings.Cut(strings.TrimPrefix(sc.Method, layerSchedulePrefix), "/")
	return ls.LayerSchedule(ctx, name, sc.Payload)
}
