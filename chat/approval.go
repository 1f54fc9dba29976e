package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// Tool approval and client-side tools.
//
// Both follow the AI SDK: a call that needs the user's approval, or that a
// client-side tool must answer, is not executed in the turn. The turn
// streams the call (and for an approval a tool-approval-request chunk),
// closes the step and ends — completed, with the message waiting for the
// answer (TurnResult.Waiting). Nothing holds the instance meanwhile, and
// the waiting message is in the stored transcript, so a restart keeps it
// waiting. The answer (AddToolApprovalResponse, AddToolOutput, or the wire
// frames cf_agent_tool_approval and cf_agent_tool_result) updates the
// tool part durably, and once every call of the step is answered it starts
// a continuation turn in the same transaction: the continuation runs the
// approved calls, writes tool-output-denied for the denied ones, and asks
// the model again.

// ApprovalFunc decides whether a tool call needs the user's approval. An
// error fails the call (the model sees it as the tool's error).
type ApprovalFunc func(ctx context.Context, input json.RawMessage) (bool, error)

// RequireApproval is an ApprovalFunc that asks for approval of every call.
func RequireApproval(context.Context, json.RawMessage) (bool, error) { return true, nil }

// ApprovalIf returns an ApprovalFunc that decodes the call's input as In
// and asks fn. Input that does not decode needs approval (the call would
// fail validation anyway).
func ApprovalIf[In any](fn func(ctx context.Context, in In) bool) ApprovalFunc {
	return func(ctx context.Context, raw json.RawMessage) (bool, error) {
		var in In
		if err := json.Unmarshal(raw, &in); err != nil {
			return true, nil
		}
		return fn(ctx, in), nil
	}
}

// WithApproval returns a copy of t whose calls need approval as need
// decides (RequireApproval for all of them).
func (t Tool) WithApproval(need ApprovalFunc) Tool {
	t.NeedsApproval = need
	return t
}

// NewClientTool returns a client-side tool: the model sees its name,
// description and the JSON Schema inferred from In, but the server never
// executes it. A call to it ends the turn waiting for the client's output
// (useAgentChat's onToolCall and addToolOutput; AddToolOutput in Go).
func NewClientTool[In any](name, description string) Tool {
	schema, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("chat: client tool %s: infer input schema: %v", name, err))
	}
	t := Tool{Name: name, Description: description, schema: schema, client: true}
	t.resolve()
	return t
}

// IsClient reports whether t is a client-side tool (NewClientTool, or one
// a client declared in its request's clientTools).
func (t Tool) IsClient() bool { return t.client }

// Limits on the client tools a request may declare.
const (
	// MaxClientTools is the most tools one request's clientTools may list.
	MaxClientTools = 64
	// MaxClientToolSchema is the most bytes of one client tool's schema.
	MaxClientToolSchema = 16 << 10
)

var toolNamePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ClientToolSchema is a client-side tool as a request body's clientTools
// lists it (useAgentChat's extractClientToolSchemas).
type ClientToolSchema struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// clientToolsOf returns the client tools a turn's request body declares.
func clientToolsOf(body json.RawMessage) ([]Tool, error) {
	if len(body) == 0 {
		return nil, nil
	}
	var b struct {
		ClientTools json.RawMessage `json:"clientTools"`
	}
	if json.Unmarshal(body, &b) != nil || len(b.ClientTools) == 0 || string(b.ClientTools) == "null" {
		return nil, nil
	}
	var list []ClientToolSchema
	if err := json.Unmarshal(b.ClientTools, &list); err != nil {
		return nil, fmt.Errorf("clientTools is not a list of tools: %w", err)
	}
	if len(list) > MaxClientTools {
		return nil, fmt.Errorf("clientTools lists %d tools; the limit is %d", len(list), MaxClientTools)
	}
	out := make([]Tool, 0, len(list))
	for _, ct := range list {
		tl, err := ClientToolFromSchema(ct)
		if err != nil {
			return nil, err
		}
		out = append(out, tl)
	}
	return out, nil
}

