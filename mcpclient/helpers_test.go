package mcpclient_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testctx"
	"github.com/agentry/agentry/internal/testkit/teststore"
	"github.com/agentry/agentry/mcpclient"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait: a deadline for a broken test, never a way to
// let time pass.
const waitLimit = 30 * time.Second

func testCtx(t *testing.T) context.Context { return testctx.Within(t, waitLimit) }

// bot is a chat agent whose tools are the MCP client's.
type bot struct {
	chat.Base
	mcp   *mcpclient.Client
	model model.Model
}

func (b *bot) ChatModel() model.Model { return b.model }
func (b *bot) Tools() []chat.Tool     { return b.mcp.Tools() }

// chatter is what the tests use of a chat agent.
type chatter interface {
	agent.Agent
	SaveMessages(ctx context.Context, msgs []message.Message) (chat.TurnResult, error)
	SubmitMessages(ctx context.Context, msgs []message.Message, opts chat.SubmitOptions) (string, error)
	WaitTurn(ctx context.Context, id string) (chat.TurnResult, error)
	CancelTurn(id string) bool
	Messages() []message.Message
	FollowStream(ctx context.Context, id string, afterSeq int, fn func(seq int, body string)) (func(), error)
	AddToolApprovalResponse(ctx context.Context, toolCallID string, approved bool, reason string, opts chat.AnswerOptions) (string, error)
}

// toolModel calls the tool a user message names ("call TOOL {json}") and,
// once it sees the results, reports them as text.
func toolModel() *scripted.Model {
	return scripted.New(scripted.WithRules(
		scripted.ReportToolResults(),
		scripted.Rule{
			Name:  "call",
			Match: func(req *model.Request) bool { return strings.HasPrefix(lastUser(req), "call ") },
			Reply: func(req *model.Request) scripted.Reply {
				name, input, _ := strings.Cut(strings.TrimPrefix(lastUser(req), "call "), " ")
				if input == "" {
					input = "{}"
				}
				return scripted.Reply{scripted.ToolCall(name, json.RawMessage(input))}
			},
		},
	))
}

func lastUser(req *model.Request) string {
	for i := len(req.Messages) - 1; i >= 0; i-- {
		m := req.Messages[i]
		if m.Role != model.RoleUser {
			continue
		}
		for _, c := range m.Content {
			if c.Kind == model.ContentText {
				return c.Text
			}
		}
		return ""
	}
	return ""
}

// newRuntime returns a runtime on a SQLite file of its own, with chat
// configured, not started; it is closed at cleanup.
func newRuntime(t *testing.T) *agent.Runtime {
	t.Helper()
	rt := teststore.NewRuntime(t, agent.Options{Clock: clockwork.NewRealClock(), IdleTimeout: -1})
	if err := chat.Configure(rt, chat.Config{}); err != nil {
		t.Fatal(err)
	}
	return rt
}

// rig is a runtime on a SQLite file with one chat class, "Bot", whose
// tools come from mc.
type rig struct {
	rt *agent.Runtime
}

func newRig(t *testing.T, mc *mcpclient.Client) *rig {
	t.Helper()
	rt := newRuntime(t)
	m := toolModel()
	if err := rt.Register(agent.Class{Name: "Bot", Public: true, New: func() agent.Agent { return &bot{mcp: mc, model: m} }}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &rig{rt: rt}
}

func (r *rig) bot(t *testing.T, name string) chatter {
	t.Helper()
	a, err := r.rt.Get(testCtx(t), agent.Root("Bot", name))
	if err != nil {
		t.Fatal(err)
	}
	return a.(chatter)
}

func userMsg(text string) message.Message {
	return message.Message{Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: text}}}
}

func toolParts(m message.Message) []message.Part {
	var out []message.Part
	for _, p := range m.Parts {
		if p.IsTool() {
			out = append(out, p)
		}
	}
	return out
}

func partsOf(m message.Message, typ string) []message.Part {
	var out []message.Part
	for _, p := range m.Parts {
		if p.Type == typ {
			out = append(out, p)
		}
	}
	return out
}

// watcher collects the client's status changes.
type watcher struct {
	mu     sync.Mutex
	last   map[string]mcpclient.ServerStatus
	signal chan struct{}
}

func newWatcher() *watcher {
	return &watcher{last: map[string]mcpclient.ServerStatus{}, signal: make(chan struct{}, 1)}
}

func (w *watcher) onChange(s mcpclient.ServerStatus) {
	w.mu.Lock()
	w.last[s.Name] = s
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// wait waits until cond holds for the status of server.
func (w *watcher) wait(t *testing.T, server, what string, cond func(mcpclient.ServerStatus) bool) mcpclient.ServerStatus {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		w.mu.Lock()
		s, ok := w.last[server]
		w.mu.Unlock()
		if ok && cond(s) {
			return s
		}
		select {
		case <-w.signal:
		case <-deadline:
			t.Fatalf("timed out waiting for server %s: %s (last %+v)", server, what, s)
		}
	}
}

// follow calls fn with every chunk of stream id, live; the returned stop
// ends it.
func follow(t *testing.T, a chatter, id string, fn func(c message.Chunk)) {
	t.Helper()
	stop, err := a.FollowStream(testCtx(t), id, 0, func(seq int, body string) {
		var c message.Chunk
		if err := json.Unmarshal([]byte(body), &c); err == nil {
			fn(c)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}

func has(names []string, want string) bool {
	for _, n := range names {
		if n == want {
			return true
		}
	}
	return false
}
