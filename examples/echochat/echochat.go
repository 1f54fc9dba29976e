// Package echochat is the chat layer's demo agent: EchoChat, a declarative
// chat agent on the scripted model. It answers "You said: <text>", streamed
// in chunks of at most 8 characters; a message containing "use the clock
// tool" makes it call the server tool clock first and answer with its
// result.
package echochat

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"
	_ "time/tzdata" // zones for the clock tool on machines without tzdata

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// EchoChat is a declarative chat agent: a scripted model and one tool.
type EchoChat struct {
	chat.Base
	model model.Model
	clock clockwork.Clock
}

// Options configure the class.
type Options struct {
	// Delay between streamed chunks; the demo uses 20 ms.
	Delay time.Duration
	// Clock drives the delay and the clock tool; nil means the real clock.
	Clock clockwork.Clock
}

// Class returns the EchoChat class.
func Class(o Options) agent.Class {
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	m := Model(o)
	return agent.Class{
		Name:   "EchoChat",
		New:    func() agent.Agent { return &EchoChat{model: m, clock: o.Clock} },
		Public: true,
	}
}

// ChatModel returns the scripted model.
func (e *EchoChat) ChatModel() model.Model { return e.model }

// SystemPrompt describes the agent.
func (e *EchoChat) SystemPrompt() string {
	return "You echo what the user says. Use the clock tool when asked."
}

// ClockInput is the clock tool's input.
type ClockInput struct {
	Zone string `json:"zone" jsonschema:"IANA time zone, such as UTC or Europe/Paris"`
}

// ClockOutput is the clock tool's result.
type ClockOutput struct {
	Zone string `json:"zone"`
	Time string `json:"time"`
}

// Tools returns the clock tool.
func (e *EchoChat) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("clock", "Tell the current time in a time zone.",
		func(ctx context.Context, in ClockInput) (ClockOutput, error) {
			loc, err := time.LoadLocation(in.Zone)
			if err != nil {
				return ClockOutput{}, fmt.Errorf("unknown time zone %q", in.Zone)
			}
			return ClockOutput{Zone: in.Zone, Time: e.clock.Now().In(loc).Format("15:04:05 MST")}, nil
		})}
}

var zoneRe = regexp.MustCompile(`\b(?:in|zone)\s+([A-Za-z_]+(?:/[A-Za-z_]+)?)`)

// Model returns EchoChat's scripted model.
func Model(o Options) *scripted.Model {
	return scripted.New(
		scripted.WithChunkSize(8),
		scripted.WithDelay(o.Delay),
		scripted.WithClock(o.Clock),
		scripted.WithRules(
			scripted.Rule{
				Name:  "clock-result",
				Match: scripted.LastIsToolResult,
				Reply: func(req *model.Request) scripted.Reply {
					results := scripted.ToolResults(req)
					if len(results) == 0 {
						return scripted.Reply{scripted.Text("The clock said nothing.")}
					}
					if r := results[0]; r.IsError {
						return scripted.Reply{scripted.Text("The clock tool failed: " + string(r.Output))}
					}
					var out ClockOutput
					_ = json.Unmarshal(results[0].Output, &out)
					return scripted.Reply{scripted.Text(fmt.Sprintf("The time in %s is %s.", out.Zone, out.Time))}
				},
			},
			scripted.Rule{
				Name:  "clock-call",
				Match: scripted.LastUserContains("use the clock tool"),
				Reply: func(req *model.Request) scripted.Reply {
					zone := "UTC"
					if m := zoneRe.FindStringSubmatch(scripted.LastUserText(req)); m != nil && !strings.EqualFold(m[1], "the") {
						zone = m[1]
					}
					return scripted.Reply{scripted.ToolCall("clock", ClockInput{Zone: zone})}
				},
			},
		),
		scripted.WithDefault(func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("You said: " + scripted.LastUserText(req))}
		}),
	)
}