// ClientToolFromSchema builds a client-side tool from its wire form. The
// name must be 1–64 letters, digits, '_' or '-'; the parameters, when
// given, a JSON Schema object of at most MaxClientToolSchema bytes.
func ClientToolFromSchema(ct ClientToolSchema) (Tool, error) {
	if !toolNamePattern.MatchString(ct.Name) {
		return Tool{}, fmt.Errorf("client tool name %q: want 1-64 letters, digits, '_' or '-'", ct.Name)
	}
	if len(ct.Parameters) > MaxClientToolSchema {
		return Tool{}, fmt.Errorf("client tool %s: schema of %d bytes; the limit is %d", ct.Name, len(ct.Parameters), MaxClientToolSchema)
	}
	schema := &jsonschema.Schema{Type: "object"}
	if len(ct.Parameters) > 0 && string(ct.Parameters) != "null" {
		schema = &jsonschema.Schema{}
		if err := json.Unmarshal(ct.Parameters, schema); err != nil {
			return Tool{}, fmt.Errorf("client tool %s: schema: %w", ct.Name, err)
		}
	}
	r, err := schema.Resolve(nil)
	if err != nil {
		return Tool{}, fmt.Errorf("client tool %s: schema: %w", ct.Name, err)
	}
	return Tool{Name: ct.Name, Description: ct.Description, schema: schema, resolved: r, client: true}, nil
}

// needsApproval asks t's ApprovalFunc about a call, as one input of the
// instance.
func (tt *Turn) needsApproval(ctx context.Context, t Tool, input json.RawMessage) (bool, error) {
	if t.NeedsApproval == nil {
		return false, nil
	}
	var need bool
	self := tt.t.c.self
	err := agent.Await(ctx, func() error {
		return agent.Enter(agent.Unheld(ctx), self, func(ctx context.Context) error {
			return safeCall(func() error {
				var err error
				need, err = t.NeedsApproval(ctx, input)
				return err
			})
		})
	})
	return need, err
}

// dispatchCalls executes a step's valid calls, except those that wait for
// an answer: a client tool's call is left waiting for its output, and a
// call that needs approval gets a tool-approval-request. It reports
// whether any call waits.
func (tt *Turn) dispatchCalls(ctx context.Context, calls []pendingCall, tools map[string]Tool) (bool, error) {
	var run []pendingCall
	waiting := false
	for _, pc := range calls {
		if !pc.valid {
			continue
		}
		tl := tools[pc.name]
		if tl.client {
			waiting = true
			continue
		}
		need, err := tt.needsApproval(ctx, tl, pc.input)
		switch {
		case ctx.Err() != nil:
			return false, context.Cause(ctx)
		case err != nil:
			if werr := tt.Write(message.ToolOutputError(pc.id, "approval check failed: "+err.Error())); werr != nil {
				return false, werr
			}
		case need:
			waiting = true
			if err := tt.Write(message.ToolApprovalRequest(newID(), pc.id)); err != nil {
				return false, err
			}
		default:
			run = append(run, pc)
		}
	}
	if len(run) > 0 {
		if err := tt.executeCalls(ctx, run, tools); err != nil {
			return false, err
		}
	}
	return waiting, nil
}

// runAnswered executes the approved calls of the message's last step that
// have no result yet, and streams tool-output-denied for the denied ones:
// the first thing a continuation does after an approval. Each call is
// announced again (tool-input-available) before its result: the
// continuation's stream may be read from its own beginning — useAgentChat
// resumes it into a message of its own until the transcript merges it,
// and an agent-tool parent's timeline shows it — and a result must follow
// its call there. It reports whether there was anything to do.
func (tt *Turn) runAnswered(ctx context.Context, tools map[string]Tool) (bool, error) {
	var run []pendingCall
	var denied []string
	for _, p := range lastStep(tt.modelView()) {
		if !p.IsTool() {
			continue
		}
		answered := p.State == message.StateApprovalResponded || p.State == message.StateOutputDenied
		if answered {
			ch := message.ToolInputAvailable(p.ToolCallID, p.ToolName(), callInputOf(p))
			ch.Title = p.Title
			if p.IsDynamicTool() {
				ch.Dynamic = ptrTrue()
			}
			if err := tt.Write(ch); err != nil {
				return false, err
			}
		}
		switch {
		case p.State == message.StateApprovalResponded && p.Approval != nil && p.Approval.Approved != nil && *p.Approval.Approved:
			pc := pendingCall{id: p.ToolCallID, name: p.ToolName(), input: p.Input}
			if tl, ok := tools[pc.name]; ok && !tl.client {
				pc.valid = true
				run = append(run, pc)
			} else {
				// Approved, but the tool is gone: the model gets an error.
				if err := tt.Write(message.ToolOutputError(p.ToolCallID, fmt.Sprintf("unknown tool %q", pc.name))); err != nil {
					return false, err
				}
			}
		case p.State == message.StateApprovalResponded, p.State == message.StateOutputDenied:
			// Denied: streamed once more (an idempotent chunk) so that
			// clients that only read the stream — an agent-tool parent's
			// timeline — see the denial too.
			denied = append(denied, p.ToolCallID)
		}
	}
	for _, id := range denied {
		if err := tt.Write(message.ToolOutputDenied(id)); err != nil {
			return false, err
		}
	}
	if len(run) == 0 {
		return len(denied) > 0, nil
	}
	if err := tt.t.markTools(ctx, true); err != nil {
		return false, err
	}
	if err := tt.executeCalls(ctx, run, tools); err != nil {
		return false, err
	}
	return true, tt.t.markTools(ctx, false)
}

