package store

import "context"

type urgentKey struct{}

// WithUrgent marks the Update calls made with the returned context as on a
// path a person waits on (a chat request's acceptance, a turn's first
// frame), ahead of background writes (the chunks of streams that are
// already flowing). An engine whose writes queue for one writer
// (store/sqlite) gives an urgent transaction the writer before the
// background ones queued earlier; one without such a queue ignores the
// mark. It changes no guarantee: the Update still returns after its
// COMMIT, and the order of two Updates matters only where one call returns
// before the other starts, which a queue's order cannot change.
func WithUrgent(ctx context.Context) context.Context {
	if IsUrgent(ctx) {
		return ctx
	}
	return context.WithValue(ctx, urgentKey{}, true)
}

// IsUrgent reports whether ctx carries WithUrgent's mark.
func IsUrgent(ctx context.Context) bool {
	u, _ := ctx.Value(urgentKey{}).(bool)
	return u
}
