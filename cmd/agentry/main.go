// Command agentry runs Agentry's demo server.
//
//	agentry serve [--addr 127.0.0.1:8787] [--data ./data] [--allow-origin app.example.com,…] [--auth-token T]
//	agentry chat [--addr 127.0.0.1:8787] [--name default] [--token T]
//	agentry runs [--addr 127.0.0.1:8787] [--name default] [--token T] list|inspect <runId>|cancel <runId>|clear
//
// The token flags default to $AGENTRY_AUTH_TOKEN. serve exports traces and
// metrics over OTLP/HTTP when the standard OpenTelemetry variables ask for
// it (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, …; see
// newTelemetry); without them it exports nothing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agentry/agentry/internal/clusterserve"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/internal/serve"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// tokenEnv is the environment variable the token flags default to: the
// token serve requires, and the one chat and runs send.
const tokenEnv = "AGENTRY_AUTH_TOKEN"

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = runServe(os.Args[2:])
	case "chat":
		err = runChat(context.Background(), os.Args[2:], os.Stdin, os.Stdout)
	case "runs":
		err = runRuns(context.Background(), os.Args[2:], os.Stdout)
	case "-h", "--help", "help":
		usage()
		return
	default:
		fmt.Fprintf(os.Stderr, "agentry: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentry:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage: agentry <command> [flags]

commands:
  serve   run the demo server (agents over HTTP and WebSocket)
  chat    chat with the Assistant of a running server, with live helper runs
  runs    list, inspect, cancel or clear the Assistant's helper runs`)
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func runServe(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveContext(ctx, args, os.Getenv, os.Stderr, nil)
}

// serveContext is the serve command: it serves until ctx is done. Logs go
// to logw; listening, when set, is called with the address once the server
// accepts connections.
func serveContext(ctx context.Context, args []string, getenv func(string) string, logw io.Writer, listening func(net.Addr)) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8787", "address to listen on")
	data := fs.String("data", "./data", "data folder (SQLite database)")
	idle := fs.Duration("idle-timeout", 5*time.Minute, "evict instances idle this long")
	verbose := fs.Bool("v", false, "log debug records (every observability event)")
	// At 50 ms a research helper streams for about 4 s: slow enough to watch.
	delay := fs.Duration("delay", 50*time.Millisecond, "delay between the scripted model's streamed chunks (the simulated web search takes 40 times as long)")
	allowOrigin := fs.String("allow-origin", "", "comma-separated browser origins besides the server's own that may open WebSockets (host patterns such as app.example.com or *.example.com; * allows every origin)")
	token := fs.String("auth-token", "", "require this token on every agent route; the playground reads it from #token=… (default $"+tokenEnv+")")
	maxTurns := fs.Int("max-turns", 0, "chat turns in flight on this node (every instance's) before clients' chat requests are refused; 0 means the default (10000), negative no limit")
	debugAddr := fs.String("debug-addr", "", "serve Go's profiles (net/http/pprof, goroutines included) under /debug/pprof/ on this address, such as 127.0.0.1:6060; off by default")
	var cl clusterFlags
	cl.register(fs)
	// --mcp is taken out before parsing (its command runs to the next
	// --mcp or the end); registering it gives it its line in -h.
	fs.Func("mcp", "attach an MCP server's tools to the Assistant: NAME=URL (streamable HTTP) or NAME=-- COMMAND ARGS… (stdio; the command runs to the next --mcp or the end of the line); repeatable", func(string) error {
		return errors.New("--mcp: internal error")
	})
	args, mcpServers, err := splitMCP(args)
	if err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	if *token == "" {
		*token = getenv(tokenEnv)
	}
	if cl.postgres == "" {
		cl.postgres = getenv(postgresEnv)
	}
	if *debugAddr != "" {
		_, stop, err := startDebug(*debugAddr, slog.New(slog.NewTextHandler(logw, nil)))
		if err != nil {
			return fmt.Errorf("serve: --debug-addr: %w", err)
		}
		defer stop()
	}
	if cl.postgres != "" {
		return serveCluster(ctx, cl, clusterServe{addr: *addr, idle: *idle, verbose: *verbose, delay: *delay,
			origins: splitList(*allowOrigin), token: *token, mcp: mcpServers, turns: *maxTurns}, logw, listening)
	}
	if cl.nodeID != "" || cl.advertise != "" {
		return errors.New("serve: --node-id and --advertise need --postgres (or $" + postgresEnv + ")")
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: level}))

	tel, err := newTelemetry(ctx, getenv)
	if err != nil {
		return err
	}
	defer func() {
		// Last, after the runtime closed: flush the spans and metrics of
		// the shutdown too.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			logger.Warn("telemetry shutdown", "err", err)
		}
	}()
	db, err := sqlite.OpenOptions(ctx, filepath.Join(*data, "agentry.db"), sqlite.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer db.Close()
	if err := store.CheckSchemas(ctx, db, clusterserve.KnownSchemas()); err != nil {
		return err
	}
	d, err := demo.New(ctx, demo.Options{DB: db, Logger: logger, IdleTimeout: *idle, Delay: *delay, MaxTurnsInFlight: *maxTurns,
		OriginPatterns: splitList(*allowOrigin), AuthToken: *token, TracerProvider: tel.Tracer, MeterProvider: tel.Meter,
		MCPServers: mcpServers, MCPStderr: logw})
	if err != nil {
		return err
	}
	logger.Info("agents-as-tools demo", "model", d.Provider)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		d.Close()
		return err
	}
	playground := "http://" + ln.Addr().String() + "/"
	if *token != "" {
		playground += "#token=<token>"
	}
	// The port answers at once; interrupted work recovers meanwhile.
	logger.Info("agentry listening", "addr", "http://"+ln.Addr().String(), "playground", playground, "data", *data, "auth", *token != "")
	if listening != nil {
		listening(ln.Addr())
	}
	err = serve.Run(ctx, serve.Config{Listener: ln, Handler: d.Handler(), Runtime: d.Runtime, Logger: logger})
	logger.Info("shutting down")
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
