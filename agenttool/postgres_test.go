package agenttool_test

import "testing"

// TestOnPostgres runs agent-tool scenarios on PostgreSQL (a scratch
// cluster, internal/testkit/pgtest) in every test run: awaited and detached runs
// end to end, the concurrency cap and one run id dispatched concurrently
// (row locks instead of SQLite's single writer), fan-out, recovery after a
// restart, milestones, the durable delivery of finish hooks and the
// extractor's own table. The whole package runs there with
// AGENTRY_TEST_STORE=postgres.
func TestOnPostgres(t *testing.T) {
	t.Setenv("AGENTRY_TEST_STORE", "postgres")
	for name, test := range map[string]func(*testing.T){
		"RunAgentToolCompleted":             TestRunAgentToolCompleted,
		"AgentToolWithOutput":               TestAgentToolWithOutput,
		"ConcurrencyCap":                    TestConcurrencyCap,
		"ConcurrentDispatchOfOneRunID":      TestConcurrentDispatchOfOneRunID,
		"FanOutUnderOneToolCall":            TestFanOutUnderOneToolCall,
		"DetachedDispatch":                  TestDetachedDispatch,
		"DetachedConcurrentDelivery":        TestDetachedConcurrentDelivery,
		"ProgressDataAndMilestones":         TestProgressDataAndMilestones,
		"RecoverCollectsCompletedChild":     TestRecoverCollectsCompletedChild,
		"RecoverReattachesRunningChild":     TestRecoverReattachesRunningChild,
		"ClearCancelsInFlight":              TestClearCancelsInFlight,
		"FinishDeliveredOnceAcrossRestarts": TestFinishDeliveredOnceAcrossRestarts,
		"FinishDeliveryRefused":             TestFinishDeliveryRefusedWhenDeliveredMeanwhile,
		"UndeliveredEndWakesItsParent":      TestUndeliveredEndWakesItsParent,
		"DetachedNotifyFormat":              TestDetachedNotifyFormat,
		"ReconcileAfterRestart":             TestReconcileAfterRestart,
	} {
		t.Run(name, test)
	}
}