// lastStep returns the parts of m's last step.
func lastStep(m message.Message) []message.Part {
	last := 0
	for i, p := range m.Parts {
		if p.Type == message.PartStepStart {
			last = i
		}
	}
	return m.Parts[last:]
}

// WaitingCall is a tool call a turn ended waiting for: its approval, or a
// client tool's output.
type WaitingCall struct {
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Input      json.RawMessage `json:"input,omitempty"`
	// Approval is true when the call waits for the user's approval
	// (state approval-requested), false when it waits for its output
	// (a client tool, state input-available).
	Approval bool `json:"approval"`
	// ApprovalID is the approval request's id.
	ApprovalID string `json:"approvalId,omitempty"`
}

// waitingCalls returns the calls of m's last step that wait for an answer.
func waitingCalls(m message.Message) []WaitingCall {
	var out []WaitingCall
	for _, p := range lastStep(m) {
		if !p.IsTool() {
			continue
		}
		switch p.State {
		case message.StateApprovalRequested:
			w := WaitingCall{ToolCallID: p.ToolCallID, ToolName: p.ToolName(), Input: p.Input, Approval: true}
			if p.Approval != nil {
				w.ApprovalID = p.Approval.ID
			}
			out = append(out, w)
		case message.StateInputAvailable:
			out = append(out, WaitingCall{ToolCallID: p.ToolCallID, ToolName: p.ToolName(), Input: p.Input})
		}
	}
	return out
}

// Errors of the tool answers.
var (
	// ErrUnknownToolCall refuses an answer to a tool call that the last
	// assistant message does not have.
	ErrUnknownToolCall = errors.New("chat: no such tool call in the last assistant message")
	// ErrNotWaiting refuses an answer to a tool call that does not wait
	// for it (answered already, or never asked).
	ErrNotWaiting = errors.New("chat: the tool call is not waiting for this answer")
	// ErrTurnRunning refuses an answer while a turn runs or is queued: the
	// message it would change is being written.
	ErrTurnRunning = errors.New("chat: a turn is running; answer the tool call when it ends")
)

// AnswerOptions qualify a tool answer.
type AnswerOptions struct {
	// AutoContinue starts a continuation turn once every call of the
	// step is answered (useAgentChat's default).
	AutoContinue bool
	// ClientTools replaces the client tools the continuation offers the
	// model (a cf_agent_tool_result's clientTools); nil keeps those of the
	// turn that asked.
	ClientTools []ClientToolSchema
}

// AddToolApprovalResponse answers the approval request of the tool call
// toolCallID in the last assistant message (the AI SDK's
// addToolApprovalResponse; the wire's cf_agent_tool_approval). An approved
// call goes to approval-responded and runs in the continuation; a denied one
// goes to output-denied and the model is told so. It returns the id of the
// continuation turn it started, if any.
func (b *Base) AddToolApprovalResponse(ctx context.Context, toolCallID string, approved bool, reason string, opts AnswerOptions) (string, error) {
	return b.c.answer(ctx, nil, toolCallID, opts, func(p *message.Part) error {
		if p.State != message.StateApprovalRequested {
			return ErrNotWaiting
		}
		if p.Approval == nil {
			p.Approval = &message.Approval{ID: toolCallID}
		}
		p.Approval.Approved = &approved
		p.Approval.Reason = reason
		if approved {
			p.State = message.StateApprovalResponded
		} else {
			p.State = message.StateOutputDenied
		}
		return nil
	})
}

