// Command agentry runs Agentry's demo server.
//
//	agentry serve [--addr 127.0.0.1:8787] [--data ./data]
//	agentry chat [--addr 127.0.0.1:8787] [--name default]
//	agentry runs [--addr 127.0.0.1:8787] [--name default] list|inspect <runId>|cancel <runId>|clear
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/internal/serve"
	"github.com/agentry/agentry/store/sqlite"
)

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

func runServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8787", "address to listen on")
	data := fs.String("data", "./data", "data folder (SQLite database)")
	idle := fs.Duration("idle-timeout", 5*time.Minute, "evict instances idle this long")
	verbose := fs.Bool("v", false, "log debug records (every observability event)")
	delay := fs.Duration("delay", 20*time.Millisecond, "delay between the scripted model's streamed chunks")
	fs.Parse(args)

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	db, err := sqlite.Open(ctx, filepath.Join(*data, "agentry.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	d, err := demo.New(ctx, demo.Options{DB: db, Logger: logger, IdleTimeout: *idle, Delay: *delay})
	if err != nil {
		return err
	}
	logger.Info("agents-as-tools demo", "model", d.Provider)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		d.Close()
		return err
	}
	// The port answers at once; interrupted work recovers meanwhile.
	logger.Info("agentry listening", "addr", "http://"+ln.Addr().String(), "playground", "http://"+ln.Addr().String()+"/", "data", *data)
	err = serve.Run(ctx, serve.Config{Listener: ln, Handler: d.Handler(), Runtime: d.Runtime, Logger: logger})
	logger.Info("shutting down")
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
