// Command server is a cluster node for the cluster tests: a Fan parent
// whose HTTP op fan-out?n=&tag= dispatches n awaited agent-tool runs to
// Worker children (chat agents on a scripted model that streams a few
// chunks with a delay), and records every OnAgentToolFinish in its own
// table (fan_finishes: run id → how often it fired) so the tests can check
// that each fired exactly once. A Prog child reports progress and
// milestones, and a Nester child runs a Worker of its own; Pub and Clock
// children wait for input (an approval, a client tool's output). The
// Fan's other operations (serveRemoteOps) dispatch detached runs, cancel,
// clear and read its ledgers, and its OnBeforeSubAgent gates drill-in
// (?drill=yes).
//
//	server -addr 127.0.0.1:0 -postgres URL -node-id a -lease 2s -delay 20ms [-advertise host:port]
package main

import (
	"context"
	"encoding/json"
	"errors"
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

// OnStart creates the ledgers.
func (f *Fan) OnStart(ctx context.Context) error {
	return f.Storage().Update(ctx, func(s *agent.SQL) error {
		for _, q := range []string{
			`CREATE TABLE IF NOT EXISTS {fan_finishes} (run_id TEXT PRIMARY KEY, n INTEGER NOT NULL, status TEXT NOT NULL, history TEXT NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS {fan_detached} (run_id TEXT PRIMARY KEY, n INTEGER NOT NULL, status TEXT NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS {fan_progress} (n INTEGER PRIMARY KEY, run_id TEXT NOT NULL, what TEXT NOT NULL)`,
		} {
			if _, err := s.Exec(q); err != nil {
				return err
			}
		}
		return nil
	})
}

// OnDetachedDone is the OnFinish of detached runs: it counts each
// delivery in fan_detached.
func (f *Fan) OnDetachedDone(ctx context.Context, run agenttool.Run, res agenttool.Result) error {
	return f.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`INSERT INTO {fan_detached} (run_id, n, status) VALUES (?, 1, ?)
			ON CONFLICT (run_id) DO UPDATE SET n = {fan_detached}.n + 1, status = excluded.status`, run.RunID, string(res.Status))
		return err
	})
}

// OnProgress records each progress signal and milestone of a run, in the
// order they arrive (fan_progress): "p:<fraction>" or "m:<name>".
func (f *Fan) OnProgress(ctx context.Context, run agenttool.Run, p agenttool.ProgressEvent) {
	what := "p:"
	if p.Fraction != nil {
		what += strconv.FormatFloat(*p.Fraction, 'f', -1, 64)
	}
	if p.Milestone != nil {
		what = "m:" + p.Milestone.Name
	}
	err := f.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`INSERT INTO {fan_progress} (n, run_id, what) SELECT COALESCE(MAX(n), 0) + 1, ?, ? FROM {fan_progress}`, run.RunID, what)
		return err
	})
	if err != nil {
		f.Logger().Error("fan: record progress", "run", run.RunID, "err", err)
	}
}

// OnBeforeSubAgent admits drill-in requests that ask for it (?drill=yes)
// and refuses the others with 403, so a test sees that the parent decided.
func (f *Fan) OnBeforeSubAgent(ctx context.Context, r *http.Request, class, name string) error {
	if r.URL.Query().Get("drill") == "yes" {
		return nil
	}
	return &agent.HTTPError{Status: http.StatusForbidden, Message: "drill-in refused by the parent"}
}

// Nester is a child that runs a Worker of its own (run id "g-" and its
// own name) before it answers: a tree three deep.
type Nester struct {
	chat.Base
}

// OnChatMessage runs the grandchild and answers with its summary.
func (n *Nester) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	res, err := agenttool.RunAgentTool(ctx, n, "Worker", agenttool.RunOptions{RunID: "g-" + n.Name(), Input: "work"})
	if err != nil {
		return err
	}
	return t.WriteText("nested: " + res.Summary)
}

// Prog is a child that reports progress and milestones while it works:
// progress 0.25, milestone "half", progress 0.5, milestone "most",
// progress 1, each step a pause apart, then its answer.
type Prog struct {
	chat.Base
	step time.Duration
}

// OnChatMessage runs the steps.
func (p *Prog) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	steps := []agenttool.Progress{
		{Fraction: agenttool.Fraction(0.25)},
		{Milestone: "half", Message: "half way"},
		{Fraction: agenttool.Fraction(0.5)},
		{Milestone: "most"},
		{Fraction: agenttool.Fraction(1)},
	}
	for _, st := range steps {
		if err := agenttool.ReportProgress(ctx, st); err != nil {
			return err
		}
		tm := time.NewTimer(p.step) // simulated work
		select {
		case <-ctx.Done():
			tm.Stop()
			return context.Cause(ctx)
		case <-tm.C:
		}
	}
	return t.WriteText("finished the work")
}

