package agenttool_test

import (
	"testing"

	"github.com/agentry/agentry/internal/testkit/teststore"
)

// TestOnPostgres runs agent-tool scenarios on PostgreSQL (a scratch
// cluster, internal/testkit/pgtest) in every test run: awaited and detached runs
// end to end, the concurrency cap and one run id dispatched concurrently
// (row locks instead of SQLite's single writer), fan-out, recovery after a
// restart, milestones, the durable delivery of finish hooks and the
// extractor's own table. The whole package runs there with
// AGENTRY_TEST_STORE=postgres.
func TestOnPostgres(t *testing.T) {
	teststore.RunOnPostgres(t,
		TestRunAgentToolCompleted,
		TestAgentToolWithOutput,
		TestConcurrencyCap,
		TestConcurrentDispatchOfOneRunID,
		TestFanOutUnderOneToolCall,
		TestReplayPastTheFirstRuns,
		TestDetachedDispatch,
		TestDetachedConcurrentDelivery,
		TestProgressDataAndMilestones,
		TestRecoverCollectsCompletedChild,
		TestRecoverReattachesRunningChild,
		TestClearCancelsInFlight,
		TestFinishDeliveredOnceAcrossRestarts,
		TestFinishDeliveryRefusedWhenDeliveredMeanwhile,
		TestUndeliveredEndWakesItsParent,
		TestDetachedNotifyFormat,
		TestReconcileAfterRestart,
	)
}
