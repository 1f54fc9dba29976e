// Command server is the test server of test/detachedcrash: a chat parent
// (CrashParent) that dispatches two detached runs of a slow scripted child
// (SlowChild), one delivered to an OnFinish method that logs to the
// parent's own table, one delivered as a chat notification. It serves like
// `agentry serve` and logs "agentry listening addr=http://…" (see
// testenv.ServeMain).
//
//	server --addr 127.0.0.1:0 --data DIR [--delay 100ms]
package main

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// Run ids of the two detached runs.
const (
	RunOnFinish = "bg-onfinish"
	RunNotify   = "bg-notify"
)

// CrashParent is the parent: a chat agent whose model answers
// notifications.
type CrashParent struct {
	chat.Base
	model model.Model
}

func (p *CrashParent) ChatModel() model.Model { return p.model }

func (p *CrashParent) OnStart(ctx context.Context) error {
	return p.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`CREATE TABLE IF NOT EXISTS {on_done_log} (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, status TEXT NOT NULL, summary TEXT)`)
		return err
	})
}

// Dispatch starts both detached runs and returns their ids.
func (p *CrashParent) Dispatch(ctx context.Context) ([]string, error) {
	var ids []string
	for _, r := range []struct {
		id  string
		det agenttool.DetachedOptions
	}{
		{RunOnFinish, agenttool.DetachedOptions{OnFinish: "OnDone"}},
		{RunNotify, agenttool.DetachedOptions{Notify: true, NotifySource: "crash-test"}},
	} {
		res, err := agenttool.RunAgentTool(ctx, p, "SlowChild", agenttool.RunOptions{Input: "report on " + r.id, RunID: r.id, Detached: &r.det})
		if err != nil {
			return nil, err
		}
		if res.Status != agenttool.StatusRunning {
			return nil, errors.New("dispatch of " + r.id + " answered " + string(res.Status))
		}
		ids = append(ids, res.RunID)
	}
	return ids, nil
}

// OnDone is the OnFinish method: it logs the delivery in the parent's own
// table (so exactly-once is checkable) and tells the connections.
func (p *CrashParent) OnDone(ctx context.Context, run agenttool.Run, res agenttool.Result) error {
	err := p.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`INSERT INTO {on_done_log} (run_id, status, summary) VALUES (?, ?, ?)`, run.RunID, string(res.Status), res.Summary)
		return err
	})
	if err != nil {
		return err
	}
	return p.Broadcast(map[string]string{"type": "test-on-done", "runId": run.RunID, "status": string(res.Status)})
}

// Delivery is a row of the OnDone log.
type Delivery struct {
	RunID   string `json:"runId"`
	Status  string `json:"status"`
	Summary string `json:"summary"`
}

// FinishLog returns the OnDone log.
func (p *CrashParent) FinishLog(ctx context.Context) ([]Delivery, error) {
	out := []Delivery{}
	err := p.Storage().View(ctx, func(s *agent.SQL) error {
		rows, err := s.Query(`SELECT run_id, status, COALESCE(summary, '') FROM {on_done_log} ORDER BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var d Delivery
			if err := rows.Scan(&d.RunID, &d.Status, &d.Summary); err != nil {
				return err
			}
			out = append(out, d)
		}
		return rows.Err()
	})
	return out, err
}

// RunState is a registry row as the test sees it.
type RunState struct {
	RunID  string `json:"runId"`
	Status string `json:"status"`
}

// Runs returns the registry.
func (p *CrashParent) Runs(ctx context.Context) ([]RunState, error) {
	runs, err := agenttool.ListAgentToolRuns(ctx, p)
	if err != nil {
		return nil, err
	}
	out := []RunState{}
	for _, r := range runs {
		out = append(out, RunState{r.RunID, string(r.Status)})
	}
	return out, nil
}

// SlowChild streams a long scripted answer, one chunk per delay.
type SlowChild struct {
	chat.Base
	model model.Model
}

func (c *SlowChild) ChatModel() model.Model { return c.model }

// answer is 40 chunks of 8 characters.
var answer = strings.Repeat("finding ", 40)

func main() {
	testenv.ServeMain(100*time.Millisecond, func(rt *agent.Runtime, delay time.Duration) error {
		parentModel := scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("Thanks, noted.")})))
		childModel := scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text(answer)})), scripted.WithDelay(delay))
		for _, c := range []agent.Class{
			{Name: "CrashParent", New: func() agent.Agent { return &CrashParent{model: parentModel} }, Callable: []string{"dispatch", "finishLog", "runs"}, Public: true},
			{Name: "SlowChild", New: func() agent.Agent { return &SlowChild{model: childModel} }},
		} {
			if err := rt.Register(c); err != nil {
				return err
			}
		}
		chat.Configure(rt, chat.Config{})
		agenttool.Install(rt, agenttool.Options{})
		return nil
	})
}
