package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// startDemo serves the agents-as-tools demo with its offline models.
func startDemo(t *testing.T) *testenv.Env {
	t.Helper()
	return testenv.Start(t, testenv.Options{
		Classes: agentsastools.Classes(agentsastools.Options{Models: agentsastools.Offline(0, nil)}),
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			agenttool.Install(rt, agenttool.Options{})
			return nil
		},
	})
}

// TestApprovals runs test/npm/approvals.mjs against the demo's Assistant:
// delete_helper_runs denied (it does not run; the part is output-denied
// and the model says so) and approved (it runs once; the model reports
// it), and the client tool get_local_time answered with addToolOutput.
func TestApprovals(t *testing.T) {
	env := startDemo(t)
	out := testenv.Node(t, 90*time.Second, "approvals.mjs", env.Host, "e2e")
	t.Log(out)
	if !strings.Contains(out, "PASS approvals all") {
		t.Fatalf("script did not pass:\n%s", out)
	}
}

// TestChildApprovals runs test/npm/child-approvals.mjs: the Researcher's
// publish_findings approval surfaces under its run in the parent's
// agent-tool events (useAgentToolEvents's reducer: waiting, then
// completed), answered from the parent's connection and from the drill-in
// chat.
func TestChildApprovals(t *testing.T) {
	env := startDemo(t)
	out := testenv.Node(t, 90*time.Second, "child-approvals.mjs", env.Host, "e2e")
	t.Log(out)
	if !strings.Contains(out, "PASS child-approvals") {
		t.Fatalf("script did not pass:\n%s", out)
	}
}

// TestApprovalsSDKAuto runs approvals.mjs's sdk-auto phase: the AI SDK's
// own continuation (sendAutomaticallyWhen with
// lastAssistantMessageIsCompleteWithApprovalResponses, a new request with
// the answered transcript) runs the approved call and continues the
// message.
func TestApprovalsSDKAuto(t *testing.T) {
	env := startDemo(t)
	out := testenv.Node(t, 90*time.Second, "approvals.mjs", env.Host, "sdk-auto", "sdk-auto")
	t.Log(out)
	if !strings.Contains(out, "PASS approvals sdk-auto") {
		t.Fatalf("script did not pass:\n%s", out)
	}
}
