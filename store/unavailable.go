package store

import (
	"context"
	"errors"
	"time"
)

// ErrUnavailable is wrapped by the error of an Update or View that could
// not reach the database: it was down, restarting or unreachable, and the
// call gave up retrying (its context ended, or its retry limit passed). No
// part of the transaction was committed. The server answers it with 503
// and Retry-After (HTTP) or a close with 1013 (WebSocket).
var ErrUnavailable = errors.New("store: database unavailable")

type retryLimitKey struct{}

// WithRetryLimit returns a context whose Update and View calls give up
// after d of a database outage, with an error that wraps ErrUnavailable.
// Without it an implementation that retries (store/postgres) retries until
// the context ends or its own ceiling passes: work on a run's path waits
// for the database, while a client's request (the server sets a limit)
// gets an answer it can retry.
func WithRetryLimit(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, retryLimitKey{}, d)
}

// RetryLimitOf returns the retry limit ctx carries (WithRetryLimit).
func RetryLimitOf(ctx context.Context) (time.Duration, bool) {
	d, ok := ctx.Value(retryLimitKey{}).(time.Duration)
	return d, ok
}
