// Command server is the agentry server of the crash soak test
// (test/soakcrash): Parent chat agents whose model hands each round of work
// to two awaited Worker children at once (the "work" agent tool), plus a
// detached Worker run on every even round, on scripted models with a delay
// between streamed events. It logs "agentry listening addr=http://…" like
// cmd/agentry (see testenv.ServeMain).
//
// Every execution a Worker makes is appended, as one line, to the file
// exec.log in the data folder: a model step ("model"), a tool step
// ("tool"), the end of its turn ("end", written after the chat committed
// it) and, for detached runs, the parent's OnFinish delivery ("ondone").
// A line is one write(2) on an O_APPEND file, so it survives a SIGKILL of
// the process right after the call returned (the kernel holds it, no fsync
// is needed against a process kill).
//
//	server --addr 127.0.0.1:0 --data DIR [--delay 10ms]
package main

import (
	"context"
	"flag"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// Steps is how many tool steps a Worker runs before its final answer.
const Steps = 3

// ExecLog is the name of the execution log in the data folder.
const ExecLog = "exec.log"

// WorkInput is the input of the work tool and of detached runs.
type WorkInput struct {
	Task string `json:"task"`
}

type stepInput struct {
	N int `json:"n"`
}

// StepText is what a Worker says before tool step n of task.
func StepText(task string, n int) string {
	return fmt.Sprintf("Step %d of %s: working through it. ", n, task)
}

// FinalText is a Worker's last text of task.
func FinalText(task string) string {
	return fmt.Sprintf("All %d steps of %s are done.", Steps, task)
}

// execLog appends lines to DATA/exec.log.
type execLog struct {
	mu sync.Mutex
	f  *os.File
}

var xlog execLog

// line appends "kind\tchild\tdetail\n" in one write.
func (l *execLog) line(kind, child string, detail any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := fmt.Fprintf(l.f, "%s\t%s\t%v\n", kind, child, detail); err != nil {
		fmt.Fprintln(os.Stderr, "exec log:", err)
	}
}

// Parent is a chat agent: for the user message "round k" its model calls
// the work tool twice in one step (two awaited children in parallel), then
// answers.
type Parent struct {
	chat.Base
	model model.Model
}

func (p *Parent) ChatModel() model.Model { return p.model }
func (p *Parent) Tools() []chat.Tool {
	return []chat.Tool{agenttool.AgentTool[WorkInput]("Worker", agenttool.ToolOptions{
		Name: "work", Description: "Hand a task to a Worker.", DisplayName: "Worker"})}
}

// Ask submits round k to the parent's chat (at most once: the submission is
// keyed by k, also across restarts) and waits for that turn to end. On even
// rounds it first dispatches the detached run "bg-k" (idempotent by its run
// id). It returns the turn's outcome.
func (p *Parent) Ask(ctx context.Context, k int) (string, error) {
	if k%2 == 0 {
		res, err := agenttool.RunAgentTool(ctx, p, "Worker", agenttool.RunOptions{RunID: fmt.Sprintf("bg-%d", k),
			Input:    WorkInput{Task: fmt.Sprintf("background job %d of %s", k, p.Name())},
			Detached: &agenttool.DetachedOptions{OnFinish: "OnDone"}})
		if err != nil {
			return "", fmt.Errorf("detached run: %w", err)
		}
		if res.Status == agenttool.StatusError {
			return "", fmt.Errorf("detached run: %s", res.Error)
		}
	}
	id := fmt.Sprintf("round-%d", k)
	turn, err := p.SubmitMessages(ctx, []message.Message{{ID: id, Role: message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: fmt.Sprintf("round %d", k)}}}},
		chat.SubmitOptions{IdempotencyKey: id})
	if err != nil {
		return "", err
	}
	res, err := p.WaitTurn(ctx, turn)
	if err != nil {
		return "", err
	}
	return res.Outcome, nil
}

// OnDone is the OnFinish method of detached runs: it logs the delivery.
func (p *Parent) OnDone(ctx context.Context, run agenttool.Run, res agenttool.Result) error {
	xlog.line("ondone", p.Path().Child("Worker", run.RunID).String(), res.Status)
	return nil
}

