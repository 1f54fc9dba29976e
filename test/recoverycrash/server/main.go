// Command server is the agentry server of the chat recovery crash tests: a
// Chief chat agent that hands a task to a Looper child as an agent tool;
// the Looper's model streams a reply far too long to finish between two
// kills, and its class has a small chat recovery work budget
// (WorkBudget). It logs "agentry listening addr=http://…" like
// cmd/agentry (see testenv.ServeMain).
//
//	server --addr 127.0.0.1:0 --data DIR [--delay 40ms]
package main

import (
	"strings"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// WorkBudget is the Looper's MaxRecoveryWork.
const WorkBudget = 6

// TerminalMessage is the Looper's terminal message.
const TerminalMessage = "The looper could not recover and stopped."

// ReattachNoProgress is the Chief's re-attach no-progress window: far
// longer than a test waits, so a test that ends shows the Chief did not
// wait for it.
const ReattachNoProgress = time.Hour

// LoopInput is the input of the loop tool.
type LoopInput struct {
	Task string `json:"task"`
}

// Chief is the parent: its model calls the loop tool once, then answers.
type Chief struct {
	chat.Base
	model model.Model
}

// ChatModel returns the Chief's model.
func (c *Chief) ChatModel() model.Model { return c.model }

// Tools returns the loop tool.
func (c *Chief) Tools() []chat.Tool {
	return []chat.Tool{agenttool.AgentTool[LoopInput]("Looper", agenttool.ToolOptions{
		Name: "loop", Description: "Hand a task to a Looper.", DisplayName: "Looper"})}
}

// AgentToolReattachNoProgressTimeout is ReattachNoProgress.
func (c *Chief) AgentToolReattachNoProgressTimeout() time.Duration { return ReattachNoProgress }

// Looper streams a long reply; its recovery work budget is WorkBudget.
type Looper struct {
	chat.Base
	model model.Model
}

// ChatModel returns the Looper's model.
func (l *Looper) ChatModel() model.Model { return l.model }

// RecoveryBudgets sets WorkBudget and TerminalMessage.
func (l *Looper) RecoveryBudgets() chat.RecoveryBudgets {
	return chat.RecoveryBudgets{MaxRecoveryWork: WorkBudget, TerminalMessage: TerminalMessage}
}

func main() {
	testenv.ServeMain(40*time.Millisecond, func(rt *agent.Runtime, delay time.Duration) error {
		chat.Configure(rt, chat.Config{FlushInterval: 10 * time.Millisecond})
		agenttool.Install(rt, agenttool.Options{})
		chiefModel := scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
			if scripted.LastIsToolResult(req) {
				return scripted.Reply{scripted.Text("The looper did not finish.")}
			}
			return scripted.Reply{scripted.ToolCall("loop", LoopInput{Task: scripted.LastUserText(req)})}
		}), scripted.WithDelay(delay))
		long := strings.Repeat("The loop goes on and on. ", 200)
		looperModel := scripted.New(scripted.WithDefault(func(*model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text(long)}
		}), scripted.WithChunkSize(8), scripted.WithDelay(delay))
		for _, c := range []agent.Class{
			{Name: "Chief", New: func() agent.Agent { return &Chief{model: chiefModel} }, Public: true},
			{Name: "Looper", New: func() agent.Agent { return &Looper{model: looperModel} }},
		} {
			if err := rt.Register(c); err != nil {
				return err
			}
		}
		return nil
	})
}
