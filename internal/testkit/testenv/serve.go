package testenv

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/internal/serve"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store/sqlite"
)

// ServeMain is the main function of a test server command that tests start
// with StartProcess. It serves like `agentry serve`:
//
//	server --addr 127.0.0.1:0 --data DIR [--delay D]
//
// It opens DIR/agentry.db, creates a runtime (idle timeout 5 minutes,
// logging to stderr), lets setup register and configure what the server
// runs (delay is the --delay flag, defaultDelay by default), starts it,
// serves HTTP and WebSocket and logs "agentry listening addr=http://…" like
// cmd/agentry. SIGINT or SIGTERM shut it down cleanly. An error is printed
// and exits with status 1.
func ServeMain(defaultDelay time.Duration, setup func(rt *agent.Runtime, delay time.Duration) error) {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	data := flag.String("data", "./data", "data folder")
	delay := flag.Duration("delay", defaultDelay, "delay between the scripted models' streamed events")
	flag.Parse()
	if err := serveData(*addr, *data, *delay, setup); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

func serveData(addr, data string, delay time.Duration, setup func(rt *agent.Runtime, delay time.Duration) error) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	db, err := sqlite.Open(ctx, filepath.Join(data, "agentry.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	rt, err := agent.New(ctx, agent.Options{DB: db, Logger: logger, IdleTimeout: 5 * time.Minute})
	if err != nil {
		return err
	}
	if err := setup(rt, delay); err != nil {
		return err
	}
	srv := server.New(server.Options{Runtime: rt})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		rt.Close()
		return err
	}
	// Like cmd/agentry: the port answers before the runtime's start-up.
	logger.Info("agentry listening", "addr", "http://"+ln.Addr().String(), "data", data)
	err = serve.Run(ctx, serve.Config{Listener: ln, Handler: srv, Runtime: rt, Logger: logger})
	srv.Close()
	if cerr := rt.Close(); err == nil {
		err = cerr
	}
	return err
}
