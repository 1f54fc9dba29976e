package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDelay(t *testing.T) {
	var p Policy
	for n, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		if got := p.Delay(n, 0); got != want {
			t.Errorf("Delay(%d) = %v, want %v", n, got, want)
		}
	}
	if got := p.Delay(0, 3*time.Second); got != 3*time.Second {
		t.Errorf("Delay with Retry-After 3s = %v", got)
	}
	if got := p.Delay(0, time.Hour); got != DefaultMaxRetryAfter {
		t.Errorf("Delay with Retry-After 1h = %v, want the cap", got)
	}
	p = Policy{BaseDelay: time.Second, MaxDelay: 3 * time.Second, MaxRetryAfter: 10 * time.Second}
	if got := p.Delay(5, 0); got != 3*time.Second {
		t.Errorf("capped Delay = %v", got)
	}
	if got := p.Delay(0, time.Minute); got != 10*time.Second {
		t.Errorf("capped Retry-After = %v", got)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		h    http.Header
		want time.Duration
	}{
		{nil, 0},
		{http.Header{"Retry-After": {"3"}}, 3 * time.Second},
		{http.Header{"Retry-After": {"1.5"}}, 1500 * time.Millisecond},
		{http.Header{"Retry-After-Ms": {"250"}, "Retry-After": {"3"}}, 250 * time.Millisecond},
		{http.Header{"Retry-After": {now.Add(7 * time.Second).Format(http.TimeFormat)}}, 7 * time.Second},
		{http.Header{"Retry-After": {now.Add(-time.Second).Format(http.TimeFormat)}}, 0},
		{http.Header{"Retry-After": {"-1"}}, 0},
		{http.Header{"Retry-After": {"soon"}}, 0},
	} {
		if got := RetryAfter(tc.h, now); got != tc.want {
			t.Errorf("RetryAfter(%v) = %v, want %v", tc.h, got, tc.want)
		}
	}
}

func TestTransientStatus(t *testing.T) {
	for code, want := range map[int]bool{200: false, 400: false, 401: false, 404: false, 408: true, 429: true, 500: true, 503: true, 529: true} {
		if got := TransientStatus(code); got != want {
			t.Errorf("TransientStatus(%d) = %v", code, got)
		}
	}
}

func TestIsConnError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("bad"), false},
		{context.Canceled, false},
		{&url.Error{Op: "Post", URL: "http://x", Err: context.DeadlineExceeded}, false},
		{&url.Error{Op: "Post", URL: "http://x", Err: io.EOF}, true},
		{fmt.Errorf("read body: %w", io.ErrUnexpectedEOF), true},
	} {
		if got := IsConnError(tc.err); got != tc.want {
			t.Errorf("IsConnError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

var errTransient = errors.New("transient")

func classify(err error) (bool, time.Duration) { return errors.Is(err, errTransient), 0 }

func TestDoRetriesTransientThenSucceeds(t *testing.T) {
	clock := clockwork.NewFakeClock()
	p := Policy{Clock: clock}
	attempts := 0
	done := make(chan error, 1)
	go func() {
		done <- p.Do(t.Context(), classify, func(context.Context) (bool, error) {
			attempts++
			if attempts < 3 {
				return false, errTransient
			}
			return true, nil
		})
	}()
	for _, d := range []time.Duration{500 * time.Millisecond, time.Second} {
		if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(d)
	}
	if err := <-done; err != nil || attempts != 3 {
		t.Errorf("err %v after %d attempts", err, attempts)
	}
}

func TestDoStops(t *testing.T) {
	permanent := errors.New("permanent")
	for _, tc := range []struct {
		name     string
		policy   Policy
		progress bool
		err      error
		want     int
	}{
		{"permanent error", Policy{}, false, permanent, 1},
		{"after progress", Policy{}, true, errTransient, 1},
		{"retries disabled", Policy{MaxRetries: -1}, false, errTransient, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attempts := 0
			err := tc.policy.Do(t.Context(), classify, func(context.Context) (bool, error) {
				attempts++
				return tc.progress, tc.err
			})
			if !errors.Is(err, tc.err) || attempts != tc.want {
				t.Errorf("err %v after %d attempts, want %v after %d", err, attempts, tc.err, tc.want)
			}
		})
	}
}

func TestDoCanceledWhileWaiting(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Policy{Clock: clock}.Do(ctx, classify, func(context.Context) (bool, error) { return false, errTransient })
	}()
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
}
