package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
)

// LoopOptions configure the model/tool loop.
type LoopOptions struct {
	Model  model.Model
	System string
	Tools  []Tool
	// MaxSteps caps model calls in the turn; zero means 10.
	MaxSteps int
}

func (c *core) loopOptions() LoopOptions {
	o := LoopOptions{Model: c.cfg.Model}
	if p, ok := c.self.(ModelProvider); ok {
		if m := p.ChatModel(); m != nil {
			o.Model = m
		}
	}
	if p, ok := c.self.(SystemPrompter); ok {
		o.System = p.SystemPrompt()
	}
	if p, ok := c.self.(ToolProvider); ok {
		o.Tools = p.Tools()
	}
	if p, ok := c.self.(StepLimiter); ok {
		o.MaxSteps = p.MaxSteps()
	}
	return o
}

// ErrNoModel is returned by a declarative turn when neither the agent nor
// the runtime configuration names a model.
var ErrNoModel = errors.New("chat: no model: implement ChatModel or set chat.Config.Model")

// RunLoop runs the model/tool loop in this turn: call the model with the
// transcript and the message so far, stream its text, reasoning and tool
// calls, execute the calls server-side (in parallel when the model asks for
// several) and feed the results back, until the model answers without tool
// calls or the step limit is reached. Completed steps of a recovered turn
// count toward the limit and are not run again.
func (tt *Turn) RunLoop(ctx context.Context, o LoopOptions) error {
	if o.Model == nil {
		return ErrNoModel
	}
	if o.MaxSteps <= 0 {
		o.MaxSteps = 10
	}
	tools, specs, err := loopTools(o.Tools, tt.Body)
	if err != nil {
		return err
	}
	done := countSteps(tt.modelView())
	finish := model.FinishStop
	// A continuation first runs the calls its answers approved (approval.go).
	if _, err := tt.runAnswered(ctx, tools); err != nil {
		return err
	}
	if tt.Recovering && tt.t.inStep() {
		// Recovered in the middle of executing a step's tool calls: run the
		// ones without a result (asking for approval again where it is
		// needed), then go on with the next step.
		if _, err := tt.dispatchCalls(ctx, pendingCalls(tt.modelView(), tools), tools); err != nil {
			return err
		}
		if err := tt.t.markTools(ctx, false); err != nil {
			return err
		}
		if err := tt.Write(message.FinishStep()); err != nil {
			return err
		}
	}
	if len(waitingCalls(tt.modelView())) > 0 {
		// The message waits for answers (a recovered turn that had asked):
		// the turn ends waiting; the answers continue it.
		return tt.Write(message.Finish(model.FinishToolCalls))
	}
	for step := done; step < o.MaxSteps; step++ {
		sys, conv := message.ToModel(append(append([]message.Message(nil), tt.Messages...), tt.modelView()))
		if o.System != "" {
			if sys != "" {
				sys = o.System + "\n\n" + sys
			} else {
				sys = o.System
			}
		}
		req := &model.Request{System: sys, Messages: conv, Tools: specs}
		if err := tt.Write(message.StartStep()); err != nil {
			return err
		}
		var calls []pendingCall
		var reason string
		// Waiting for the model is an await point: the instance takes its
		// other inputs meanwhile.
		err := agent.Await(ctx, func() error {
			var err error
			calls, reason, err = tt.streamStep(ctx, o.Model, req, tools)
			return err
		})
		if err != nil {
			return err
		}
		finish = reason
		waiting := false
		if len(calls) > 0 {
			// The step's usage goes out before its tools run: an awaiting
			// parent holds it against the run's budget at once. A step
			// without calls is the turn's last, and its finish chunk,
			// written next, carries the usage itself.
			if err := tt.t.writeUsage(); err != nil {
				return err
			}
			if err := tt.t.markTools(ctx, true); err != nil {
				return err
			}
			// Calls that wait for an answer (approval, a client tool) are
			// not executed; the others are.
			if waiting, err = tt.dispatchCalls(ctx, calls, tools); err != nil {
				return err
			}
			if err := tt.t.markTools(ctx, false); err != nil {
				return err
			}
		}
		if err := tt.Write(message.FinishStep()); err != nil {
			return err
		}
		if len(calls) == 0 || waiting {
			break
		}
	}
	return tt.Write(message.Finish(finish))
}

