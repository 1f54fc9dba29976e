package agenttool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
)

// ToolOptions configure an AgentTool.
type ToolOptions struct {
	// Name is the tool name the model calls; empty means the class name in
	// lower case.
	Name string
	// Description tells the model what the child does.
	Description string
	// DisplayName and Icon are UI metadata sent with the started event
	// (they override the same keys of Display).
	DisplayName string
	Icon        string
	Display     Display
	// Schema adjusts the inferred input schema (a minimum length, an enum).
	Schema func(s *jsonschema.Schema)
	// Tokens caps the tokens of each run of the tool (see TokenBudget).
	Tokens TokenBudget
}

func (o ToolOptions) display() Display {
	if o.DisplayName == "" && o.Icon == "" && len(o.Display) == 0 {
		return nil
	}
	d := Display{}
	for k, v := range o.Display {
		d[k] = v
	}
	if o.DisplayName != "" {
		d["name"] = o.DisplayName
	}
	if o.Icon != "" {
		d["icon"] = o.Icon
	}
	return d
}

// AgentTool returns a tool for a chat agent's model that runs class as a
// child (the seed's agentTool). Its input type is In; the run id is
// "agent-tool:<toolCallId>", so a recovered turn that repeats the call
// finds the same run instead of starting another child. On success the
// model gets the child's summary; otherwise the Failure envelope.
func AgentTool[In any, C agent.ClassName](class C, o ToolOptions) chat.Tool {
	return newAgentTool[In](string(class), o, func(r Result) (any, error) { return r.Summary, nil })
}

// AgentToolWithOutput is AgentTool for a child that declares structured
// output: on success the model gets the run's output decoded as Out and
// checked against Out's schema. Output that is missing or fails the schema
// is a tool error.
func AgentToolWithOutput[In, Out any, C agent.ClassName](c C, o ToolOptions) chat.Tool {
	class := string(c)
	schema, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(fmt.Sprintf("agenttool: output schema of %s: %v", class, err))
	}
	resolved, err := schema.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("agenttool: output schema of %s: %v", class, err))
	}
	return newAgentTool[In](class, o, func(r Result) (any, error) {
		if len(r.Output) == 0 {
			return FailureOf(Result{Status: StatusError, Error: "agent tool completed without structured output required by outputSchema"}), nil
		}
		var v any
		if err := json.Unmarshal(r.Output, &v); err != nil {
			return nil, fmt.Errorf("agent tool output is not JSON: %w", err)
		}
		if err := resolved.Validate(v); err != nil {
			return nil, fmt.Errorf("agent tool output does not match its schema: %w", err)
		}
		var out Out
		if err := json.Unmarshal(r.Output, &out); err != nil {
			return nil, fmt.Errorf("agent tool output does not match its schema: %w", err)
		}
		return out, nil
	})
}

func newAgentTool[In any](class string, o ToolOptions, success func(Result) (any, error)) chat.Tool {
	name := o.Name
	if name == "" {
		name = agent.Kebab(class)
	}
	display := o.display()
	t := chat.NewTool(name, o.Description, func(ctx context.Context, in In) (any, error) {
		parent, ok := agent.FromContext(ctx)
		if !ok {
			return nil, errors.New("agentTool can only run inside an agent turn")
		}
		opts := RunOptions{Input: in, Display: display, Tokens: o.Tokens}
		if tc, ok := chat.ToolCallFromContext(ctx); ok && tc.ID != "" {
			opts.RunID = "agent-tool:" + tc.ID
			opts.ParentToolCallID = tc.ID
		}
		res, err := RunAgentTool(ctx, parent, class, opts)
		if err != nil {
			var ce *CapError
			if errors.As(err, &ce) {
				return FailureOf(Result{Status: StatusError, Error: ce.Error()}), nil
			}
			return nil, err
		}
		if res.Status != StatusCompleted {
			return FailureOf(res), nil
		}
		return success(res)
	})
	if o.Schema != nil {
		t = t.WithSchema(o.Schema)
	}
	t = t.WithCheck(func(rt *agent.Runtime) error {
		if !rt.HasClass(class) {
			return fmt.Errorf("agenttool: AgentTool runs class %q, which is not registered", class)
		}
		return nil
	})
	if title, ok := display["name"].(string); ok {
		t = t.WithTitle(title)
	}
	return t.WithMeta(toolInfoKey{}, ToolInfo{Class: class, Display: display, Tokens: o.Tokens})
}
