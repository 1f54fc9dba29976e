// Command agentry-ref is Agentry's counterpart of the Cloudflare reference
// worker in bench/sidebyside/reference/src/server.ts, written only against
// Agentry's public API, so that the reference's own driver (bench.mjs, the
// npm AgentClient over WebSocket and node:http over HTTP) runs against both
// servers unchanged.
//
//   - Researcher: a declarative chat agent whose scripted model streams
//     20 × "abcde" (5-character chunks) with no delay and no tools.
//   - Assistant: a chat agent with the callables runOnce, fanOut(n), count,
//     noop and clear, and the same HTTP ops under
//     /agents/assistant/<name>/<op>: run-once, fan-out?n=, count, noop,
//     clear. runOnce is one awaited, unbound agenttool.RunAgentTool with a
//     fresh run id (so a fresh child every run); fanOut is n of them at once.
//   - /ping answers "pong" (the reference's port probe).
//
// Extra, for Agentry-only scenarios: the op "statuses" (registry rows by
// status), the flag -researcher-delay (wait between the child's chunks, for
// the crash-recovery scenario) and -cpuprofile.
//
//	agentry-ref -addr 127.0.0.1:18811 -data ./data
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/serve"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store/sqlite"
)

const (
	chunks    = 20      // text-delta chunks per model call
	chunkText = "abcde" // 5 characters each: 100 characters of text
)

// fakeModel streams 20 × "abcde" and stops; delay is the wait between two
// chunks (0 in every benchmark).
func fakeModel(delay time.Duration) model.Model {
	return scripted.New(scripted.WithChunkSize(len(chunkText)), scripted.WithDelay(delay),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text(strings.Repeat(chunkText, chunks))})))
}

// Researcher is the child: a declarative chat agent on the fake model.
type Researcher struct {
	chat.Base
	m model.Model
}

func (r *Researcher) ChatModel() model.Model { return r.m }
func (r *Researcher) SystemPrompt() string   { return "You are a research helper." }

// Assistant is the parent chat agent; its model is never called.
type Assistant struct {
	chat.Base
	m model.Model
}

func (a *Assistant) ChatModel() model.Model { return a.m }
func (a *Assistant) SystemPrompt() string   { return "You are the parent assistant." }

// MaxRunningAgentTools lifts the node's default bound on runs executing at
// once per parent (agenttool.DefaultMaxRunningAgentTools): the reference
// runs every child of a fan-out at once, and this server mirrors it.
func (a *Assistant) MaxRunningAgentTools() int { return -1 }

// RunSummary is what runOnce and run-once return (the reference's shape).
type RunSummary struct {
	RunID   string  `json:"runId"`
	Status  string  `json:"status"`
	Summary string  `json:"summary,omitempty"`
	Error   string  `json:"error,omitempty"`
	Ms      float64 `json:"ms"`
}

// FanOutResult is what fanOut and fan-out return (the reference's shape).
type FanOutResult struct {
	N            int            `json:"n"`
	Statuses     map[string]int `json:"statuses"`
	Ms           float64        `json:"ms"`
	PerRunMs     PerRun         `json:"perRunMs"`
	FirstSummary string         `json:"firstSummary,omitempty"`
	FirstError   string         `json:"firstError,omitempty"`
}

// PerRun is the spread of the runs' own durations in one fan-out.
type PerRun struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// one is the reference's _one(): an awaited, unbound run with a fresh run id.
func (a *Assistant) one(ctx context.Context) RunSummary {
	t0 := time.Now()
	r, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: map[string]string{"query": "q"}})
	s := RunSummary{RunID: r.RunID, Status: string(r.Status), Summary: r.Summary, Error: r.Error, Ms: ms(time.Since(t0))}
	if err != nil {
		s.Status, s.Error = string(agenttool.StatusError), err.Error()
	}
	return s
}

func (a *Assistant) fanOut(ctx context.Context, n int) FanOutResult {
	t0 := time.Now()
	res := make([]RunSummary, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); res[i] = a.one(ctx) }()
	}
	wg.Wait()
	out := FanOutResult{N: n, Statuses: map[string]int{}, Ms: ms(time.Since(t0))}
	per := make([]float64, 0, n)
	for _, r := range res {
		out.Statuses[r.Status]++
		per = append(per, r.Ms)
		if r.Error != "" && out.FirstError == "" {
			out.FirstError = r.Error
		}
	}
	sort.Float64s(per)
	if n > 0 {
		out.PerRunMs = PerRun{Min: per[0], Median: per[n/2], Max: per[n-1]}
		out.FirstSummary = res[0].Summary
	}
	return out
}

