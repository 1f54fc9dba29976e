package demo_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start serves the demo on 127.0.0.1 and returns it with its base URL.
func start(t *testing.T, o demo.Options) (*demo.Demo, string) {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentry.db"))
	if err != nil {
		t.Fatal(err)
	}
	o.DB = db
	o.IdleTimeout = -1
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Models = agentsastools.Offline(time.Millisecond, nil)
	d, err := demo.Start(ctx, o)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	hs := httptest.NewServer(d.Handler())
	t.Cleanup(func() {
		d.Agents.Close()
		hs.Close()
		d.Close()
		db.Close()
	})
	return d, hs.URL
}

// upgrade attempts a WebSocket upgrade of path with an optional Origin and
// returns the HTTP status (101 when it was accepted).
func upgrade(t *testing.T, base, path, origin string) int {
	t.Helper()
	h := http.Header{}
	if origin != "" {
		h.Set("Origin", origin)
	}
	return testenv.UpgradeStatus(t, 10*time.Second, "ws"+strings.TrimPrefix(base, "http")+path, h)
}

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The demo's child-only classes (Researcher, Planner) have no
// client-reachable root instances: HTTP and WebSocket get 404 and nothing
// is created. The Assistant, Counter and EchoChat are public.
func TestChildOnlyClassesAreNotRoots(t *testing.T) {
	d, base := start(t, demo.Options{})
	for _, class := range []string{"Researcher", "Planner"} {
		route := "/agents/" + agent.Kebab(class) + "/x"
		if got := upgrade(t, base, route, ""); got != http.StatusNotFound {
			t.Errorf("WebSocket to root %s = %d, want 404", class, got)
		}
		for _, p := range []string{route, route + "/get-messages"} {
			if got := get(t, base+p); got != http.StatusNotFound {
				t.Errorf("GET %s = %d, want 404", p, got)
			}
		}
		if ok, err := d.Runtime.Exists(context.Background(), agent.Root(class, "x")); err != nil || ok {
			t.Errorf("a refused request created %s/x (%v)", class, err)
		}
	}
	for _, route := range []string{"assistant", "counter", "echo-chat"} {
		if got := upgrade(t, base, "/agents/"+route+"/x", ""); got != http.StatusSwitchingProtocols {
			t.Errorf("WebSocket to public %s = %d, want 101", route, got)
		}
	}
	// As a sub-agent, a Researcher is reached only through the
	// Assistant's gate, which admits runs it knows.
	if got := get(t, base+"/agents/assistant/x/sub/researcher/unknown-run/get-messages"); got != http.StatusNotFound {
		t.Errorf("drill-in to an unknown run = %d, want 404", got)
	}
}

// A page of another origin cannot open a WebSocket to the demo unless
// --allow-origin names it; the playground's own origin and clients that
// send no Origin always can.
func TestDemoOrigins(t *testing.T) {
	_, base := start(t, demo.Options{})
	route := "/agents/counter/o"
	for origin, want := range map[string]int{
		"":                    http.StatusSwitchingProtocols,
		base:                  http.StatusSwitchingProtocols,
		"http://evil.example": http.StatusForbidden,
	} {
		if got := upgrade(t, base, route, origin); got != want {
			t.Errorf("Origin %q: %d, want %d", origin, got, want)
		}
	}
	_, base2 := start(t, demo.Options{OriginPatterns: []string{"app.example"}})
	if got := upgrade(t, base2, route, "https://app.example"); got != http.StatusSwitchingProtocols {
		t.Errorf("allowed origin: %d, want 101", got)
	}
	if got := upgrade(t, base2, route, "https://evil.example"); got != http.StatusForbidden {
		t.Errorf("other origin with patterns: %d, want 403", got)
	}
}
