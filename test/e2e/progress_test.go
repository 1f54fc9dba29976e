package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// progStep is one step the worker performs inside its turn, handed over by
// the parent's step callable and acknowledged when done.
type progStep struct {
	Kind string       `json:"kind"` // progress, milestone, finish
	Args progStepArgs `json:"args"`
	done chan error
}

type progStepArgs struct {
	Name     string   `json:"name,omitempty"`
	Fraction *float64 `json:"fraction,omitempty"`
	Phase    string   `json:"phase,omitempty"`
	Message  string   `json:"message,omitempty"`
}

// progParent dispatches the background run and relays the script's steps
// to its worker: every timing decision comes from the script, through RPC.
type progParent struct {
	agent.Base
	steps chan progStep
}

// Start dispatches the detached run and returns its id.
func (p *progParent) Start(ctx context.Context) (string, error) {
	res, err := agenttool.RunAgentTool(ctx, p, "ProgWorker", agenttool.RunOptions{Input: "research HTTP/3", RunID: "bg-1",
		Detached: &agenttool.DetachedOptions{}})
	if err != nil {
		return "", err
	}
	if res.Status != agenttool.StatusRunning {
		return "", errors.New("detached dispatch answered " + string(res.Status))
	}
	return res.RunID, nil
}

// Step has the worker perform one step and returns when it is done.
func (p *progParent) Step(ctx context.Context, kind string, args progStepArgs) (bool, error) {
	s := progStep{Kind: kind, Args: args, done: make(chan error, 1)}
	select {
	case p.steps <- s:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	select {
	case err := <-s.done:
		return err == nil, err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// progWorker is the background child: it runs the steps in its turn.
type progWorker struct {
	chat.Base
	steps chan progStep
}

func (w *progWorker) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case s := <-w.steps:
			var err error
			switch s.Kind {
			case "progress":
				err = agenttool.ReportProgress(ctx, agenttool.Progress{Fraction: s.Args.Fraction, Phase: s.Args.Phase, Message: s.Args.Message})
			case "milestone":
				err = agenttool.ReportProgress(ctx, agenttool.Progress{Milestone: s.Args.Name, Fraction: s.Args.Fraction, Phase: s.Args.Phase, Message: s.Args.Message})
			case "finish":
				err = t.WriteText("Report ready")
				s.done <- err
				return err
			default:
				err = errors.New("unknown step " + s.Kind)
			}
			s.done <- err
		}
	}
}

// TestDetachedProgress runs test/npm/progress.mjs: a background run's
// progress (fraction, phase, message) and milestones reach the real
// useAgentToolEvents reducer live, a fresh connection rebuilds them from
// the connect replay, later live progress still reaches it, and the run
// completes.
func TestDetachedProgress(t *testing.T) {
	steps := make(chan progStep)
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{
			{Name: "ProgParent", New: func() agent.Agent { return &progParent{steps: steps} }, Callable: []string{"start", "step"}, Public: true},
			{Name: "ProgWorker", New: func() agent.Agent { return &progWorker{steps: steps} }},
		},
		Setup: withAgentTools,
	})
	runScript(t, 90*time.Second, "PASS progress", "progress.mjs", env.Host, "e2e")
	ctx := context.Background()
	parent, err := env.RT.Get(ctx, agent.Root("ProgParent", "e2e"))
	if err != nil {
		t.Fatal(err)
	}
	run, ok, err := agenttool.GetAgentToolRun(ctx, parent, "bg-1")
	if err != nil || !ok || run.Status != agenttool.StatusCompleted || run.Summary != "Report ready" {
		t.Fatalf("run = %+v, %v, %v", run, ok, err)
	}
	in, err := agenttool.InspectAgentToolRun(ctx, parent, "bg-1")
	if err != nil || in == nil || len(in.Milestones) != 2 || in.Milestones[0].Name != "sources-gathered" || in.Milestones[1].Name != "draft-ready" {
		t.Fatalf("inspection = %+v, %v", in, err)
	}
}
