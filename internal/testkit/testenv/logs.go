package testenv

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// Logs collects a runtime's log records as text, for tests that check what
// was logged (the details behind an error a client saw as an id).
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// Logger returns a logger that writes every record, debug included, to l.
func (l *Logs) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// String returns everything logged so far.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

var internalErrorText = regexp.MustCompile(`^internal error \(id ([0-9a-f]{8})\)$`)

// InternalError checks that text, as a client saw it, is exactly
// "internal error (id X)", and that the record logged with errorId=X holds
// every string in details. It returns the id.
func (l *Logs) InternalError(t testing.TB, text string, details ...string) string {
	t.Helper()
	m := internalErrorText.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("client saw %q, want \"internal error (id …)\"", text)
	}
	for _, line := range strings.Split(l.String(), "\n") {
		if !strings.Contains(line, "errorId="+m[1]) {
			continue
		}
		for _, d := range details {
			if !strings.Contains(line, d) {
				t.Errorf("log record of error %s lacks %q: %s", m[1], d, line)
			}
		}
		return m[1]
	}
	t.Fatalf("no log record with errorId=%s in:\n%s", m[1], l.String())
	return ""
}