// Pub is a child whose publish_findings tool needs approval: its turn
// waits for input until the approval (or denial) comes, from the parent's
// connection or the drill-in chat, and then reports the tool's result.
type Pub struct{ chat.Base }

// ChatModel calls publish_findings, then reports its result.
func (p *Pub) ChatModel() model.Model {
	return scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("publish result: " + string(scripted.ToolResults(req)[0].Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.Text("Researching. "),
			scripted.ToolCall("publish_findings", map[string]any{"title": "t"})})},
	))
}

// Tools is publish_findings, which needs approval.
func (p *Pub) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("publish_findings", "Publish.", func(ctx context.Context, in struct {
		Title string `json:"title"`
	}) (string, error) {
		return "published " + in.Title, nil
	}).WithApproval(chat.RequireApproval)}
}

// Clock is a child that asks its client for the local time (a client-side
// tool, answered from the parent's connection).
type Clock struct{ chat.Base }

// ChatModel calls get_local_time, then tells the time.
func (c *Clock) ChatModel() model.Model {
	return scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("the time is " + string(scripted.ToolResults(req)[0].Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.ToolCall("get_local_time", map[string]any{})})},
	))
}

// Tools is the client tool get_local_time.
func (c *Clock) Tools() []chat.Tool {
	return []chat.Tool{chat.NewClientTool[struct{}]("get_local_time", "The local time.")}
}

// OnAgentToolFinish counts the finish of a run. On node n the hook of a
// run named hold-n-… waits until the node stops (the test kills it), so
// the run's end is recorded and not delivered there.
func (f *Fan) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	if strings.HasPrefix(run.RunID, "hold-"+f.node+"-") {
		<-ctx.Done()
		return
	}
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
		writeJSON(w, out, err)
		return
	}
	if f.serveRemoteOps(ctx, w, r) {
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
	statuses := f.fanOut(ctx, n, r.URL.Query().Get("tag"))
	writeJSON(w, statuses, nil)
}

// FanOut is the callable fanOut(n, tag): the fan-out of OnRequest over
// RPC, for the npm AgentClient.
func (f *Fan) FanOut(ctx context.Context, n int, tag string) (map[string]int, error) {
	if n < 0 || n > 10000 {
		return nil, errors.New("bad n")
	}
	return f.fanOut(ctx, n, tag), nil
}

// fanOut awaits n runs of Worker with run ids tag-i and counts their
// statuses.
func (f *Fan) fanOut(ctx context.Context, n int, tag string) map[string]int {
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
				f.Logger().Warn("fan-out: run failed", "run", fmt.Sprintf("%s-%d", tag, i), "err", err)
				return
			}
			statuses[string(res.Status)]++
		}()
	}
	_ = agent.Await(ctx, func() error { wg.Wait(); return nil })
	return statuses
}

