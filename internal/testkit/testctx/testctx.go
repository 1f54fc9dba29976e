// Package testctx gives a test a context bounded by a deadline and
// cancelled when the test ends: the one bound of every wait of a test
// package, shared instead of each package writing it again.
package testctx

import (
	"context"
	"testing"
	"time"
)

// Within returns a context that ends after limit, or when t's test has
// finished and its cleanups run, whichever comes first. The limit is a
// deadline for a broken test, never a way to let time pass. The context
// does not derive from t.Context, so cleanups registered before it can
// still use it.
func Within(t testing.TB, limit time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return ctx
}
