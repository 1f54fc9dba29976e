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

// ErrUndecided is wrapped by the error of a fence (or callback) whose
// check cannot be decided yet and may pass a moment later: in cluster
// mode, the lease of the instance's shard is past its node's local
// deadline and the node's next lease round will either renew it (the
// write may go on) or drop it (refused for good). store/postgres treats
// such an attempt as one that could not reach the database: it rolls the
// transaction back and runs it again after a pause, fences included,
// within the call's retry limit (a call that gives up wraps
// ErrUnavailable as well). Refusing it at once would make a transient
// state final: a chat turn whose chunks were refused is aborted, and its
// end then commits under the lease renewed a moment later.
var ErrUndecided = errors.New("store: fence undecided, try again")
