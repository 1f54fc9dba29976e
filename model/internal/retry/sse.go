package retry

import (
	"context"
	"iter"
	"net/http"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/model"
)

// Events is the event stream an SDK returns for a streaming request (both
// SDKs' ssestream.Stream).
type Events[T any] interface {
	Next() bool
	Current() T
	Err() error
	Close() error
}

// Decoder turns one attempt's SDK events into model events. A new one is
// made for each attempt.
type Decoder[T any] interface {
	// Event handles one SDK event, passing what it yields to send; it
	// returns false when send did (the consumer stopped). done reports a
	// complete stream: later events are not read.
	Event(ev T, send func(model.Event) bool) (ok, done bool)
	// End is called when the SDK's stream ended without an error and
	// without Event reporting done. It returns false when send did, or an
	// error for a stream that ended too early.
	End(send func(model.Event) bool) (bool, error)
}

// SSE streams a provider's request under p: open starts one attempt's SDK
// stream, newDecoder makes its decoder, and an attempt that failed before
// emitting anything is retried as Stream does.
func SSE[T any](ctx context.Context, p Policy, provider string, classify Classifier,
	open func(ctx context.Context) Events[T], newDecoder func() Decoder[T]) iter.Seq2[model.Event, error] {
	return p.Stream(ctx, provider, classify, func(ctx context.Context, emit func(model.Event) bool) (bool, error) {
		return attemptSSE(ctx, open, newDecoder(), emit)
	})
}

// attemptSSE runs one streaming request, passing events to emit. It
// reports whether any event was emitted.
func attemptSSE[T any](ctx context.Context, open func(ctx context.Context) Events[T], dec Decoder[T], emit func(model.Event) bool) (progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := open(ctx)
	defer stream.Close()
	send := func(ev model.Event) bool {
		progressed = true
		return emit(ev)
	}
	for stream.Next() {
		ok, done := dec.Event(stream.Current(), send)
		if !ok {
			return true, ErrStopped
		}
		if done {
			return true, nil
		}
	}
	if err := stream.Err(); err != nil {
		return progressed, err
	}
	ok, err := dec.End(send)
	if err != nil {
		return progressed, err
	}
	if !ok {
		return true, ErrStopped
	}
	return true, nil
}

// Client holds the settings both providers hand to their SDK client.
type Client struct {
	BaseURL    string
	APIKey     string
	HTTPClient *http.Client
}

// Options returns the SDK request options for c, made with the SDK's own
// constructors. The SDK's retries are always off (noRetries), so that the
// Policy is the only one in force.
func Options[O any](c Client, noRetries O, baseURL, apiKey func(string) O, httpClient func(*http.Client) O) []O {
	opts := []O{noRetries}
	if c.BaseURL != "" {
		opts = append(opts, baseURL(c.BaseURL))
	}
	if c.APIKey != "" {
		opts = append(opts, apiKey(c.APIKey))
	}
	if c.HTTPClient != nil {
		opts = append(opts, httpClient(c.HTTPClient))
	}
	return opts
}

// RealClock returns c, or the real clock when c is nil.
func RealClock(c clockwork.Clock) clockwork.Clock {
	if c == nil {
		return clockwork.NewRealClock()
	}
	return c
}
