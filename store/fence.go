package store

import "context"

// A Fence is a check that runs inside a write transaction after its
// callback returned nil and before the transaction commits. An error from
// it rolls the transaction back and is what Update returns. Cluster mode
// uses it to refuse the writes of a node that lost the lease of an
// instance's shard: the fence reads the lease with SELECT … FOR SHARE, so
// a lease cannot change hands between the check and the commit.
type Fence func(ctx context.Context, tx Tx) error

type fenceKey struct{}

// WithFence returns a context whose Update transactions run f before they
// commit, after the fences ctx already carries. Every implementation of DB
// honours it (store/sqlite runs it inside the transaction's savepoint, so
// a refused transaction does not undo the others of its batch).
func WithFence(ctx context.Context, f Fence) context.Context {
	if prev := FenceOf(ctx); prev != nil {
		next := f
		f = func(ctx context.Context, tx Tx) error {
			if err := prev(ctx, tx); err != nil {
				return err
			}
			return next(ctx, tx)
		}
	}
	return context.WithValue(ctx, fenceKey{}, f)
}

// FenceOf returns the fence ctx carries, or nil.
func FenceOf(ctx context.Context) Fence {
	f, _ := ctx.Value(fenceKey{}).(Fence)
	return f
}

// Fenced wraps fn so that the fence of ctx (if any) runs after fn returned
// nil, in the same transaction. Implementations of DB call it in Update.
func Fenced(ctx context.Context, fn func(Tx) error) func(Tx) error {
	f := FenceOf(ctx)
	if f == nil {
		return fn
	}
	return func(tx Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		return f(ctx, tx)
	}
}