// AddToolOutput answers a client-side tool's call toolCallID in the last
// assistant message with its output, or with errText when errText is not
// empty (the AI SDK's addToolOutput; the wire's cf_agent_tool_result). It
// returns the id of the continuation turn it started, if any.
func (b *Base) AddToolOutput(ctx context.Context, toolCallID string, output json.RawMessage, errText string, opts AnswerOptions) (string, error) {
	return b.c.answer(ctx, nil, toolCallID, opts, outputAnswer(output, errText))
}

func outputAnswer(output json.RawMessage, errText string) func(p *message.Part) error {
	return func(p *message.Part) error {
		if p.State != message.StateInputAvailable {
			return ErrNotWaiting
		}
		if errText != "" {
			p.State, p.ErrorText = message.StateOutputError, errText
			return nil
		}
		if len(output) == 0 {
			output = json.RawMessage("null")
		}
		if !json.Valid(output) {
			return fmt.Errorf("chat: tool output is not JSON")
		}
		p.State, p.Output = message.StateOutputAvailable, append(json.RawMessage(nil), output...)
		return nil
	}
}

// answer applies an answer to the tool part toolCallID of the last
// assistant message, and stores it — together with the continuation turn
// when opts.AutoContinue is set and no call of the step waits any more, in
// one transaction. Every connection gets cf_agent_message_updated before
// the continuation streams.
func (c *core) answer(ctx context.Context, origin *agent.Conn, toolCallID string, opts AnswerOptions, apply func(p *message.Part) error) (string, error) {
	if id := c.endingWith(toolCallID); id != "" {
		// The turn that asked is still ending (its request reached the
		// clients before its end was stored): the answer waits for that
		// end, an await point.
		if _, err := c.b.WaitTurn(ctx, id); err != nil {
			return "", fmt.Errorf("chat: wait for the turn that asked: %w", err)
		}
	}
	c.acceptMu.Lock()
	defer c.acceptMu.Unlock()
	c.mu.Lock()
	busy := c.active != nil || len(c.queue) > 0
	msgs := append([]message.Message(nil), c.msgs...)
	c.mu.Unlock()
	last := lastAssistant(msgs)
	idx := -1
	if last != nil {
		for j, p := range last.Parts {
			if p.IsTool() && p.ToolCallID == toolCallID {
				idx = j
			}
		}
	}
	if idx < 0 {
		return "", ErrUnknownToolCall
	}
	if busy {
		return "", ErrTurnRunning
	}
	m := last.Clone()
	if err := apply(&m.Parts[idx]); err != nil {
		return "", err
	}
	msgs[len(msgs)-1] = m
	updated := func() {
		c.b.Broadcast(struct {
			Type    string          `json:"type"`
			Message message.Message `json:"message"`
		}{wire.MessageUpdated, m})
	}
	if !opts.AutoContinue || len(waitingCalls(m)) > 0 {
		// Stored alone: another answer (or a request) goes on from it.
		plan, err := encodeMessages(len(msgs)-1, []message.Message{m})
		if err != nil {
			return "", fmt.Errorf("chat: store tool answer: %w", err)
		}
		err = c.b.DB().Update(ctx, func(tx store.Tx) error { return plan.apply(ctx, tx, c.iid) })
		c.stored.wrote(plan, err)
		if err != nil {
			return "", fmt.Errorf("chat: store tool answer: %w", err)
		}
		c.mu.Lock()
		if n := len(c.msgs); n > 0 && c.msgs[n-1].ID == m.ID {
			c.msgs[n-1] = m
		}
		c.mu.Unlock()
		updated()
		return "", nil
	}
	var body json.RawMessage
	if opts.ClientTools != nil {
		body, _ = json.Marshal(map[string]any{"clientTools": opts.ClientTools})
	}
	return c.acceptLocked(ctx, acceptRequest{replace: msgs, continuation: true, body: body, committed: updated, origin: origin})
}

// loopTools returns the loop's tools by name and their specs: the agent's
// tools, then the client tools of the request body (a server tool of the
// same name wins).
func loopTools(own []Tool, body json.RawMessage) (map[string]Tool, []model.ToolSpec, error) {
	client, err := clientToolsOf(body)
	if err != nil {
		// The client's own request: it may read why.
		return nil, nil, &agent.PublicError{Message: "bad clientTools: " + err.Error(), Err: err}
	}
	tools := make(map[string]Tool, len(own)+len(client))
	specs := make([]model.ToolSpec, 0, len(own)+len(client))
	for _, list := range [][]Tool{own, client} {
		for _, tl := range list {
			if _, dup := tools[tl.Name]; dup {
				continue
			}
			tools[tl.Name] = tl
			specs = append(specs, tl.Spec())
		}
	}
	return tools, specs, nil
}

