package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentry/agentry/store"
)

// TestUndecidedFenceIsWaitedOut: a fence that cannot decide yet (its
// error wraps store.ErrUndecided, as cluster mode's for a lease past its
// local deadline that the next lease round renews or drops) does not end
// the Update: the transaction runs again, fence included, and commits once
// the fence passes. Before, the first refusal was final, and a chat turn
// whose chunks it refused was aborted although its lease was renewed a
// moment later (TestPostgresRestartDuringFanOut, a run ended aborted).
func TestUndecidedFenceIsWaitedOut(t *testing.T) {
	ctx := context.Background()
	db := outageDB(t)
	var checks atomic.Int32
	fctx := store.WithFence(ctx, func(ctx context.Context, tx store.Tx) error {
		if checks.Add(1) <= 2 {
			return fmt.Errorf("test fence: lease past its deadline: %w", store.ErrUndecided)
		}
		return nil
	})
	if err := insert(fctx, db, "undecided"); err != nil {
		t.Fatalf("Update with a fence undecided twice: %v", err)
	}
	if n := checks.Load(); n != 3 {
		t.Fatalf("fence checked %d times, want 3 (two undecided, one pass)", n)
	}
	if n := rows(t, db, "undecided"); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// TestUndecidedFenceRetryLimit: a fence that stays undecided past the
// call's retry limit fails the Update with an error that wraps
// store.ErrUnavailable and the fence's own error; nothing is committed. A
// final refusal (no ErrUndecided) is returned at once.
func TestUndecidedFenceRetryLimit(t *testing.T) {
	ctx := context.Background()
	db := outageDB(t)
	errLapsed := errors.New("test fence: lapsed")
	fctx := store.WithFence(store.WithRetryLimit(ctx, 100*time.Millisecond), func(ctx context.Context, tx store.Tx) error {
		return fmt.Errorf("%w: %w", errLapsed, store.ErrUndecided)
	})
	err := insert(fctx, db, "limited")
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, errLapsed) {
		t.Fatalf("Update with a fence undecided past the limit: %v, want store.ErrUnavailable wrapping the fence's error", err)
	}
	errFinal := errors.New("test fence: lost")
	var checks atomic.Int32
	fctx = store.WithFence(ctx, func(ctx context.Context, tx store.Tx) error {
		checks.Add(1)
		return errFinal
	})
	if err := insert(fctx, db, "refused"); !errors.Is(err, errFinal) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Update with a final refusal: %v, want the fence's error", err)
	}
	if n := checks.Load(); n != 1 {
		t.Fatalf("a final refusal checked %d times, want 1", n)
	}
	if n := rows(t, db, "limited") + rows(t, db, "refused"); n != 0 {
		t.Fatalf("%d rows of refused Updates", n)
	}
}
