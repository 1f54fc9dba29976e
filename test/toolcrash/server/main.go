// Command server is the agentry server of the agent-tool crash tests: a Boss
// chat agent that hands work to Worker children (six tool steps each, every
// step recorded in the child's own table), on scripted models with a delay
// between streamed events. It logs "agentry listening addr=http://…" like
// cmd/agentry (see testenv.ServeMain).
//
//	server --addr 127.0.0.1:0 --data DIR [--delay 40ms]
package main

import (
	"context"
	"fmt"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// Steps is how many tool steps a Worker runs.
const Steps = 6

// WorkInput is the input of the work tool.
type WorkInput struct {
	Task string `json:"task"`
}

type stepInput struct {
	N int `json:"n"`
}

// Boss is the parent chat agent: its model calls the work tool once, then
// answers with the result.
type Boss struct {
	chat.Base
	model model.Model
}

func (b *Boss) ChatModel() model.Model { return b.model }
func (b *Boss) Tools() []chat.Tool {
	return []chat.Tool{agenttool.AgentTool[WorkInput]("Worker", agenttool.ToolOptions{
		Name: "work", Description: "Hand a task to a Worker.", DisplayName: "Worker"})}
}

// Dispatch runs a Worker with an explicit run id and waits for it.
func (b *Boss) Dispatch(ctx context.Context, runID, task string) (agenttool.Result, error) {
	return agenttool.RunAgentTool(ctx, b, "Worker", agenttool.RunOptions{RunID: runID, Input: WorkInput{Task: task},
		ParentToolCallID: "rpc-" + runID})
}

// Run returns a registry row (found false when there is none).
func (b *Boss) Run(ctx context.Context, runID string) (map[string]any, error) {
	r, ok, err := agenttool.GetAgentToolRun(ctx, b, runID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"found": ok, "run": r}, nil
}

// Worker runs Steps tool steps; each step appends a row to its own table.
type Worker struct {
	chat.Base
	model model.Model
}

func (w *Worker) OnStart(ctx context.Context) error {
	return w.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`CREATE TABLE IF NOT EXISTS {steps} (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER NOT NULL)`)
		return err
	})
}
func (w *Worker) ChatModel() model.Model { return w.model }
func (w *Worker) MaxSteps() int          { return Steps + 2 }
func (w *Worker) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("step", "Do one step of the task.", func(ctx context.Context, in stepInput) (string, error) {
		err := w.Storage().Update(ctx, func(s *agent.SQL) error {
			_, err := s.Exec(`INSERT INTO {steps} (n) VALUES (?)`, in.N)
			return err
		})
		return fmt.Sprintf("step %d done", in.N), err
	})}
}

func main() {
	testenv.ServeMain(40*time.Millisecond, func(rt *agent.Runtime, delay time.Duration) error {
		chat.Configure(rt, chat.Config{FlushInterval: 10 * time.Millisecond})
		agenttool.Install(rt, agenttool.Options{})
		bossModel := scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
			if scripted.LastIsToolResult(req) {
				return scripted.Reply{scripted.Text("The worker finished.")}
			}
			return scripted.Reply{scripted.ToolCall("work", WorkInput{Task: scripted.LastUserText(req)})}
		}), scripted.WithDelay(delay))
		workerModel := scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
			n := scripted.CountToolResults(req)
			if n < Steps {
				return scripted.Reply{scripted.Text(fmt.Sprintf("Working on step %d of the task. ", n+1)),
					scripted.ToolCall("step", stepInput{N: n + 1})}
			}
			return scripted.Reply{scripted.Text("All six steps are done; the task is complete.")}
		}), scripted.WithChunkSize(8), scripted.WithDelay(delay))
		for _, c := range []agent.Class{
			{Name: "Boss", New: func() agent.Agent { return &Boss{model: bossModel} }, Callable: []string{"dispatch", "run"}, Public: true},
			{Name: "Worker", New: func() agent.Agent { return &Worker{model: workerModel} }},
		} {
			if err := rt.Register(c); err != nil {
				return err
			}
		}
		return nil
	})
}
