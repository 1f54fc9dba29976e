package main

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// TestDebugProfiles: --debug-addr serves the goroutine profile that
// bench/load -debug reads.
func TestDebugProfiles(t *testing.T) {
	addr, stop, err := startDebug("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), "goroutine profile: total ") {
		t.Fatalf("%s: %.200s", resp.Status, b)
	}
}
