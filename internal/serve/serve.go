// Package serve runs the HTTP server of a runtime the way `agentry serve`
// and the crash tests' server commands do: the port is open and answering
// before the runtime's start-up. Start-up wakes every instance with
// unfinished work (chat turns, agent-tool runs) and recovers it; clients
// connect meanwhile, and a request to an instance that is still recovering
// waits for it (the runtime hydrates an instance once, and every caller
// waits for that hydration).
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/agentry/agentry/agent"
)

// Config is what Run serves.
type Config struct {
	// Listener is the open port.
	Listener net.Listener
	// Handler serves the requests (a server.Server, the demo's handler).
	Handler http.Handler
	// Runtime is started (Runtime.Start) once the port serves.
	Runtime *agent.Runtime
	// Logger receives the start-up and shutdown records; nil means
	// slog.Default().
	Logger *slog.Logger
	// ShutdownTimeout bounds the wait for requests in flight at shutdown;
	// zero means 10 seconds.
	ShutdownTimeout time.Duration
	// BeforeShutdown, when set, runs once ctx is done, while the port
	// still serves and before the requests in flight are waited for: a
	// cluster node hands its shards over there, so that their instances
	// move at once rather than after the node's requests ended.
	BeforeShutdown func()
}

// Run serves c.Handler on c.Listener, starts c.Runtime while it serves, and
// serves until ctx is done or the server fails. It then shuts the HTTP
// server down; the caller closes the handler's sockets and the runtime. An
// error of the runtime's start-up stops the server and is returned.
func Run(ctx context.Context, c Config) error {
	logger := c.Logger
	if logger == nil {
		logger = slog.Default()
	}
	timeout := c.ShutdownTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	hs := &http.Server{Handler: c.Handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(c.Listener) }()
	startc := make(chan error, 1)
	go func() {
		t0 := time.Now()
		err := c.Runtime.Start(ctx)
		if err == nil {
			logger.Info("agentry started", "recovery", time.Since(t0).Round(time.Millisecond))
		}
		startc <- err
	}()
	var err error
	select {
	case err = <-errc:
	case err = <-startc:
		if errors.Is(err, agent.ErrClosed) {
			err = nil // closed under its start-up: a shutdown
		}
		if err != nil {
			err = fmt.Errorf("start: %w", err)
			break
		}
		select {
		case err = <-errc:
		case <-ctx.Done():
		}
	case <-ctx.Done():
	}
	if ctx.Err() != nil && c.BeforeShutdown != nil {
		c.BeforeShutdown()
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if serr := hs.Shutdown(sctx); serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		logger.Warn("http shutdown", "err", serr)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
