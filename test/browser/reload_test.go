package browser

import (
	"context"
	"iter"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentry/agentry/diag"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/internal/testkit/browsertest"
	"github.com/agentry/agentry/model"
)

// gatedModel streams its first sentence at once and its last one when
// gate closes.
type gatedModel struct{ gate <-chan struct{} }

const (
	gatedFirst = "Working on it. "
	gatedLast  = "The final answer is 42."
)

func (m gatedModel) Stream(ctx context.Context, req *model.Request) iter.Seq2[model.Event, error] {
	return func(yield func(model.Event, error) bool) {
		if !yield(model.Event{Kind: model.EventTextDelta, Text: gatedFirst}, nil) {
			return
		}
		select {
		case <-m.gate:
		case <-ctx.Done():
			yield(model.Event{}, ctx.Err())
			return
		}
		if !yield(model.Event{Kind: model.EventTextDelta, Text: gatedLast}, nil) {
			return
		}
		yield(model.Event{Kind: model.EventFinish, FinishReason: model.FinishStop}, nil)
	}
}

// TestPlaygroundReloadAsTurnEnds runs reload.mjs: a reload while a turn
// streams, where the turn ends after the page has fetched its history
// (get-messages) and before the chat has mounted on the new socket. The
// chat mounts behind a Suspense boundary that waits for get-messages, so
// every frame the socket carries before then, the transcript on connect
// and the one at the turn's end included, reaches no chat listener; the
// page must still show the answer. The server holds the reloaded page's
// get-messages response (taken before the turn ends) until the new socket
// is connected and the turn has ended, so the order is the same every run.
func TestPlaygroundReloadAsTurnEnds(t *testing.T) {
	browsertest.Require(t)
	const name = "reload"
	gate := make(chan struct{})
	offline := agentsastools.Offline(5*time.Millisecond, nil)
	models := &agentsastools.Models{Assistant: gatedModel{gate}, Researcher: offline.Researcher, Planner: offline.Planner}

	var stale atomic.Value // the held response's body, for the failure message
	wrap := func(d *demo.Demo, next http.Handler) http.Handler {
		connects := make(chan struct{}, 8)
		turns := make(chan struct{}, 8)
		key := "Assistant/" + name
		// A subscriber runs inside Publish: it never blocks the runtime
		// (the test needs two connects and one turn).
		signal := func(c chan<- struct{}) {
			select {
			case c <- struct{}{}:
			default:
			}
		}
		offConnect := d.Runtime.Diag().Subscribe(diag.ChannelAgent, func(e diag.Event) {
			if e.Type == "connect" && e.Agent == key {
				signal(connects)
			}
		})
		offTurn := d.Runtime.Diag().Subscribe(diag.ChannelChat, func(e diag.Event) {
			if e.Type == "turn" && e.Agent == key {
				signal(turns)
			}
		})
		t.Cleanup(func() { offConnect(); offTurn() })
		var histories atomic.Int32
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasSuffix(r.URL.Path, "/"+name+"/get-messages") || histories.Add(1) != 2 {
				next.ServeHTTP(w, r)
				return
			}
			// The reloaded page's history, taken mid-turn.
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			stale.Store(rec.Body.String())
			if strings.Contains(rec.Body.String(), gatedLast) {
				t.Errorf("the held history already holds the answer: %s", rec.Body)
			}
			wait := func(what string, c <-chan struct{}) bool {
				select {
				case <-c:
					return true
				case <-r.Context().Done():
				case <-time.After(time.Minute):
				}
				t.Errorf("gave up waiting for %s", what)
				return false
			}
			// The first page's socket and the reloaded one's.
			if !wait("the first socket", connects) || !wait("the reloaded socket", connects) {
				return
			}
			close(gate)
			if !wait("the turn's end", turns) {
				return
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
		})
	}
	base := serveDemoWrapped(t, demo.Options{Models: models}, wrap)
	out, err := runNode(t, 2*time.Minute, "reload.mjs", base, name, t.TempDir())
	if err != nil || !strings.Contains(out, "PASS reload") {
		t.Fatalf("reload.mjs: %v (held history %v)\n%s", err, stale.Load(), out)
	}
	t.Logf("reload.mjs:\n%s", out)
}
