package agent

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// instance is the in-memory side of one agent instance.
type instance struct {
	rt     *Runtime
	path   Path
	key    string
	class  *classInfo
	agent  Agent
	layers []Layer // framework layers embedded in agent, innermost first

	gate       gate          // the input gate (gate.go)
	ready      chan struct{} // closed when hydration finished
	hydrateErr error
	id         int64 // row id in instances
	created    bool  // this hydration created the row (set before the layers start)
	// epoch is the lease epoch this hydration was made under
	// (Placement.Epoch); its writes are fenced with it.
	epoch int64
	// shard is stored with the instance's wake reasons (Runtime.wakeShardOf).
	shard any

	// busy, lastActive, gone and the idle list links are guarded by rt.mu.
	busy       int
	lastActive time.Time
	gone       bool      // no longer in rt.instances
	idlePrev   *instance // rt.idleList links, while busy is 0
	idleNext   *instance
	inIdle     bool
	idleWait   chan struct{} // closed when busy drops to 0 (waitIdle)

	stateMu   sync.Mutex // serializes setState
	mu        sync.Mutex
	state     json.RawMessage // nil when the agent has no state
	conns     map[*Conn]struct{}
	destroyed bool
	// moved: the instance is being drained or dropped (its node hands it
	// over or lost it); a connection no longer attaches to it.
	moved bool
}

func newInstance(rt *Runtime, path Path, ci *classInfo) *instance {
	return &instance{
		rt: rt, path: append(Path(nil), path...), key: path.String(), class: ci,
		gate: make(gate, 1), ready: make(chan struct{}), conns: map[*Conn]struct{}{},
		lastActive: rt.clock.Now(), shard: rt.wakeShardOf(path),
	}
}

// db is the database as this instance writes it (fenced in a cluster, by
// the epoch of this hydration).
func (in *instance) db() store.DB { return in.rt.dbAt(in.path, in.epoch) }

func (in *instance) isReady() bool {
	select {
	case <-in.ready:
		return true
	default:
		return false
	}
}

// pinLocked takes a busy reference; rt.mu is held. A busy instance is
// never evicted.
func (in *instance) pinLocked() {
	if in.busy == 0 && in.inIdle {
		in.rt.idleList.remove(in)
	}
	in.busy++
}

// pin takes a busy reference.
func (in *instance) pin() {
	in.rt.mu.Lock()
	in.pinLocked()
	in.rt.mu.Unlock()
}

// release drops a busy reference taken by acquire or pin.
func (in *instance) release() {
	rt := in.rt
	rt.mu.Lock()
	in.busy--
	in.lastActive = rt.clock.Now()
	if in.busy == 0 && !in.gone && in.isReady() {
		rt.idleList.pushBack(in)
	}
	if in.busy == 0 && in.idleWait != nil {
		close(in.idleWait)
		in.idleWait = nil
	}
	rt.mu.Unlock()
}

// forgetLocked removes in from the resident instances; rt.mu is held.
func (rt *Runtime) forgetLocked(in *instance) {
	if rt.instances[in.key] == in {
		delete(rt.instances, in.key)
	}
	in.gone = true
	if in.inIdle {
		rt.idleList.remove(in)
	}
}

// idleList is the intrusive list of resident instances that are not in
// use, in the order they went idle (least recently used first).
type idleList struct{ head, tail *instance }

func (l *idleList) front() *instance { return l.head }

func (l *idleList) pushBack(in *instance) {
	in.idlePrev, in.idleNext, in.inIdle = l.tail, nil, true
	if l.tail != nil {
		l.tail.idleNext = in
	} else {
		l.head = in
	}
	l.tail = in
}

func (l *idleList) remove(in *instance) {
	if in.idlePrev != nil {
		in.idlePrev.idleNext = in.idleNext
	} else {
		l.head = in.idleNext
	}
	if in.idleNext != nil {
		in.idleNext.idlePrev = in.idlePrev
	} else {
		l.tail = in.idlePrev
	}
	in.idlePrev, in.idleNext, in.inIdle = nil, nil, false
}

// hydrate creates the instance's rows if needed, loads its state, builds the
// agent value and runs OnStart. It closes in.ready whatever the outcome.
// When the caller knows that the row exists (existing), it is read first,
// which spares the write of the common case.
func (in *instance) hydrate(existing bool, limit func(context.Context) context.Context) {
	defer close(in.ready)
	rt := in.rt
	// The instance's row is read (or created) under the retry limit of the
	// request that hydrates it (store.WithRetryLimit): a client is refused
	// rather than left waiting for an unreachable database. Its start runs
	// on the runtime's context.
	ctx := limit(rt.ctx)
	found := false
	if existing {
		err := rt.db.View(ctx, func(tx store.Tx) error {
			var state sql.NullString
			err := tx.QueryRow(ctx, `SELECT id, state FROM instances WHERE path = ?`, in.key).Scan(&in.id, &state)
			if errors.Is(err, sql.ErrNoRows) {
				return nil // deleted meanwhile: created below
			}
			if err != nil {
				return err
			}
			found = true
			if state.Valid {
				in.state = json.RawMessage(state.String)
			}
			return nil
		})
		if err != nil {
			in.fail(fmt.Errorf("agent: hydrate %s: %w", in.key, err))
			return
		}
	}
	if !found && !in.create(ctx) {
		return
	}
	in.start(rt.ctx)
}

