package agent_test

import (
	"testing"

	"github.com/agentry/agentry/internal/testkit/teststore"
)

// TestOnPostgres runs runtime scenarios on PostgreSQL (a scratch cluster,
// internal/testkit/pgtest) in every test run: instances' own tables (shared tables
// keyed by instance there) and their removal with a subtree, storage that
// survives eviction, schedules, and the gate's no-lost-updates. The whole
// package runs there with AGENTRY_TEST_STORE=postgres.
func TestOnPostgres(t *testing.T) {
	teststore.RunOnPostgres(t,
		TestSubAgentHasOwnStorage,
		TestDeleteSubAgentRemovesSubtree,
		TestDestroyThenReuse,
		TestEvictionRehydratesWithStorageIntact,
		TestScheduleAfterAndAtFireWithPayload,
		TestScheduleDueWhileStoppedFiresOnceOnRestart,
		TestGateNoLostUpdates,
		TestMigrateOncePerRuntime,
		TestWakeShardsReadsOnlyTheirReasons,
		TestDestroyDropsDescendantsOnOtherNodes,
	)
}