// modelView is the message so far as the model sees it: a retried turn's
// earlier attempt and what a restart cut short are left out (clients keep
// them; the model answers anew). Its steps are the ones that count.
func (tt *Turn) modelView() message.Message {
	m := tt.Message()
	m.Parts = message.Visible(m.Parts[min(tt.t.hidden, len(m.Parts)):])
	return m
}

// countSteps counts completed steps (step-start parts) in a message. A
// step a restart cut and the model continued (marked with a
// message.ContinuedStepName data part) is one model step with the step
// that continues it, and is not counted.
func countSteps(m message.Message) int {
	n := 0
	for _, p := range m.Parts {
		switch p.Type {
		case message.PartStepStart:
			n++
		case message.DataPartPrefix + message.ContinuedStepName:
			n--
		}
	}
	return n
}

type pendingCall struct {
	id, name string
	input    json.RawMessage
	valid    bool
}

// streamStep streams one model call into the message and returns the tool
// calls it asked for.
func (tt *Turn) streamStep(ctx context.Context, m model.Model, req *model.Request, tools map[string]Tool) ([]pendingCall, string, error) {
	var textID, reasoningID string
	started := map[string]bool{}
	var calls []pendingCall
	finish := model.FinishStop
	closeText := func() error {
		if textID != "" {
			id := textID
			textID = ""
			return tt.Write(message.TextEnd(id))
		}
		return nil
	}
	closeReasoning := func() error {
		if reasoningID != "" {
			id := reasoningID
			reasoningID = ""
			return tt.Write(message.ReasoningEnd(id))
		}
		return nil
	}
	ids := tt.callIDs()
	for ev, err := range tt.t.c.streamModel(ctx, m, req) {
		if ev.ToolCallID != "" {
			ev.ToolCallID = ids.of(ev.ToolCallID)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, "", context.Cause(ctx)
			}
			_ = closeText()
			_ = closeReasoning()
			tt.t.errText = tt.t.c.turnError(tt.t, publicModelError(err))
			return nil, "", fmt.Errorf("%w: %v", errTurnError, err)
		}
		var werr error
		switch ev.Kind {
		case model.EventTextDelta:
			if ev.Text == "" {
				continue
			}
			if werr = closeReasoning(); werr != nil {
				break
			}
			if textID == "" {
				textID = newPartID()
				if werr = tt.Write(message.TextStart(textID)); werr != nil {
					break
				}
			}
			werr = tt.Write(message.TextDelta(textID, ev.Text))
		case model.EventReasoningDelta:
			if ev.Text == "" {
				continue
			}
			if werr = closeText(); werr != nil {
				break
			}
			if reasoningID == "" {
				reasoningID = newPartID()
				if werr = tt.Write(message.ReasoningStart(reasoningID)); werr != nil {
					break
				}
			}
			werr = tt.Write(message.ReasoningDelta(reasoningID, ev.Text))
		case model.EventToolCallStart:
			if werr = closeText(); werr == nil {
				werr = closeReasoning()
			}
			if werr == nil && !started[ev.ToolCallID] {
				started[ev.ToolCallID] = true
				werr = tt.Write(message.ToolInputStart(ev.ToolCallID, ev.ToolName))
			}
		case model.EventToolCallDelta:
			if started[ev.ToolCallID] && ev.InputDelta != "" {
				werr = tt.Write(message.ToolInputDelta(ev.ToolCallID, ev.InputDelta))
			}
		case model.EventToolCall:
			if werr = closeText(); werr == nil {
				werr = closeReasoning()
			}
			if werr != nil {
				break
			}
			input := ev.Input
			if len(input) == 0 {
				input = json.RawMessage(`{}`)
			}
			pc := pendingCall{id: ev.ToolCallID, name: ev.ToolName, input: input}
			tl, known := tools[ev.ToolName]
			var verr error
			switch {
			case !known:
				verr = fmt.Errorf("unknown tool %q", ev.ToolName)
			case !json.Valid(input):
				verr = errors.New("tool input is not valid JSON")
				input, _ = json.Marshal(string(input))
			default:
				verr = tl.Validate(input)
			}
			if verr != nil {
				ch := message.ToolInputError(ev.ToolCallID, ev.ToolName, input, verr.Error())
				werr = tt.Write(ch)
			} else {
				pc.valid = true
				ch := message.ToolInputAvailable(ev.ToolCallID, ev.ToolName, input)
				ch.Title = tl.Title
				werr = tt.Write(ch)
			}
			calls = append(calls, pc)
		case model.EventFinish:
			tt.t.addModelUsage(m, ev.Usage)
			if ev.FinishReason != "" {
				finish = ev.FinishReason
			}
		}
		if werr != nil {
			return nil, "", werr
		}
	}
	if err := closeText(); err != nil {
		return nil, "", err
	}
	if err := closeReasoning(); err != nil {
		return nil, "", err
	}
	return calls, finish, nil
}