// inStep reports whether the stream has a step open (started, not
// finished).
func (t *turn) inStep() bool {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	return t.stepOpen
}

// NextTurn waits for the turn that continues the message of the turn
// streamID (the continuation an answer to its waiting calls starts) and
// returns its id: at once if one was accepted already. Agent tools use it
// to follow a child's run through its waits. Waiting is an await point.
func (b *Base) NextTurn(ctx context.Context, streamID string) (string, error) {
	c := b.c
	ch := make(chan string, 1)
	c.mu.Lock()
	c.next[streamID] = append(c.next[streamID], ch)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		list := c.next[streamID]
		for i, w := range list {
			if w == ch {
				list = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(c.next, streamID)
		} else {
			c.next[streamID] = list
		}
		c.mu.Unlock()
	}()
	var id, status string
	err := c.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		id, status, err = nextStream(ctx, tx, c.iid, streamID)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("chat: next turn of %s: %w", streamID, err)
	}
	if id != "" && (status == statusDone || c.live(id)) {
		return id, nil
	}
	// None yet, or one committed but not queued yet (WaitTurn would not
	// find it): its acceptance tells.
	err = agent.Await(ctx, func() error {
		select {
		case id = <-ch:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	return id, err
}

// notifyNext tells the waiters of NextTurn about a continuation accepted
// after the turn prev. c.mu held.
func (c *core) notifyNextLocked(prev, id string) {
	for _, ch := range c.next[prev] {
		select {
		case ch <- id:
		default:
		}
	}
}

func ptrTrue() *bool { t := true; return &t }

// callInputOf is a tool part's input, or {} when it has none.
func callInputOf(p message.Part) json.RawMessage {
	if len(p.Input) == 0 || string(p.Input) == "null" {
		return json.RawMessage(`{}`)
	}
	return p.Input
}

// dropContinuationStandIns removes from a client's transcript the stand-ins
// of continuations: the tab that resumed a continuation's stream (useAgentChat
// after an answer) holds it as an assistant message of its own, with an id
// the server never gave, right after the message the continuation wrote,
// until the transcript merges them; a request sent meanwhile carries it. The
// server's message already holds what it streamed.
func (c *core) dropContinuationStandIns(ctx context.Context, msgs []message.Message) []message.Message {
	c.mu.Lock()
	known := make(map[string]bool, len(c.msgs))
	for _, m := range c.msgs {
		known[m.ID] = true
	}
	c.mu.Unlock()
	var out []message.Message
	for i, m := range msgs {
		if i > 0 && m.Role == message.RoleAssistant && !known[m.ID] && msgs[i-1].Role == message.RoleAssistant && known[msgs[i-1].ID] &&
			c.continued(ctx, msgs[i-1].ID) {
			continue
		}
		out = append(out, m)
	}
	return out
}

// continued reports whether a continuation turn wrote message id.
func (c *core) continued(ctx context.Context, id string) bool {
	var n int
	err := c.rt.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM chat_streams WHERE instance_id = ? AND message_id = ? AND continuation = 1`, c.iid, id).Scan(&n)
	})
	return err == nil && n > 0
}

// WaitingCalls returns the tool calls the transcript's last assistant
// message waits for (approvals, client tools' outputs), or nil while a
// turn runs or is queued or when nothing waits.
func (b *Base) WaitingCalls() []WaitingCall {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active != nil || len(c.queue) > 0 {
		return nil
	}
	last := lastAssistant(c.msgs)
	if last == nil {
		return nil
	}
	return waitingCalls(*last)
}

// endingWith returns the id of the running turn when its message has the
// tool call toolCallID (the turn asked for it and is ending, waiting), or "".
func (c *core) endingWith(toolCallID string) string {
	c.mu.Lock()
	t := c.active
	c.mu.Unlock()
	if t == nil {
		return ""
	}
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if t.builder == nil {
		return ""
	}
	for _, p := range t.builder.Message().Parts {
		if p.IsTool() && p.ToolCallID == toolCallID {
			return t.row.ID
		}
	}
	return ""
}

// live reports whether the turn id is queued or running here.
func (c *core) live(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (c.current != nil && c.current.row.ID == id) || c.ending[id] {
		return true
	}
	for _, t := range c.queue {
		if t.row.ID == id {
			return true
		}
	}
	return c.last != nil && c.last.row.ID == id
}
