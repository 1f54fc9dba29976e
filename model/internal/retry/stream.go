package retry

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/agentry/agentry/model"
)

// ErrStopped is returned by a streaming attempt when the consumer broke out
// of the loop; Stream does not report it.
var ErrStopped = errors.New("consumer stopped")

// Stream turns a provider's streaming attempt into a model stream: attempt
// is retried under p while it has emitted nothing, and a final error is
// yielded prefixed with the provider's name.
func (p Policy) Stream(ctx context.Context, provider string, classify Classifier,
	attempt func(ctx context.Context, emit func(model.Event) bool) (progressed bool, err error)) iter.Seq2[model.Event, error] {
	return func(yield func(model.Event, error) bool) {
		emit := func(ev model.Event) bool { return yield(ev, nil) }
		err := p.Do(ctx, classify, func(ctx context.Context) (bool, error) { return attempt(ctx, emit) })
		if err != nil && !errors.Is(err, ErrStopped) {
			yield(model.Event{}, fmt.Errorf("%s: stream: %w", provider, err))
		}
	}
}

// Failed returns a stream that yields err alone.
func Failed(err error) iter.Seq2[model.Event, error] {
	return func(yield func(model.Event, error) bool) { yield(model.Event{}, err) }
}
