package agent

import (
	"context"
	"errors"
	"fmt"
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
		var err error
		if on {
			_, err = tx.Exec(ctx, `INSERT INTO instance_wake (instance_id, reason) VALUES (?, ?)
				ON CONFLICT (instance_id, reason) DO NOTHING`, b.in.id, reason)
		} else {
			_, err = tx.Exec(ctx, `DELETE FROM instance_wake WHERE instance_id = ? AND reason = ?`, b.in.id, reason)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("agent: keep awake %s: %w", reason, err)
	}
	return nil
}

// wakeAll hydrates every instance that has a wake reason (and that this
// runtime owns), a few at a time.
func (rt *Runtime) wakeAll(ctx context.Context) error {
	return rt.wakeMatching(ctx, func(Path) bool { return true })
}

// wakeMatching hydrates every instance with a wake reason that match
// selects and this runtime owns, a few at a time.
func (rt *Runtime) wakeMatching(ctx context.Context, match func(Path) bool) error {
	var keys []string
	err := rt.db.View(ctx, func(tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT DISTINCT i.path FROM instance_wake w JOIN instances i ON i.id = w.instance_id ORDER BY i.path`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				return err
			}
			keys = append(keys, k)
		}
		return rows.Err()
	})
	if err != nil {
		return fmt.Errorf("agent: list instances to wake: %w", err)
	}
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
	return nil
}

// existsKey marks a context whose Get hydrates an instance known to exist.
type existsKey struct{}