// create inserts the rows of the instance and its ancestors that do not
// exist yet, and reads the instance's id and state. It reports false when
// it failed the instance. A parent hydrated here (an agent-tool run's
// child is created by its resident parent) has its row and its ancestors'
// rows: only the instance's own row is written and read.
func (in *instance) create(ctx context.Context) bool {
	rt := in.rt
	from, parentID := 0, sql.NullInt64{}
	if n := len(in.path); n > 1 {
		if id, ok := rt.residentID(in.path[:n-1]); ok {
			from, parentID = n-1, sql.NullInt64{Int64: id, Valid: true}
		}
	}
	err := in.db().Update(ctx, func(tx store.Tx) error {
		parent := parentID
		for i := from; i < len(in.path); i++ {
			p := in.path[:i+1]
			now := rt.clock.Now().UnixMilli()
			res, err := tx.Exec(ctx, `INSERT INTO instances (path, class, name, parent_id, created_at)
				VALUES (?, ?, ?, ?, ?) ON CONFLICT (path) DO NOTHING`,
				p.String(), p.Leaf().Class, p.Leaf().Name, parent, now)
			if err != nil {
				return err
			}
			if i == len(in.path)-1 {
				n, err := res.RowsAffected()
				if err != nil {
					return err
				}
				in.created = n == 1
			}
			var id int64
			var state sql.NullString
			if err := tx.QueryRow(ctx, `SELECT id, state FROM instances WHERE path = ?`, p.String()).Scan(&id, &state); err != nil {
				return err
			}
			parent = sql.NullInt64{Int64: id, Valid: true}
			if i == len(in.path)-1 {
				in.id = id
				if state.Valid {
					in.state = json.RawMessage(state.String)
				}
			}
		}
		return nil
	})
	if err != nil {
		in.fail(fmt.Errorf("agent: hydrate %s: %w", in.key, err))
		return false
	}
	return true
}

// residentID returns the row id of the instance at path when it is
// resident and hydrated here. Its row exists: Destroy forgets the
// instances whose rows it deletes (forgetDestroyed).
func (rt *Runtime) residentID(path Path) (int64, bool) {
	rt.mu.Lock()
	in, ok := rt.instances[path.String()]
	rt.mu.Unlock()
	if !ok || !in.isReady() || in.hydrateErr != nil || in.id == 0 {
		return 0, false
	}
	return in.id, true
}

// start builds the agent value, starts its layers and runs OnStart.
func (in *instance) start(ctx context.Context) {
	rt := in.rt
	a := in.class.New()
	a.base().bind(in)
	in.agent = a
	in.layers = in.class.layersOf(a)
	for _, ext := range rt.extensions {
		in.layers = append(in.layers, ext(a))
	}
	ctx = WithAgent(ctx, a)
	for _, l := range in.layers {
		if err := l.StartLayer(ctx, a); err != nil {
			in.fail(fmt.Errorf("agent: %s start %T: %w", in.key, l, err))
			return
		}
	}
	if s, ok := a.(Starter); ok {
		if err := s.OnStart(ctx); err != nil {
			in.fail(fmt.Errorf("agent: %s OnStart: %w", in.key, err))
			return
		}
	}
	for _, l := range in.layers {
		if ls, ok := l.(LayerStarted); ok {
			ls.LayerStarted(ctx)
		}
	}
	rt.diag.Publish(ctx, diag.ChannelAgent, "start", in.key, map[string]any{"class": in.class.Name})
}

func (in *instance) fail(err error) {
	in.hydrateErr = err
	rt := in.rt
	rt.mu.Lock()
	rt.forgetLocked(in)
	rt.mu.Unlock()
	rt.log.Error("agent hydration failed", "agent", in.key, "err", err)
}

// setState persists state and broadcasts it to every connection but from.
func (in *instance) setState(ctx context.Context, state json.RawMessage, from *Conn) error {
	if !json.Valid(state) {
		return errors.New("agent: state is not valid JSON")
	}
	// One update at a time, so clients see states in the order they were
	// stored.
	in.stateMu.Lock()
	locked := true
	defer func() {
		if locked {
			in.stateMu.Unlock()
		}
	}()
	err := in.db().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE instances SET state = ? WHERE id = ?`, string(state), in.id)
		return err
	})
	if err != nil {
		return fmt.Errorf("agent: persist state of %s: %w", in.key, err)
	}
	in.mu.Lock()
	in.state = append(json.RawMessage(nil), state...)
	in.mu.Unlock()
	frame, _ := json.Marshal(wire.StateFrame{Type: wire.State, State: state})
	in.broadcast(frame, from)
	in.stateMu.Unlock()
	locked = false
	if o, ok := in.agent.(StateObserver); ok {
		o.OnStateUpdate(ctx, state, from)
	}
	return nil
}

func (in *instance) getState() json.RawMessage {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.state
}

// broadcast sends frame to every connection except those in exclude.
func (in *instance) broadcast(frame []byte, exclude ...*Conn) {
	in.mu.Lock()
	targets := make([]*Conn, 0, len(in.conns))
	for c := range in.conns {
		skip := false
		for _, x := range exclude {
			if c == x {
				skip = true
				break
			}
		}
		if !skip {
			targets = append(targets, c)
		}
	}
	in.mu.Unlock()
	for _, c := range targets {
		c.SendRaw(frame)
	}
}

func (in *instance) connections() []*Conn {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]*Conn, 0, len(in.conns))
	for c := range in.conns {
		out = append(out, c)
	}
	return out
}

// moveOut marks the instance moved, so that no connection attaches to it
// any more, and closes its connections.
func (in *instance) moveOut(code int, reason string) {
	in.mu.Lock()
	in.moved = true
	in.mu.Unlock()
	in.closeConns(code, reason)
}

func (in *instance) closeConns(code int, reason string) {
	for _, c := range in.connections() {
		c.Close(code, reason)
	}
}
