package client

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/wire"
)

// AddToolOutput answers a client-side tool's call toolCallID with output,
// as useAgentChat's addToolOutput does (cf_agent_tool_result with
// autoContinue), and returns the stream of the continuation turn the server
// starts once every call of the step is answered. It returns ErrNoStream
// when the server starts none (other calls of the step still wait).
func (ch *Chat) AddToolOutput(ctx context.Context, toolCallID, toolName string, output any) (*Stream, error) {
	raw, err := json.Marshal(output)
	if err != nil {
		return nil, fmt.Errorf("client: tool output: %w", err)
	}
	if err := ch.c.Send(ctx, struct {
		Type         string          `json:"type"`
		ToolCallID   string          `json:"toolCallId"`
		ToolName     string          `json:"toolName"`
		Output       json.RawMessage `json:"output"`
		AutoContinue bool            `json:"autoContinue"`
	}{wire.ToolResult, toolCallID, toolName, raw, true}); err != nil {
		return nil, fmt.Errorf("client: tool output: %w", err)
	}
	return ch.Resume(ctx)
}

// AddToolApprovalResponse answers the approval request of the call
// toolCallID, as useAgentChat's addToolApprovalResponse does
// (cf_agent_tool_approval with autoContinue), and returns the stream of the
// continuation turn the server starts (ErrNoStream: none yet).
func (ch *Chat) AddToolApprovalResponse(ctx context.Context, toolCallID string, approved bool) (*Stream, error) {
	if err := ch.c.Send(ctx, struct {
		Type         string `json:"type"`
		ToolCallID   string `json:"toolCallId"`
		Approved     bool   `json:"approved"`
		AutoContinue bool   `json:"autoContinue"`
	}{wire.ToolApproval, toolCallID, approved, true}); err != nil {
		return nil, fmt.Errorf("client: tool approval: %w", err)
	}
	return ch.Resume(ctx)
}

// WaitingCalls returns the tool parts of m's last step that wait for an
// answer: approval-requested (an approval) or input-available (a
// client-side tool's output).
func WaitingCalls(m message.Message) []message.Part {
	last := 0
	for i, p := range m.Parts {
		if p.Type == message.PartStepStart {
			last = i
		}
	}
	var out []message.Part
	for _, p := range m.Parts[last:] {
		if p.IsTool() && (p.State == message.StateApprovalRequested || p.State == message.StateInputAvailable) {
			out = append(out, p)
		}
	}
	return out
}
