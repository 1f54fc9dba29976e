package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
)

// entry is one MCP tool of the catalog: an agent tool of a public chat
// class, or the class's chat tool.
type entry struct {
	name   string // the MCP tool name
	class  string // the public class whose instance runs it
	tool   chat.Tool
	info   agenttool.ToolInfo // agent tools
	isChat bool
}

// chatter is what the chat tool needs of a chat agent (chat.Base's
// methods).
type chatter interface {
	SubmitMessages(ctx context.Context, msgs []message.Message, opts chat.SubmitOptions) (string, error)
	WaitTurn(ctx context.Context, id string) (chat.TurnResult, error)
	CancelTurn(id string) bool
}

// chatInput is the input of a class's chat tool.
type chatInput struct {
	Message  string `json:"message" jsonschema:"the user's message"`
	Instance string `json:"instance,omitempty" jsonschema:"the instance to talk to; empty means the endpoint's instance"`
}

// catalog lists the MCP tools of the runtime's public classes. A tool's MCP
// name is its own name when no other public class has a tool of that
// name, and "{route}_{name}" for every class that shares it, so the names
// depend only on the registered classes.
func catalog(rt *agent.Runtime) ([]entry, error) {
	var all []entry
	for _, c := range rt.Classes() {
		if !c.Public || c.New == nil {
			continue
		}
		sample := c.New()
		if _, ok := sample.(chatter); !ok {
			continue
		}
		if tp, ok := sample.(chat.ToolProvider); ok {
			for _, t := range tp.Tools() {
				info, ok := agenttool.InfoOf(t)
				if !ok {
					continue
				}
				all = append(all, entry{name: t.Name, class: c.Name, tool: t, info: info})
			}
		}
		all = append(all, entry{name: "chat", class: c.Name, tool: chatTool(), isChat: true})
	}
	count := map[string]int{}
	for _, e := range all {
		count[e.name]++
	}
	seen := map[string]bool{}
	for i := range all {
		if count[all[i].name] > 1 {
			all[i].name = agent.Kebab(all[i].class) + "_" + all[i].name
		}
		if seen[all[i].name] {
			return nil, fmt.Errorf("mcpserver: two tools are named %q", all[i].name)
		}
		seen[all[i].name] = true
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].name < all[j].name })
	return all, nil
}

// chatTool is the tool description of a class's chat tool (its function is
// the server's).
func chatTool() chat.Tool {
	t := chat.NewTool("chat", "", func(context.Context, chatInput) (any, error) { return nil, nil })
	return t.WithSchema(func(s *jsonschema.Schema) {
		n := 1
		s.Properties["message"].MinLength = &n
	})
}

// agentToolClasses returns the classes with agent tools in the catalog,
// in catalog order, each once: the classes whose runs can be tasks.
func agentToolClasses(tools []entry) []string {
	var out []string
	for _, e := range tools {
		if !e.isChat && !slices.Contains(out, e.class) {
			out = append(out, e.class)
		}
	}
	return out
}

// description returns the MCP description of an entry.
func (e entry) description() string {
	if e.isChat {
		return fmt.Sprintf("Send a message to a %s instance and return its answer. The turn runs in the instance's own chat, as if a user had typed it.", e.class)
	}
	d := e.tool.Description
	if d == "" {
		d = fmt.Sprintf("Run a %s helper.", e.info.Class)
	}
	return d + fmt.Sprintf(" Starts an agent-tool run of %s under the %s instance; progress is reported when the call carries a progress token.", e.info.Class, e.class)
}

// inputSchema returns the tool's input JSON Schema as the MCP tool's.
func (e entry) inputSchema() (json.RawMessage, error) {
	data, err := json.Marshal(e.tool.Schema())
	if err != nil {
		return nil, fmt.Errorf("mcpserver: schema of %s: %w", e.name, err)
	}
	return data, nil
}

// validInstance reports whether name can name an instance in a route.
func validInstance(name string) bool {
	return name != "" && name != "sub" && len(name) <= 256 && !strings.ContainsAny(name, "/\x00")
}
