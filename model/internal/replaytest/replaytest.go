// Package replaytest is an HTTP server for provider tests: it answers each
// request with the next scripted response (typically a recorded SSE stream
// from testdata) and keeps the requests it received so tests can assert what
// the provider sent. It also has the helpers the provider tests share to
// drain and read model streams.
package replaytest

import (
	"context"
	"io"
	"iter"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/agentry/agentry/model"
)

// Response is one scripted answer.
type Response struct {
	// Status is the HTTP status; zero means 200.
	Status int
	// Header holds response headers.
	Header http.Header
	// Body is written as is.
	Body string
	// Hangup closes the connection without answering, as a dropped
	// connection does.
	Hangup bool
}

// Request is one request the server received.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// Server answers requests with scripted responses, in order. A request past
// the end of the script gets a 599 status.
type Server struct {
	*httptest.Server

	mu        sync.Mutex
	responses []Response
	requests  []Request
}

// New starts a Server on 127.0.0.1 that answers with responses in order. It
// is closed when the test ends.
func New(t testing.TB, responses ...Response) *Server {
	t.Helper()
	s := &Server{responses: responses}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := len(s.requests)
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	var resp Response
	if n < len(s.responses) {
		resp = s.responses[n]
	} else {
		resp = Response{Status: 599, Body: "replaytest: unexpected request"}
	}
	s.mu.Unlock()

	if resp.Hangup {
		panic(http.ErrAbortHandler)
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	if resp.Status == 0 {
		resp.Status = http.StatusOK
	}
	w.WriteHeader(resp.Status)
	_, _ = io.WriteString(w, resp.Body)
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// SSE returns a 200 response streaming the server-sent events in the file
// at path.
func SSE(t testing.TB, path string) Response {
	t.Helper()
	return Response{
		Header: http.Header{"Content-Type": {"text/event-stream"}, "Cache-Control": {"no-cache"}},
		Body:   read(t, path),
	}
}

// JSON returns a response with the given status and header whose body is
// the JSON in the file at path.
func JSON(t testing.TB, status int, header http.Header, path string) Response {
	t.Helper()
	h := http.Header{"Content-Type": {"application/json"}}
	for k, vs := range header {
		h[k] = vs
	}
	return Response{Status: status, Header: h, Body: read(t, path)}
}

func read(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("replaytest: %v", err)
	}
	return string(b)
}

// Collect drains a model stream: the events up to the first error, and
// that error.
func Collect(seq iter.Seq2[model.Event, error]) ([]model.Event, error) {
	var evs []model.Event
	for ev, err := range seq {
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// Result is what CollectAsync delivers.
type Result struct {
	Events []model.Event
	Err    error
}

// CollectAsync drains m's stream for req on another goroutine.
func CollectAsync(ctx context.Context, m model.Model, req *model.Request) <-chan Result {
	done := make(chan Result, 1)
	go func() {
		evs, err := Collect(m.Stream(ctx, req))
		done <- Result{evs, err}
	}()
	return done
}

// Text concatenates the text deltas of evs.
func Text(evs []model.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Kind == model.EventTextDelta {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

// UserRequest is a request of one user message with text.
func UserRequest(text string) *model.Request {
	return &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: []model.Content{model.Text(text)}}}}
}
