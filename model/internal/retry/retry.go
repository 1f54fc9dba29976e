// Package retry holds what the model providers share: the retry policy
// (which provider failures are transient, how long to wait before the next
// attempt — exponential backoff, or the server's Retry-After within a cap —
// and a loop that waits on an injectable clock so tests never sleep for
// real), the streaming driver that runs an SDK's server-sent event stream
// through a provider's decoder under that policy (SSE), and the SDK client
// options both providers build (Options).
package retry

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"
)

// Defaults used for zero fields of a Policy.
const (
	DefaultMaxRetries    = 2
	DefaultBaseDelay     = 500 * time.Millisecond
	DefaultMaxDelay      = 8 * time.Second
	DefaultMaxRetryAfter = 60 * time.Second
)

// Policy says how often and how long to wait before retrying a failed
// attempt. The zero value is usable: it retries twice with the default
// delays on the real clock.
type Policy struct {
	// MaxRetries is the number of attempts after the first. Zero means
	// DefaultMaxRetries; a negative value disables retries.
	MaxRetries int
	// BaseDelay is the wait before the first retry; each further retry waits
	// twice as long as the one before, up to MaxDelay.
	BaseDelay time.Duration
	// MaxDelay caps the exponential backoff.
	MaxDelay time.Duration
	// MaxRetryAfter caps a server-requested Retry-After wait.
	MaxRetryAfter time.Duration
	// Clock measures the waits; nil means the real clock.
	Clock clockwork.Clock
}

// Classifier reports whether err is transient and, if the provider asked for
// one, how long to wait before retrying (zero when it did not say).
type Classifier func(err error) (transient bool, retryAfter time.Duration)

// Attempt runs one try. It reports whether it has already handed results to
// the caller; an error after that point is never retried.
type Attempt func(ctx context.Context) (progressed bool, err error)

// Do runs attempt until it succeeds, fails with an error that classify does
// not call transient, fails after making progress, or runs out of retries.
// It returns the last attempt's error, or ctx's error if ctx ends while
// waiting between attempts.
func (p Policy) Do(ctx context.Context, classify Classifier, attempt Attempt) error {
	for n := 0; ; n++ {
		progressed, err := attempt(ctx)
		if err == nil || progressed || n >= p.maxRetries() || ctx.Err() != nil {
			return err
		}
		transient, after := classify(err)
		if !transient {
			return err
		}
		if werr := p.wait(ctx, p.Delay(n, after)); werr != nil {
			return werr
		}
	}
}

// Delay returns how long to wait before retry number n (counting from zero):
// retryAfter capped at MaxRetryAfter when it is positive, else the
// exponential backoff BaseDelay·2ⁿ capped at MaxDelay.
func (p Policy) Delay(n int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return min(retryAfter, orDefault(p.MaxRetryAfter, DefaultMaxRetryAfter))
	}
	maxDelay := orDefault(p.MaxDelay, DefaultMaxDelay)
	d := orDefault(p.BaseDelay, DefaultBaseDelay)
	for i := 0; i < n && d < maxDelay; i++ {
		d *= 2
	}
	return min(d, maxDelay)
}

func (p Policy) maxRetries() int {
	switch {
	case p.MaxRetries < 0:
		return 0
	case p.MaxRetries == 0:
		return DefaultMaxRetries
	}
	return p.MaxRetries
}

func (p Policy) clock() clockwork.Clock {
	if p.Clock == nil {
		return clockwork.NewRealClock()
	}
	return p.Clock
}

// wait blocks for d on the policy's clock, or until ctx ends.
func (p Policy) wait(ctx context.Context, d time.Duration) error {
	t := p.clock().NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.Chan():
		return nil
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// TransientStatus reports whether an HTTP status is worth retrying: request
// timeout, too many requests, and every server error.
func TransientStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}

// IsConnError reports whether err is a failure to reach the server or to
// read its answer: a transport error, a network error, or a connection cut
// short. Context cancellation and deadlines are never connection errors.
func IsConnError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var uerr *url.Error
	var nerr net.Error
	return errors.As(err, &uerr) ||
		errors.As(err, &nerr) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE)
}

// RetryAfter reads the wait a server asked for from h: Retry-After-Ms in
// milliseconds, else Retry-After in seconds or as an HTTP date relative to
// now. It returns zero when h asks for nothing usable.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	if v := h.Get("Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s > 0 && s < 1e9 {
			return time.Duration(s * float64(time.Second))
		}
		return 0
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}
