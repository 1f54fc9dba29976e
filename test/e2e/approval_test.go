package e2e

import (
	"testing"
	"time"

	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// startDemo serves the agents-as-tools demo with its offline models.
func startDemo(t *testing.T) *testenv.Env {
	t.Helper()
	return testenv.Start(t, testenv.Options{
		Classes: agentsastools.Classes(agentsastools.Options{Models: agentsastools.Offline(0, nil)}),
		Setup:   withAgentTools,
	})
}

// TestApprovals runs test/npm/approvals.mjs against the demo's Assistant:
// delete_helper_runs denied (it does not run; the part is output-denied
// and the model says so) and approved (it runs once; the model reports
// it), and the client tool get_local_time answered with addToolOutput.
func TestApprovals(t *testing.T) {
	env := startDemo(t)
	runScript(t, 90*time.Second, "PASS approvals all", "approvals.mjs", env.Host, "e2e")
}

// TestChildApprovals runs test/npm/child-approvals.mjs: the Researcher's
// publish_findings approval surfaces under its run in the parent's
// agent-tool events (useAgentToolEvents's reducer: waiting, then
// completed), answered from the parent's connection and from the drill-in
// chat.
func TestChildApprovals(t *testing.T) {
	env := startDemo(t)
	runScript(t, 90*time.Second, "PASS child-approvals", "child-approvals.mjs", env.Host, "e2e")
}

// TestApprovalsSDKAuto runs approvals.mjs's sdk-auto phase: the AI SDK's
// own continuation (sendAutomaticallyWhen with
// lastAssistantMessageIsCompleteWithApprovalResponses, a new request with
// the answered transcript) runs the approved call and continues the
// message.
func TestApprovalsSDKAuto(t *testing.T) {
	env := startDemo(t)
	runScript(t, 90*time.Second, "PASS approvals sdk-auto", "approvals.mjs", env.Host, "sdk-auto", "sdk-auto")
}
