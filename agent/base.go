package agent

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// Base is embedded by every agent type. It gives the agent its identity,
// state, storage, schedules, sub-agents and connections.
type Base struct {
	in *instance
}

func (b *Base) base() *Base { return b }

func (b *Base) bind(in *instance) { b.in = in }

func reflectValue(a Agent) reflect.Value { return reflect.ValueOf(a) }

// BaseOf returns the Base embedded in a, for framework layers that work on
// any agent.
func BaseOf(a Agent) *Base { return a.base() }

// Self returns the agent value that embeds this Base.
func (b *Base) Self() Agent { return b.in.agent }

// Name returns the instance name.
func (b *Base) Name() string { return b.in.path.Leaf().Name }

// ClassName returns the registered class name.
func (b *Base) ClassName() string { return b.in.class.Name }

// Path returns the instance's full path.
func (b *Base) Path() Path { return b.in.path }

// ParentPath returns the parent's path, or nil for a root instance.
func (b *Base) ParentPath() Path { return b.in.path.Parent() }

// Runtime returns the runtime hosting the instance.
func (b *Base) Runtime() *Runtime { return b.in.rt }

// Clock returns the runtime's clock.
func (b *Base) Clock() clockwork.Clock { return b.in.rt.clock }

// Logger returns a logger that names this instance.
func (b *Base) Logger() *slog.Logger { return b.in.rt.log.With("agent", b.in.key) }

// Diag returns the observability hub.
func (b *Base) Diag() *diag.Hub { return b.in.rt.diag }

// InstanceID returns the instance's storage row id. Framework layers key
// their own tables by it.
func (b *Base) InstanceID() int64 { return b.in.id }

// Created reports whether this hydration created the instance: its row was
// inserted by it, so no table holds anything of the instance yet and a
// layer's StartLayer has nothing to load or resume. A later hydration of the
// same instance (after an eviction or a restart) reports false.
func (b *Base) Created() bool { return b.in.created }

// State returns the current state as JSON, or nil when none was set.
func (b *Base) State() json.RawMessage { return b.in.getState() }

// DecodeState unmarshals the current state into v. It leaves v untouched
// when no state was set.
func (b *Base) DecodeState(v any) error {
	s := b.in.getState()
	if s == nil {
		return nil
	}
	return json.Unmarshal(s, v)
}

// SetState persists v as the instance's state and broadcasts it to every
// connection as cf_agent_state. It returns once the state is durable.
func (b *Base) SetState(ctx context.Context, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("agent: marshal state: %w", err)
	}
	return b.in.setState(ctx, data, nil)
}

// Broadcast sends v as a JSON frame to every connection except exclude.
func (b *Base) Broadcast(v any, exclude ...*Conn) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("agent: marshal broadcast: %w", err)
	}
	b.in.broadcast(data, exclude...)
	return nil
}

// BroadcastRaw sends an encoded frame to every connection except exclude.
func (b *Base) BroadcastRaw(frame []byte, exclude ...*Conn) { b.in.broadcast(frame, exclude...) }

// Connections returns the instance's open connections.
func (b *Base) Connections() []*Conn { return b.in.connections() }

// KeepAlive pins the instance in memory until release is called. Use it for
// background work the runtime does not know about.
func (b *Base) KeepAlive() (release func()) {
	in := b.in
	in.pin()
	var done bool
	return func() {
		if !done {
			done = true
			in.release()
		}
	}
}

// DB returns the database shared by all instances. Framework layers use it
// with InstanceID; agent code normally uses Storage and SQL instead.
func (b *Base) DB() store.DB { return b.in.db() }

// SubAgent returns the child of class and name, creating it on first use.
// The child has its own storage and knows its parent's path; its methods
// are called directly in process.
func (b *Base) SubAgent(ctx context.Context, class, name string) (Agent, error) {
	return b.in.rt.Get(ctx, b.in.path.Child(class, name))
}

// HasSubAgent reports whether the child of class and name exists, without
// creating it.
func (b *Base) HasSubAgent(ctx context.Context, class, name string) (bool, error) {
	return b.in.rt.Exists(ctx, b.in.path.Child(class, name))
}

