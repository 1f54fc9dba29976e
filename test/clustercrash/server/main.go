// Command server is a cluster node for the cluster tests: a Fan parent
// whose HTTP op fan-out?n=&tag= dispatches n awaited agent-tool runs to
// Worker children (chat agents on a scripted model that streams a few
// chunks with a delay), and records every OnAgentToolFinish in its own
// table (fan_finishes: run id → how often it fired) so the tests can check
// that each fired exactly once.
//
//	server -addr 127.0.0.1:0 -postgres URL -node-id a -lease 2s -delay 20ms
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/examples/echochat"
	"github.com/agentry/agentry/internal/clusterserve"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store"
)

// Worker is the child.
type Worker struct {
	chat.Base
	m model.Model
}

func (w *Worker) ChatModel() model.Model { return w.m }

// Fan is the parent.
type Fan struct {
	chat.Base
	m    model.Model
	node string // the node id, in the finish ledger's history
}

func (f *Fan) ChatModel() model.Model { return f.m }

// OnStart creates the finish ledger.
func (f *Fan) OnStart(ctx context.Context) error {
	return f.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`CREATE TABLE IF NOT EXISTS {fan_finishes} (run_id TEXT PRIMARY KEY, n INTEGER NOT NULL, status TEXT NOT NULL, history TEXT NOT NULL)`)
		return err
	})
}

// OnAgentToolFinish counts the finish of a run.
func (f *Fan) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	err := f.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`INSERT INTO {fan_finishes} (run_id, n, status, history) VALUES (?, 1, ?, ?)
			ON CONFLICT (run_id) DO UPDATE SET n = {fan_finishes}.n + 1, status = excluded.status,
				history = {fan_finishes}.history || ' ' || excluded.history`, run.RunID, string(res.Status), f.node+":"+string(res.Status))
		return err
	})
	if err != nil {
		f.Logger().Error("fan: record finish", "run", run.RunID, "err", err)
	}
}

// OnRequest serves fan-out?n=&tag=: n awaited runs with run ids tag-i.
func (f *Fan) OnRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/finishes") {
		// The finish ledger: how many runs finished, how many more than
		// once, and by status.
		out := map[string]int{}
		err := f.Storage().View(ctx, func(s *agent.SQL) error {
			rows, err := s.Query(`SELECT run_id, n, status, history FROM {fan_finishes}`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var n int
				var id, st, hist string
				if err := rows.Scan(&id, &n, &st, &hist); err != nil {
					return err
				}
				out["runs"]++
				out["status:"+st]++
				if n > 1 {
					out["repeated"]++
					out["repeated "+id+": "+hist]++
				}
			}
			return rows.Err()
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
		return
	}
	if !strings.HasSuffix(r.URL.Path, "/fan-out") {
		http.NotFound(w, r)
		return
	}
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n < 0 || n > 10000 {
		http.Error(w, "bad n", http.StatusBadRequest)
		return
	}
	tag := r.URL.Query().Get("tag")
	statuses := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	// The runs are inputs of their own (docs/concurrency.md): each
	// goroutine enters the gate itself, and the request waits for them at
	// an await point.
	gctx := agent.Unheld(ctx)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := agenttool.RunAgentTool(gctx, f, "Worker", agenttool.RunOptions{RunID: fmt.Sprintf("%s-%d", tag, i), Input: "work"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				statuses["go-error"]++
				return
			}
			statuses[string(res.Status)]++
		}()
	}
	_ = agent.Await(ctx, func() error { wg.Wait(); return nil })
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(statuses)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	pg := flag.String("postgres", "", "cluster database URL")
	nodeID := flag.String("node-id", "", "node id")
	lease := flag.Duration("lease", 2*time.Second, "shard lease")
	delay := flag.Duration("delay", 20*time.Millisecond, "delay between the worker's chunks")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build := func(ctx context.Context, db store.DB, place agent.Placement, remote agenttool.Remote) (clusterserve.App, error) {
		rt, err := agent.New(ctx, agent.Options{DB: db, Logger: logger, Placement: place, IdleTimeout: -1})
		if err != nil {
			return clusterserve.App{}, err
		}
		chat.Configure(rt, chat.Config{})
		agenttool.Install(rt, agenttool.Options{Remote: remote})
		worker := scripted.New(scripted.WithChunkSize(4), scripted.WithDelay(*delay),
			scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("done done done done")})))
		rt.MustRegister(agent.Class{Name: "Fan", New: func() agent.Agent { return &Fan{m: worker, node: *nodeID} }, Public: true})
		rt.MustRegister(echochat.Class(echochat.Options{Delay: 20 * time.Millisecond}))
		rt.MustRegister(agent.Class{Name: "Worker", New: func() agent.Agent { return &Worker{m: worker} }})
		srv := server.New(server.Options{Runtime: rt, Logger: logger})
		return clusterserve.App{Runtime: rt, Handler: srv,
			Close: func() error { srv.Close(); return rt.Close() },
			Route: func(p string) (agent.Path, bool) {
				r, ok, err := srv.ParseRoute(p)
				return r.Path, ok && err == nil
			}}, nil
	}
	logger.Info("agentry listening", "addr", "http://"+ln.Addr().String(), "node", *nodeID, "pid", os.Getpid())
	err = clusterserve.Run(ctx, clusterserve.Config{Listener: ln, Postgres: *pg, NodeID: *nodeID, Lease: *lease, Logger: logger, Build: build})
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}