// callIDMap gives each tool call id a model streams in one step the id the
// conversation knows it by: the model's own, unless an earlier call of the
// conversation has it (a model that repeats an id, such as the scripted
// one asked the same request again after a restart cut its call), in which
// case "<id>_<n>" with the smallest n > 1 that is free. No conversation
// holds two calls with one id, which providers reject.
type callIDMap struct {
	used   map[string]bool
	mapped map[string]string
}

// callIDs returns the map of a new step: every tool call id of the
// transcript and of the message so far, parts left out of the model's view
// included, is taken.
func (tt *Turn) callIDs() *callIDMap {
	used := map[string]bool{}
	add := func(m message.Message) {
		for _, p := range m.Parts {
			if p.IsTool() && p.ToolCallID != "" {
				used[p.ToolCallID] = true
			}
		}
	}
	for _, m := range tt.Messages {
		add(m)
	}
	add(tt.Message())
	return &callIDMap{used: used, mapped: map[string]string{}}
}

func (c *callIDMap) of(id string) string {
	if to, ok := c.mapped[id]; ok {
		return to
	}
	to := id
	for n := 2; c.used[to]; n++ {
		to = fmt.Sprintf("%s_%d", id, n)
	}
	c.used[to] = true
	c.mapped[id] = to
	return to
}

// executeCalls runs the valid calls in parallel and writes each result as it
// arrives. Each call is one input of the instance: calls interleave only at
// their await points (an agent-tool run, agent.Await).
func (tt *Turn) executeCalls(ctx context.Context, calls []pendingCall, tools map[string]Tool) error {
	return agent.Await(ctx, func() error { return tt.runCalls(agent.Unheld(ctx), calls, tools) })
}

func (tt *Turn) runCalls(ctx context.Context, calls []pendingCall, tools map[string]Tool) error {
	var mu sync.Mutex // guards firstErr
	var wg sync.WaitGroup
	var firstErr error
	self := tt.t.c.self
	for _, pc := range calls {
		if !pc.valid {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			tctx, endStream := toolContext(ctx, ToolCall{ID: pc.id, Name: pc.name, Input: pc.input})
			var out any
			err := agent.Enter(tctx, self, func(ctx context.Context) error {
				var err error
				out, err = tools[pc.name].Execute(ctx, pc.input)
				return err
			})
			endStream()
			var ch message.Chunk
			if err != nil {
				ch = message.ToolOutputError(pc.id, err.Error())
			} else if raw, merr := json.Marshal(out); merr != nil {
				ch = message.ToolOutputError(pc.id, "tool output is not JSON: "+merr.Error())
			} else {
				ch = message.ToolOutputAvailable(pc.id, raw)
			}
			if werr := tt.Write(ch); werr != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = werr
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// pendingCalls returns the tool calls of the message's last step that have
// valid input but no result: the calls a crash interrupted.
func pendingCalls(m message.Message, tools map[string]Tool) []pendingCall {
	last := -1
	for i, p := range m.Parts {
		if p.Type == message.PartStepStart {
			last = i
		}
	}
	if last < 0 {
		return nil
	}
	var out []pendingCall
	for _, p := range m.Parts[last+1:] {
		if !p.IsTool() || !awaitsResult(p) {
			continue
		}
		if tl, known := tools[p.ToolName()]; !known || tl.client {
			continue // a client tool's call waits for the client
		}
		out = append(out, pendingCall{id: p.ToolCallID, name: p.ToolName(), input: p.Input, valid: true})
	}
	return out
}