// serveRemoteOps serves the operations of the cross-node tests:
//
//	detached?n=&tag=&class=  n detached runs with OnFinish OnDetachedDone
//	                         (and notices of the milestone "half")
//	run?id=&class=           one awaited run, answered with its result
//	cancel?id=               CancelAgentTool
//	clear                    ClearAgentToolRuns
//	progress?id=             the run's fan_progress, in order
//	detached-ledger          fan_detached: runs, repeated, by status
func (f *Fan) serveRemoteOps(ctx context.Context, w http.ResponseWriter, r *http.Request) bool {
	q := r.URL.Query()
	var out any
	var err error
	switch {
	case strings.HasSuffix(r.URL.Path, "/detached"):
		n, aerr := strconv.Atoi(q.Get("n"))
		if aerr != nil || n < 0 || n > 10000 {
			http.Error(w, "bad n", http.StatusBadRequest)
			return true
		}
		st := map[string]int{}
		for i := range n {
			res, err := agenttool.RunAgentTool(ctx, f, q.Get("class"), agenttool.RunOptions{RunID: fmt.Sprintf("%s-%d", q.Get("tag"), i), Input: "work",
				Detached: &agenttool.DetachedOptions{OnFinish: "OnDetachedDone",
					OnMilestones: &agenttool.MilestoneNotices{Names: []string{"half"}, Mode: agenttool.MilestoneNarrate}}})
			if err != nil {
				st["go-error"]++
				continue
			}
			st[string(res.Status)]++
		}
		out = st
	case strings.HasSuffix(r.URL.Path, "/run"):
		out, err = agenttool.RunAgentTool(ctx, f, q.Get("class"), agenttool.RunOptions{RunID: q.Get("id"), Input: "work"})
	case strings.HasSuffix(r.URL.Path, "/cancel"):
		err = agenttool.CancelAgentTool(ctx, f, q.Get("id"), "canceled by the test")
		out = map[string]string{}
	case strings.HasSuffix(r.URL.Path, "/clear"):
		var n int
		n, err = agenttool.ClearAgentToolRuns(ctx, f, agenttool.ClearOptions{})
		out = map[string]int{"cleared": n}
	case strings.HasSuffix(r.URL.Path, "/progress"):
		list := []string{}
		err = f.Storage().View(ctx, func(s *agent.SQL) error {
			rows, err := s.Query(`SELECT what FROM {fan_progress} WHERE run_id = ? ORDER BY n`, q.Get("id"))
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var what string
				if err := rows.Scan(&what); err != nil {
					return err
				}
				list = append(list, what)
			}
			return rows.Err()
		})
		out = list
	case strings.HasSuffix(r.URL.Path, "/detached-ledger"):
		m := map[string]int{}
		err = f.Storage().View(ctx, func(s *agent.SQL) error {
			rows, err := s.Query(`SELECT n, status FROM {fan_detached}`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var n int
				var st string
				if err := rows.Scan(&n, &st); err != nil {
					return err
				}
				m["runs"]++
				m["status:"+st]++
				if n > 1 {
					m["repeated"]++
				}
			}
			return rows.Err()
		})
		out = m
	default:
		return false
	}
	writeJSON(w, out, err)
	return true
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	advertise := flag.String("advertise", "", "host:port the other nodes reach this node at (default: the listener's)")
	pg := flag.String("postgres", "", "cluster database URL")
	nodeID := flag.String("node-id", "", "node id")
	lease := flag.Duration("lease", 2*time.Second, "shard lease")
	delay := flag.Duration("delay", 20*time.Millisecond, "delay between the worker's chunks")
	step := flag.Duration("step", 250*time.Millisecond, "pause between the Prog child's steps")
	poll := flag.Duration("remote-poll", 0, "agenttool.Options.RemotePoll (0: default)")
	noHints := flag.Bool("no-hints", false, "no LISTEN/NOTIFY hints between nodes")
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
		agenttool.Install(rt, agenttool.Options{Remote: remote, RemotePoll: *poll})
		worker := scripted.New(scripted.WithChunkSize(4), scripted.WithDelay(*delay),
			scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("done done done done")})))
		rt.MustRegister(agent.Class{Name: "Fan", New: func() agent.Agent { return &Fan{m: worker, node: *nodeID} }, Public: true,
			Callable: []string{"fanOut"}})
		rt.MustRegister(echochat.Class(echochat.Options{Delay: 20 * time.Millisecond}))
		rt.MustRegister(agent.Class{Name: "Worker", New: func() agent.Agent { return &Worker{m: worker} }})
		rt.MustRegister(agent.Class{Name: "Prog", New: func() agent.Agent { return &Prog{step: *step} }})
		rt.MustRegister(agent.Class{Name: "Pub", New: func() agent.Agent { return &Pub{} }})
		rt.MustRegister(agent.Class{Name: "Clock", New: func() agent.Agent { return &Clock{} }})
		rt.MustRegister(agent.Class{Name: "Nester", New: func() agent.Agent { return &Nester{} }})
		rt.MustRegister(tickerClass(*nodeID))
		// debug/resident?path= says whether this node holds the instance
		// in memory.
		debug := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/debug/resident" {
				http.NotFound(w, r)
				return
			}
			p, err := agent.ParsePath(r.URL.Query().Get("path"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			_, ok := rt.Lookup(p)
			_ = json.NewEncoder(w).Encode(map[string]bool{"resident": ok})
		})
		srv := server.New(server.Options{Runtime: rt, Logger: logger, NotFound: debug})
		return clusterserve.App{Runtime: rt, Handler: srv, Gate: srv.CheckSubAgent,
			Close: func() error { srv.Close(); return rt.Close() },
			Route: func(p string) (agent.Path, bool) {
				r, ok, err := srv.ParseRoute(p)
				return r.Path, ok && err == nil
			}}, nil
	}
	logger.Info("agentry listening", "addr", "http://"+ln.Addr().String(), "node", *nodeID, "pid", os.Getpid())
	err = clusterserve.Run(ctx, clusterserve.Config{Listener: ln, Postgres: *pg, NodeID: *nodeID, Advertise: *advertise, Lease: *lease, Logger: logger, NoHints: *noHints, Build: build})
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

// writeJSON answers out as JSON, or err (when not nil) as an internal
// server error.
func writeJSON(w http.ResponseWriter, out any, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
