// Package e2e drives the Go server with the real npm clients (test/npm).
package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/examples/echochat"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAgentClient runs test/npm/agent-client.mjs: ready, state both ways,
// RPC results, streaming, error responses, and sub-agent routing with the
// parent's gate.
func TestAgentClient(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Classes: []agent.Class{counter.Class()}})
	runScript(t, 60*time.Second, "PASS agent-client", "agent-client.mjs", env.Host, "e2e")
	ctx := context.Background()
	parent := agent.Root("Counter", "e2e")
	for name, want := range map[string]bool{"ok-1": true, "bad-1": false} {
		got, err := env.RT.Exists(ctx, parent.Child("Counter", name))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("sub-agent %s exists = %v, want %v (a refused sub-agent creates nothing)", name, got, want)
		}
	}
	n, err := env.RT.Call(ctx, parent, "get")
	if err != nil || string(n) != "45" {
		t.Errorf("persisted count = %s, %v; want 45", n, err)
	}
}

// TestChat runs test/npm/chat.mjs against EchoChat: a streamed answer, a
// server tool turn, a reload mid-stream that resumes with every chunk once,
// cancel with the partial answer kept, get-messages, clear, and a malformed
// request.
func TestChat(t *testing.T) {
	env := startEcho(t, 20*time.Millisecond)
	runScript(t, 90*time.Second, "PASS chat", "chat.mjs", env.Host, "e2e")
}

// TestCounterOneInputAtATime runs test/npm/counter-concurrency.mjs: 20 real
// AgentClients send 200 concurrent increment(1) calls to one Counter, which
// has no lock of its own. It proves the runtime runs one input at a time:
// no update is lost (the count is 200, in the script and persisted) and
// every call saw a different count (the results are exactly 1..200).
func TestCounterOneInputAtATime(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Classes: []agent.Class{counter.Class()}})
	runScript(t, 60*time.Second, "PASS counter-concurrency", "counter-concurrency.mjs", env.Host, "concurrency")
	n, err := env.RT.Call(context.Background(), agent.Root("Counter", "concurrency"), "get")
	if err != nil || string(n) != "200" {
		t.Errorf("persisted count = %s, %v; want 200", n, err)
	}
}

// TestChatClearDuringTurn runs test/npm/chat-clear.mjs against EchoChat: a
// clear while a turn streams ends that turn with its terminal frame
// (outcome aborted), so the real client's status returns to ready instead
// of streaming forever, nothing of the cleared turn is kept, and the next
// message gets a full answer.
func TestChatClearDuringTurn(t *testing.T) {
	env := startEcho(t, 50*time.Millisecond)
	runScript(t, 60*time.Second, "PASS chat-clear", "chat-clear.mjs", env.Host, "clear-e2e")
}

// runScript runs the npm script with args against a test server, within
// limit, logs what it printed and fails the test unless it printed pass.
// It returns what the script printed.
func runScript(t *testing.T, limit time.Duration, pass, script string, args ...string) string {
	t.Helper()
	out := testenv.Node(t, limit, script, args...)
	t.Log(out)
	if !strings.Contains(out, pass) {
		t.Fatalf("script did not pass:\n%s", out)
	}
	return out
}

// withAgentTools is the Setup of a test server that runs chat agents with
// agent tools.
func withAgentTools(rt *agent.Runtime) error {
	if err := chat.Configure(rt, chat.Config{}); err != nil {
		return err
	}
	return agenttool.Install(rt, agenttool.Options{})
}

// startEcho serves EchoChat streaming a chunk every delay.
func startEcho(t *testing.T, delay time.Duration) *testenv.Env {
	t.Helper()
	return testenv.Start(t, testenv.Options{
		Classes: []agent.Class{echochat.Class(echochat.Options{Delay: delay})},
		Setup:   func(rt *agent.Runtime) error { return chat.Configure(rt, chat.Config{}) },
	})
}
