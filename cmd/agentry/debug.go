package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// startDebug serves Go's profiles (net/http/pprof: goroutines, heap, CPU,
// mutex and block profiles, traces) under /debug/pprof/ on addr, apart
// from the application's port, for load tests (bench/load -debug) and
// profiling. It returns the address it listens on and a function that
// stops it.
func startDebug(addr string, logger *slog.Logger) (bound string, stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Warn("debug server", "err", err)
		}
	}()
	logger.Info("debug profiles", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	return ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}, nil
}