// RunState is a registry row as the test sees it.
type RunState struct {
	RunID            string `json:"runId"`
	ParentToolCallID string `json:"parentToolCallId"`
	Status           string `json:"status"`
	Error            string `json:"error"`
}

// Runs returns the parent's registry.
func (p *Parent) Runs(ctx context.Context) ([]RunState, error) {
	runs, err := agenttool.ListAgentToolRuns(ctx, p)
	if err != nil {
		return nil, err
	}
	out := []RunState{}
	for _, r := range runs {
		out = append(out, RunState{r.RunID, r.ParentToolCallID, string(r.Status), r.Error})
	}
	return out, nil
}

// Worker runs Steps tool steps, then answers; every model step, tool step
// and turn end is logged to exec.log under the Worker's path.
type Worker struct {
	chat.Base
	model model.Model
}

func (w *Worker) ChatModel() model.Model {
	return loggedModel{m: w.model, child: w.Path().String()}
}
func (w *Worker) MaxSteps() int { return Steps + 2 }
func (w *Worker) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("step", "Do one step of the task.", func(ctx context.Context, in stepInput) (string, error) {
		xlog.line("tool", w.Path().String(), in.N)
		return fmt.Sprintf("step %d done", in.N), nil
	})}
}

// OnTurnEnd logs the end of the Worker's turn (the chat committed it
// before it calls this hook).
func (w *Worker) OnTurnEnd(ctx context.Context, r chat.TurnResult) {
	xlog.line("end", w.Path().String(), r.Outcome)
}

// loggedModel logs every model step of a Worker (numbered by the tool
// results the request already holds) before it streams.
type loggedModel struct {
	m     model.Model
	child string
}

func (l loggedModel) Stream(ctx context.Context, req *model.Request) iter.Seq2[model.Event, error] {
	xlog.line("model", l.child, scripted.CountToolResults(req))
	return l.m.Stream(ctx, req)
}

// ContinuesAnswers forwards the wrapped model's model.Continuer.
func (l loggedModel) ContinuesAnswers() bool {
	c, ok := l.m.(model.Continuer)
	return ok && c.ContinuesAnswers()
}

// task is the task a Worker's request is about: the "task" of its input
// (the user message is the input as indented JSON).
func task(req *model.Request) string {
	s := scripted.LastUserText(req)
	if i := strings.Index(s, `"task": "`); i >= 0 {
		s = s[i+len(`"task": "`):]
		if j := strings.Index(s, `"`); j >= 0 {
			return s[:j]
		}
	}
	return s
}

func main() {
	// ServeMain parses the flags; the data folder is needed before setup
	// opens the log, so it is looked up the same way.
	testenv.ServeMain(10*time.Millisecond, func(rt *agent.Runtime, delay time.Duration) error {
		data := flag.Lookup("data").Value.String()
		f, err := os.OpenFile(filepath.Join(data, ExecLog), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		xlog.f = f
		chat.Configure(rt, chat.Config{FlushInterval: 10 * time.Millisecond})
		agenttool.Install(rt, agenttool.Options{})
		parentModel := scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
			round := scripted.LastUserText(req)
			if scripted.LastIsToolResult(req) {
				return scripted.Reply{scripted.Text("Both workers finished " + round + ".")}
			}
			return scripted.Reply{scripted.Text("Splitting " + round + " in two. "),
				scripted.ToolCall("work", WorkInput{Task: round + " part a"}),
				scripted.ToolCall("work", WorkInput{Task: round + " part b"})}
		}), scripted.WithChunkSize(8), scripted.WithDelay(delay))
		workerModel := scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
			n, tk := scripted.CountToolResults(req), task(req)
			if n < Steps {
				return scripted.Reply{scripted.Text(StepText(tk, n+1)), scripted.ToolCall("step", stepInput{N: n + 1})}
			}
			return scripted.Reply{scripted.Text(FinalText(tk))}
		}), scripted.WithChunkSize(8), scripted.WithDelay(delay))
		for _, c := range []agent.Class{
			{Name: "Parent", New: func() agent.Agent { return &Parent{model: parentModel} }, Callable: []string{"ask", "runs"}, Public: true},
			{Name: "Worker", New: func() agent.Agent { return &Worker{model: workerModel} }},
		} {
			if err := rt.Register(c); err != nil {
				return err
			}
		}
		return nil
	})
}
