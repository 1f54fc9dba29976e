package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/store/sqlite"
)

// inProcess is the demo served in this process (-serve).
type inProcess struct {
	URL   string
	hs    *http.Server
	d     *demo.Demo
	close func() error
}

// serveDemo serves the demo, on its offline scripted models with delay
// between chunks, from a new SQLite database in dir, on a loopback port:
// what `agentry serve --data dir --delay delay --max-turns maxTurns`
// serves, and with heavy the heavy user's class (fanClass, whose parent
// runs at most heavyRunning children at once).
func serveDemo(ctx context.Context, dir string, delay time.Duration, maxTurns int, heavy bool, heavyRunning int) (*inProcess, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data folder: %w", err)
	}
	path := filepath.Join(dir, "agentry.db")
	if _, err := os.Stat(path); err == nil {
		return nil, fmt.Errorf("%s exists: -serve wants a fresh data folder", path)
	}
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	d, err := demo.New(ctx, demo.Options{DB: db, Delay: delay, Models: agentsastools.Offline(delay, nil),
		IdleTimeout: 5 * time.Minute, MaxTurnsInFlight: maxTurns, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("start the demo: %w", err)
	}
	if heavy {
		err = d.Runtime.Register(fanClass(heavyRunning))
	}
	if err == nil {
		err = d.Runtime.Start(ctx)
	}
	if err != nil {
		d.Close()
		db.Close()
		return nil, fmt.Errorf("start the demo: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		d.Close()
		db.Close()
		return nil, err
	}
	hs := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("load: serve", "err", err)
		}
	}()
	return &inProcess{URL: "http://" + ln.Addr().String(), hs: hs, d: d, close: db.Close}, nil
}

// Close stops the server, the runtime and the database.
func (s *inProcess) Close() error {
	s.d.Agents.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.hs.Shutdown(ctx)
	return errors.Join(err, s.d.Close(), s.close())
}
