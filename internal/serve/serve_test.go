package serve_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/internal/serve"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait on a channel; it is a deadline for a broken
// test, never a way to let time pass.
const waitLimit = 10 * time.Second

// kit gates the start-up of the Slow instance "busy" (the one that an
// earlier process left with a wake reason, as unfinished work does): its
// hydration tells entered and waits for release.
type kit struct {
	entered  chan string
	release  chan struct{}
	released atomic.Bool
}

// slow is an agent whose recovery (its OnStart after a restart) blocks.
type slow struct {
	agent.Base
	k *kit
}

func (s *slow) OnStart(ctx context.Context) error {
	if s.k.release == nil || s.Name() != "busy" {
		return nil
	}
	s.k.entered <- s.Name()
	select {
	case <-s.k.release:
		return nil
	case <-time.After(waitLimit):
		return errors.New("never released")
	}
}

func (s *slow) OnRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	if s.Name() == "busy" && s.k.release != nil && !s.k.released.Load() {
		http.Error(w, "answered before the recovery ended", http.StatusInternalServerError)
		return
	}
	io.WriteString(w, "hello from "+s.Name())
}

func newRuntime(t *testing.T, db *sqlite.DB, k *kit) *agent.Runtime {
	t.Helper()
	rt, err := agent.New(context.Background(), agent.Options{DB: db, IdleTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Register(agent.Class{Name: "Slow", New: func() agent.Agent { return &slow{k: k} }, Public: true}); err != nil {
		t.Fatal(err)
	}
	return rt
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return 0, ""
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestPortAnswersDuringRecovery: the port serves while the runtime's
// start-up is blocked in the recovery of an instance with unfinished work;
// a request to another instance is answered, and a request to the
// recovering instance waits for its recovery and then succeeds.
func TestPortAnswersDuringRecovery(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentry.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	// An earlier process left Slow "busy" with a wake reason.
	k0 := &kit{}
	rt0 := newRuntime(t, db, k0)
	if err := rt0.Start(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := rt0.Get(ctx, agent.Root("Slow", "busy"))
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.BaseOf(a).KeepAwake(ctx, "test", true); err != nil {
		t.Fatal(err)
	}
	rt0.Close()

	k := &kit{entered: make(chan string, 1), release: make(chan struct{})}
	rt := newRuntime(t, db, k)
	srv := server.New(server.Options{Runtime: rt})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String() + "/agents/slow/"
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- serve.Run(runCtx, serve.Config{Listener: ln, Handler: srv, Runtime: rt}) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		srv.Close()
		rt.Close()
	}()

	select {
	case name := <-k.entered:
		if name != "busy" {
			t.Fatalf("recovering %q, want busy", name)
		}
	case <-time.After(waitLimit):
		t.Fatal("the start-up never recovered busy")
	}
	// fetch gets the instance name in the background; answered waits for
	// its answer, which must be "hello from NAME".
	fetch := func(name string) <-chan string {
		ch := make(chan string, 1)
		go func() {
			code, body := get(t, base+name)
			if code != http.StatusOK {
				body = "status " + http.StatusText(code) + ": " + body
			}
			ch <- body
		}()
		return ch
	}
	answered := func(name string, ch <-chan string, never string) {
		t.Helper()
		select {
		case body := <-ch:
			if body != "hello from "+name {
				t.Fatalf("%s answered %q", name, body)
			}
		case <-time.After(waitLimit):
			t.Fatal(never)
		}
	}
	// The recovery is blocked: another instance answers.
	other := fetch("idle")
	// A request to the recovering instance waits for it.
	busy := fetch("busy")
	answered("idle", other, "the port did not answer while the recovery was blocked")
	k.released.Store(true)
	close(k.release)
	answered("busy", busy, "the request to the recovering instance never ended")
}
