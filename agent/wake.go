package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// KeepAwake records (on=true) or clears (on=false) a durable reason for the
// instance to be hydrated as soon as the runtime starts, so that unfinished
// work (a chat turn, an agent-tool run) resumes after a restart without
// waiting for a client. Each layer uses its own reason; the instance is woken
// while any reason is set.
func (b *Base) KeepAwake(ctx context.Context, reason string, on bool) error {
	err := b.in.db().Update(ctx, func(tx store.Tx) error {
		if on {
			return b.KeepAwakeTx(ctx, tx, reason)
		}
		_, err := tx.Exec(ctx, `DELETE FROM instance_wake WHERE instance_id = ? AND reason = ?`, b.in.id, reason)
		return err
	})
	if err != nil {
		return fmt.Errorf("agent: keep awake %s: %w", reason, err)
	}
	return nil
}

// KeepAwakeTx records the wake reason (see KeepAwake) in tx, a write
// transaction of the instance, so that it commits with the work it wakes
// the instance for. Clearing a reason is a DELETE of the instance's
// instance_wake row with that reason, which a layer may guard as it needs.
func (b *Base) KeepAwakeTx(ctx context.Context, tx store.Tx, reason string) error {
	_, err := tx.Exec(ctx, `INSERT INTO instance_wake (instance_id, reason, shard) VALUES (?, ?, ?)
		ON CONFLICT (instance_id, reason) DO NOTHING`, b.in.id, reason, b.in.shard)
	return err
}

// wakeShardOf is the shard stored with the wake reasons of the instance at
// path: its Sharder's shard, nil (NULL) without one.
func (rt *Runtime) wakeShardOf(path Path) any {
	if s, ok := rt.place.(Sharder); ok {
		return int64(s.ShardOf(path))
	}
	return nil
}

// wakeAll hydrates every instance that has a wake reason (and that this
// runtime owns), a few at a time. With a Sharder it reads only the reasons
// of the shards served now.
func (rt *Runtime) wakeAll(ctx context.Context) error {
	if s, ok := rt.place.(Sharder); ok {
		return rt.wakeShards(ctx, s.Owned())
	}
	return rt.wakeMatching(ctx, func(Path) bool { return true })
}

// wakeMatching hydrates every instance with a wake reason that match
// selects and this runtime owns, a few at a time. It reads every reason.
func (rt *Runtime) wakeMatching(ctx context.Context, match func(Path) bool) error {
	var keys []string
	err := rt.db.View(ctx, func(tx store.Tx) error {
		var err error
		keys, err = wakePaths(ctx, tx, `SELECT DISTINCT i.path FROM instance_wake w JOIN instances i ON i.id = w.instance_id ORDER BY i.path`)
		return err
	})
	if err != nil {
		return fmt.Errorf("agent: list instances to wake: %w", err)
	}
	rt.hydrateWoken(ctx, keys, match)
	return nil
}

// wakeShardBatch bounds the shards one query of wakeShards names.
const wakeShardBatch = 256

// wakeShards hydrates the instances with a wake reason on shards that this
// runtime owns. It reads those shards' reasons through the shard index,
// and the reasons stored without a shard (written before the column, or
// by a runtime without a Sharder), which it files under their shard for
// the next time.
func (rt *Runtime) wakeShards(ctx context.Context, shards []int) error {
	s := rt.place.(Sharder)
	if len(shards) == 0 {
		return nil
	}
	want := make(map[int]bool, len(shards))
	for _, sh := range shards {
		want[sh] = true
	}
	type unfiled struct {
		id   int64
		path string
	}
	var keys []string
	var loose []unfiled
	err := rt.db.View(ctx, func(tx store.Tx) error {
		keys, loose = keys[:0], loose[:0]
		for batch := range slices.Chunk(shards, wakeShardBatch) {
			args := make([]any, len(batch))
			for i, sh := range batch {
				args[i] = int64(sh)
			}
			ks, err := wakePaths(ctx, tx, `SELECT DISTINCT i.path FROM instance_wake w JOIN instances i ON i.id = w.instance_id
				WHERE w.shard IN (?`+strings.Repeat(", ?", len(batch)-1)+`)`, args...)
			if err != nil {
				return err
			}
			keys = append(keys, ks...)
		}
		rows, err := tx.Query(ctx, `SELECT DISTINCT w.instance_id, i.path FROM instance_wake w JOIN instances i ON i.id = w.instance_id
			WHERE w.shard IS NULL`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var u unfiled
			if err := rows.Scan(&u.id, &u.path); err != nil {
				return err
			}
			loose = append(loose, u)
		}
		return rows.Err()
	})
	if err != nil {
		return fmt.Errorf("agent: list instances to wake: %w", err)
	}
	if len(loose) > 0 {
		// File them under their shard: the shard is the path's, the same
		// on every node, so any node may write it (unfenced; an owner's
		// concurrent delete of the row just leaves nothing to update).
		err := rt.db.Update(ctx, func(tx store.Tx) error {
			for _, u := range loose {
				path, err := ParsePath(u.path)
				if err != nil {
					continue // logged by hydrateWoken if its shard is asked for
				}
				if _, err := tx.Exec(ctx, `UPDATE instance_wake SET shard = ? WHERE instance_id = ? AND shard IS NULL`,
					int64(s.ShardOf(path)), u.id); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			rt.log.Warn("wake: file wake reasons under their shard", "rows", len(loose), "err", err)
		}
		for _, u := range loose {
			if path, err := ParsePath(u.path); err != nil || want[s.ShardOf(path)] {
				keys = append(keys, u.path)
			}
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	rt.hydrateWoken(ctx, keys, func(p Path) bool { return want[s.ShardOf(p)] })
	return nil
}

// wakePaths runs a query that lists instance paths.
func wakePaths(ctx context.Context, tx store.Tx, q string, args ...any) ([]string, error) {
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// hydrateWoken hydrates the instances at keys that match selects and this
// runtime owns, a few at a time.
func (rt *Runtime) hydrateWoken(ctx context.Context, keys []string, match func(Path) bool) {
	// The instances listed exist: their hydration reads their rows first.
	ctx = context.WithValue(ctx, existsKey{}, true)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, k := range keys {
		path, err := ParsePath(k)
		if err != nil {
			rt.log.Error("wake: bad path", "path", k, "err", err)
			continue
		}
		if !match(path) || !rt.Owns(path) {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := rt.Get(ctx, path); errors.Is(err, ErrNotOwner) {
				return // moved on meanwhile: its new owner wakes it
			} else if err != nil {
				rt.log.Error("wake: hydrate", "agent", k, "err", err)
				return
			}
			rt.diag.Publish(ctx, diag.ChannelAgent, "wake", k, nil)
		}()
	}
	wg.Wait()
}

// existsKey marks a context whose Get hydrates an instance known to exist.
type existsKey struct{}
