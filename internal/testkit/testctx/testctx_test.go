package testctx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentry/agentry/internal/testkit/testctx"
)

// TestWithinBoundedAndCancelled: the context carries the deadline it was
// given and is cancelled by the test's cleanup.
func TestWithinBoundedAndCancelled(t *testing.T) {
	var ctx context.Context
	t.Run("inner", func(t *testing.T) {
		before := time.Now()
		ctx = testctx.Within(t, time.Hour)
		deadline, ok := ctx.Deadline()
		if !ok || deadline.Before(before.Add(time.Hour)) || deadline.After(time.Now().Add(time.Hour)) {
			t.Fatalf("deadline %v (set %v), want an hour from now", deadline, ok)
		}
		if err := ctx.Err(); err != nil {
			t.Fatalf("context ended during its test: %v", err)
		}
	})
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("after the test: %v, want context.Canceled", err)
	}
}