// DeleteSubAgent destroys the child of class and name and everything below
// it, storage included. Deleting a child that does not exist is not an error.
func (b *Base) DeleteSubAgent(ctx context.Context, class, name string) error {
	return b.in.rt.Destroy(ctx, b.in.path.Child(class, name))
}

// Destroy deletes this instance, its sub-agents and all their storage, and
// closes their connections.
func (b *Base) Destroy(ctx context.Context) error { return b.in.rt.Destroy(ctx, b.in.path) }

// SubAgent returns the typed child of parent at class (a class name or a
// ClassHandle) and name.
func SubAgent[T Agent, C ClassName](ctx context.Context, parent Agent, class C, name string) (T, error) {
	var zero T
	a, err := parent.base().SubAgent(ctx, string(class), name)
	if err != nil {
		return zero, err
	}
	t, ok := a.(T)
	if !ok {
		return zero, fmt.Errorf("agent: %s/%s is a %T, not a %T", class, name, a, zero)
	}
	return t, nil
}

// Destroy deletes the instance at path and its descendants: connections are
// closed, rows and user tables dropped, and the in-memory instances
// forgotten. Destroying an instance that does not exist is not an error.
func (rt *Runtime) Destroy(ctx context.Context, path Path) error {
	key := path.String()
	// Forget the in-memory instances of the subtree first, so no new work
	// lands on them.
	rt.forgetDestroyed(rt.residentMatching(func(p Path) bool { return p.HasPrefix(path) }))
	// In a cluster, descendants may be resident on other nodes: they are
	// listed with the rows and told to forget them once those are gone.
	forgetter, _ := rt.place.(RemoteForgetter)
	var elsewhere []Path
	err := rt.dbFor(path).Update(ctx, func(tx store.Tx) error {
		elsewhere = elsewhere[:0]
		var id int64
		err := tx.QueryRow(ctx, `SELECT id FROM instances WHERE path = ?`, key).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `WITH RECURSIVE sub(id) AS (
				SELECT id FROM instances WHERE id = ?
				UNION ALL SELECT i.id FROM instances i JOIN sub ON i.parent_id = sub.id)
			SELECT u.instance_id, i.class, u.name FROM user_tables u JOIN sub ON u.instance_id = sub.id
				JOIN instances i ON i.id = u.instance_id`, id)
		if err != nil {
			return err
		}
		type owned struct {
			owner store.Owner
			name  string
		}
		var tables []owned
		for rows.Next() {
			var o owned
			if err := rows.Scan(&o.owner.ID, &o.owner.Class, &o.name); err != nil {
				rows.Close()
				return err
			}
			tables = append(tables, o)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, o := range tables {
			if err := store.DropOwned(ctx, tx, o.owner, o.name); err != nil {
				return err
			}
		}
		if forgetter != nil {
			if elsewhere, err = rt.descendantsElsewhere(ctx, tx, id); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `DELETE FROM instances WHERE id = ?`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("agent: destroy %s: %w", key, err)
	}
	if len(elsewhere) > 0 {
		if err := forgetter.ForgetRemote(ctx, elsewhere); err != nil {
			// The rows are gone; those nodes drop the instances when they
			// lose them or evict them.
			rt.log.Warn("agent: destroy: tell other nodes to forget", "agent", key, "instances", len(elsewhere), "err", err)
		}
	}
	rt.sched.poke()
	rt.diag.Publish(ctx, diag.ChannelAgent, "destroy", key, nil)
	return nil
}

// descendantsElsewhere lists the descendants of instance id that another
// node owns (in tx, before they are deleted).
func (rt *Runtime) descendantsElsewhere(ctx context.Context, tx store.Tx, id int64) ([]Path, error) {
	rows, err := tx.Query(ctx, `WITH RECURSIVE sub(id) AS (
			SELECT id FROM instances WHERE parent_id = ?
			UNION ALL SELECT i.id FROM instances i JOIN sub ON i.parent_id = sub.id)
		SELECT i.path FROM instances i JOIN sub ON i.id = sub.id`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Path
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		if p, err := ParsePath(k); err == nil && !rt.Owns(p) {
			out = append(out, p)
		}
	}
	return out, rows.Err()
}