func (a *Assistant) count(ctx context.Context) (int, error) {
	runs, err := agenttool.ListAgentToolRuns(ctx, a)
	return len(runs), err
}

// ---- WebSocket RPC surface (AgentClient.call) ----

func (a *Assistant) RunOnce(ctx context.Context) RunSummary { return a.one(ctx) }

func (a *Assistant) FanOut(ctx context.Context, n int) FanOutResult { return a.fanOut(ctx, n) }

func (a *Assistant) Count(ctx context.Context) (int, error) { return a.count(ctx) }

func (a *Assistant) Noop() int { return 1 }

func (a *Assistant) Clear(ctx context.Context) (int, error) {
	if _, err := agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{}); err != nil {
		return 0, err
	}
	return a.count(ctx)
}

// ---- HTTP surface: /agents/assistant/<name>/<op> ----

func (a *Assistant) OnRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	op := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	var v any
	var err error
	switch op {
	case "run-once":
		v = a.one(ctx)
	case "fan-out":
		n := 10
		if s := r.URL.Query().Get("n"); s != "" {
			if n, err = strconv.Atoi(s); err != nil || n < 0 {
				http.Error(w, "bad n", http.StatusBadRequest)
				return
			}
		}
		v = a.fanOut(ctx, n)
	case "count":
		var c int
		c, err = a.count(ctx)
		v = map[string]int{"count": c}
	case "noop":
		v = map[string]int{"ok": 1}
	case "clear":
		var c int
		c, err = a.Clear(ctx)
		v = map[string]int{"count": c}
	case "statuses": // Agentry-only: registry rows by status
		var runs []agenttool.Run
		runs, err = agenttool.ListAgentToolRuns(ctx, a)
		st, lens := map[string]int{}, map[int]int{}
		for _, run := range runs {
			st[string(run.Status)]++
			lens[len(run.Summary)]++
		}
		v = map[string]any{"count": len(runs), "statuses": st, "summaryLengths": lens}
	default:
		http.Error(w, "unknown op", http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:18811", "address to listen on (loopback only)")
	data := flag.String("data", "./data", "data folder (SQLite database)")
	idle := flag.Duration("idle-timeout", 0, "evict instances idle this long (0: the runtime's default, 5 min)")
	delay := flag.Duration("researcher-delay", 0, "wait between the Researcher model's chunks")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	logLevel := flag.String("log", "info", "log level: debug, info, warn, error")
	flag.Parse()
	if err := run(*addr, *data, *idle, *delay, *cpuprofile, *logLevel); err != nil {
		fmt.Fprintln(os.Stderr, "agentry-ref:", err)
		os.Exit(1)
	}
}

func run(addr, data string, idle, delay time.Duration, cpuprofile, logLevel string) error {
	if host, _, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" {
		return fmt.Errorf("listen on 127.0.0.1 only, not %q", addr)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
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
	rt, err := agent.New(ctx, agent.Options{DB: db, Logger: logger, IdleTimeout: idle})
	if err != nil {
		return err
	}
	chat.Configure(rt, chat.Config{})
	agenttool.Install(rt, agenttool.Options{})
	researcher, parentModel := fakeModel(delay), fakeModel(0)
	rt.MustRegister(agent.Class{Name: "Assistant", New: func() agent.Agent { return &Assistant{m: parentModel} },
		Public: true, Callable: []string{"runOnce", "fanOut", "count", "noop", "clear"}})
	rt.MustRegister(agent.Class{Name: "Researcher", New: func() agent.Agent { return &Researcher{m: researcher} }})
	srv := server.New(server.Options{Runtime: rt, Logger: logger,
		NotFound: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/ping" {
				w.Write([]byte("pong"))
				return
			}
			http.NotFound(w, r)
		})})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		srv.Close()
		rt.Close()
		return err
	}
	// The port answers at once and the runtime starts (recovers) behind
	// it, as in agentry serve.
	logger.Info("agentry-ref listening", "addr", ln.Addr().String(), "data", data, "pid", os.Getpid())
	err = serve.Run(ctx, serve.Config{Listener: ln, Handler: srv, Runtime: rt, Logger: logger})
	srv.Close()
	if cerr := rt.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}
