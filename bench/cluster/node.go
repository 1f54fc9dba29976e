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
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/clusterserve"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/postgres"
)

const (
	chunks    = 20      // text-delta chunks per child turn
	chunkText = "abcde" // 5 characters each
)

// researcherModel streams 20 × "abcde" with no delay, as in test/bench
// and bench/sidebyside.
func researcherModel() model.Model {
	return scripted.New(scripted.WithChunkSize(len(chunkText)), scripted.WithDelay(0),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text(strings.Repeat(chunkText, chunks))})))
}

// Researcher is the child: a declarative chat agent on the scripted model.
type Researcher struct {
	chat.Base
	m model.Model
}

// ChatModel is the scripted model.
func (r *Researcher) ChatModel() model.Model { return r.m }

// Assistant is the parent; its own model is never called.
type Assistant struct {
	chat.Base
	m model.Model
}

// ChatModel is the scripted model.
func (a *Assistant) ChatModel() model.Model { return a.m }

// fanOutResult is what the op fan-out answers.
type fanOutResult struct {
	N        int            `json:"n"`
	Statuses map[string]int `json:"statuses"`
	Ms       float64        `json:"ms"`
	Error    string         `json:"error,omitempty"`
}

// OnRequest serves fan-out?n=&tag=: n awaited runs of a Researcher at
// once, with run ids tag-0 … tag-(n-1) (so every run has a fresh child,
// placed by its own path on any node).
func (a *Assistant) OnRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/fan-out") {
		http.NotFound(w, r)
		return
	}
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n < 0 || n > 10_000 {
		http.Error(w, "bad n (0…10000)", http.StatusBadRequest)
		return
	}
	tag := r.URL.Query().Get("tag")
	t0 := time.Now()
	out := fanOutResult{N: n, Statuses: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	// The runs are inputs of their own (docs/concurrency.md): the request
	// waits for them at an await point.
	gctx := agent.Unheld(ctx)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := agenttool.RunAgentTool(gctx, a, "Researcher", agenttool.RunOptions{
				RunID: fmt.Sprintf("%s-%d", tag, i), Input: map[string]string{"query": "q"}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				out.Statuses["go-error"]++
				if out.Error == "" {
					out.Error = err.Error()
				}
			case len(res.Summary) != chunks*len(chunkText) && res.Status == agenttool.StatusCompleted:
				out.Statuses["short-summary"]++
			default:
				out.Statuses[string(res.Status)]++
				if res.Error != "" && out.Error == "" {
					out.Error = res.Error
				}
			}
		}()
	}
	_ = agent.Await(ctx, func() error { wg.Wait(); return nil })
	out.Ms = float64(time.Since(t0).Microseconds()) / 1000
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// nodeStats is what /bench/stats answers: the store's counters since the
// node started, and the Go heap after a collection.
type nodeStats struct {
	Store     postgres.Stats `json:"store"`
	HeapAlloc uint64         `json:"heapAlloc"`
	Resident  int            `json:"resident"`
}

// runNode is the subcommand "node": one cluster node on loopback. It
// prints "listening HOST:PORT" on stdout once the port is open.
func runNode(args []string) error {
	fs := flag.NewFlagSet("node", flag.ExitOnError)
	pg := fs.String("postgres", "", "cluster database URL")
	nodeID := fs.String("node-id", "", "node id")
	lease := fs.Duration("lease", 10*time.Second, "shard lease")
	logLevel := fs.String("log", "warn", "log level")
	fs.Parse(args)
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	build := func(ctx context.Context, db store.DB, place agent.Placement, remote agenttool.Remote) (clusterserve.App, error) {
		counted, _ := db.(interface{ Stats() postgres.Stats })
		rt, err := agent.New(ctx, agent.Options{DB: db, Logger: logger, Placement: place, IdleTimeout: -1})
		if err != nil {
			return clusterserve.App{}, err
		}
		chat.Configure(rt, chat.Config{})
		agenttool.Install(rt, agenttool.Options{Remote: remote})
		m := researcherModel()
		rt.MustRegister(agent.Class{Name: "Assistant", New: func() agent.Agent { return &Assistant{m: m} }, Public: true})
		rt.MustRegister(agent.Class{Name: "Researcher", New: func() agent.Agent { return &Researcher{m: m} }})
		srv := server.New(server.Options{Runtime: rt, Logger: logger,
			NotFound: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/bench/stats" {
					http.NotFound(w, r)
					return
				}
				var s nodeStats
				if counted != nil {
					s.Store = counted.Stats()
				}
				if r.URL.Query().Get("gc") == "1" {
					runtime.GC()
					runtime.GC()
				}
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				s.HeapAlloc, s.Resident = ms.HeapAlloc, rt.ResidentCount()
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(s)
			})})
		return clusterserve.App{Runtime: rt, Handler: srv,
			Close: func() error { srv.Close(); return rt.Close() },
			Route: func(p string) (agent.Path, bool) {
				r, ok, err := srv.ParseRoute(p)
				return r.Path, ok && err == nil
			}}, nil
	}
	fmt.Printf("listening %s\n", ln.Addr())
	return clusterserve.Run(ctx, clusterserve.Config{Listener: ln, Postgres: *pg, NodeID: *nodeID, Lease: *lease,
		Logger: logger, Build: build})
}
