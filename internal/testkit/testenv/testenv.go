// Package testenv starts real Agentry servers for tests: a SQLite file in a
// temporary folder, a runtime, and the HTTP/WebSocket server listening on
// 127.0.0.1. It also runs the npm client scripts in test/npm.
package testenv

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/internal/testkit/teststore"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store"
)

// Options configure Start.
type Options struct {
	// Classes to register.
	Classes []agent.Class
	// Clock for the runtime; nil means the real clock.
	Clock clockwork.Clock
	// IdleTimeout for the runtime; zero means eviction is disabled.
	IdleTimeout time.Duration
	// MaxCallsPerConn and MaxInstances for the runtime; zero means the
	// runtime's defaults.
	MaxCallsPerConn int
	MaxInstances    int
	// Dir is the data folder; "" means a new temporary folder.
	Dir string
	// Server options (Runtime is filled in).
	Server server.Options
	// Logger receives the runtime's logs; nil means slog.Default().
	Logger *slog.Logger
	// Middleware, when set, wraps the server's handler (an application's
	// own auth middleware, for example).
	Middleware func(http.Handler) http.Handler
	// Setup runs after the runtime is created and before it starts, to
	// register classes that need the runtime.
	Setup func(rt *agent.Runtime) error
	// TracerProvider and MeterProvider for the runtime; nil means the
	// global (no-op) ones.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// Postgres, when set and AGENTRY_TEST_STORE=postgres, puts the data on
	// a database of this scratch cluster, named by Dir, instead of SQLite
	// (see internal/testkit/teststore).
	Postgres *pgtest.Cluster
	// Placement, when set, makes the runtime one node of a pretend
	// cluster (agent.Options.Placement): two Envs with the same Dir on
	// PostgreSQL share one database, as nodes do.
	Placement agent.Placement
	// WrapDB, when set, wraps the database the runtime uses (to count or
	// watch its transactions); Env.DB stays the database itself.
	WrapDB func(store.DB) store.DB
}

// Env is a running server.
type Env struct {
	Dir    string
	DB     store.DB
	RT     *agent.Runtime
	Server *server.Server
	HTTP   *httptest.Server
	// Host is "127.0.0.1:port", as the npm clients take it.
	Host string
}

// Start starts a server and registers its shutdown with t.Cleanup.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	ctx := context.Background()
	dir := opts.Dir
	if dir == "" {
		dir = t.TempDir()
	}
	db := teststore.Open(t, opts.Postgres, dir)
	idle := opts.IdleTimeout
	if idle == 0 {
		idle = -1
	}
	var rtDB store.DB = db
	if opts.WrapDB != nil {
		rtDB = opts.WrapDB(db)
	}
	rt, err := agent.New(ctx, agent.Options{DB: rtDB, Clock: opts.Clock, IdleTimeout: idle, Logger: opts.Logger,
		MaxCallsPerConn: opts.MaxCallsPerConn, MaxInstances: opts.MaxInstances,
		TracerProvider: opts.TracerProvider, MeterProvider: opts.MeterProvider, Placement: opts.Placement})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range opts.Classes {
		if err := rt.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	if opts.Setup != nil {
		if err := opts.Setup(rt); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	so := opts.Server
	so.Runtime = rt
	srv := server.New(so)
	var h http.Handler = srv
	if opts.Middleware != nil {
		h = opts.Middleware(srv)
	}
	hs := httptest.NewServer(h)
	env := &Env{Dir: dir, DB: db, RT: rt, Server: srv, HTTP: hs, Host: strings.TrimPrefix(hs.URL, "http://")}
	t.Cleanup(env.Close)
	return env
}

// Close shuts the server down in order: sockets, HTTP, runtime, database.
func (e *Env) Close() {
	e.Server.Close()
	e.HTTP.Close()
	e.RT.Close()
	e.DB.Close()
}

// URL returns the WebSocket URL of an agent route path such as
// "/agents/counter/a".
func (e *Env) URL(path string) string { return "ws://" + e.Host + path }

// NPMDir returns the folder of the npm test scripts.
func NPMDir() string {
	return filepath.Join(moduleRoot(), "test", "npm")
}

// RequireNode skips the test when Node or the npm packages are missing,
// except in CI (CI=true), where that is a failure.
func RequireNode(t testing.TB) {
	t.Helper()
	requireNodeModule(t, NPMDir(), "test/npm", "agents")
}

// requireNodeModule skips the test when Node or the npm package module of
// the folder dir (named for the message) is missing, except in CI
// (CI=true), where that is a failure.
func requireNodeModule(t testing.TB, dir, name string, module ...string) {
	t.Helper()
	_, errNode := exec.LookPath("node")
	_, errMods := os.Stat(filepath.Join(append([]string{dir, "node_modules"}, module...)...))
	if errNode == nil && errMods == nil {
		return
	}
	msg := "node or " + name + "/node_modules missing: run `make npm`"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// Node runs a script of test/npm with args and returns its output; a
// non-zero exit fails the test with the output.
func Node(t testing.TB, timeout time.Duration, script string, args ...string) string {
	t.Helper()
	RequireNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Dir = NPMDir()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, out.String())
	}
	return out.String()
}
