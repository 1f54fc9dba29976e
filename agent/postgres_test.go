package agent_test

import "testing"

// TestOnPostgres runs runtime scenarios on PostgreSQL (a scratch cluster,
// internal/testkit/pgtest) in every test run: instances' own tables (shared tables
// keyed by instance there) and their removal with a subtree, storage that
// survives eviction, schedules, and the gate's no-lost-updates. The whole
// package runs there with AGENTRY_TEST_STORE=postgres.
func TestOnPostgres(t *testing.T) {
	t.Setenv("AGENTRY_TEST_STORE", "postgres")
	for name, test := range map[string]func(*testing.T){
		"SubAgentHasOwnStorage":                     TestSubAgentHasOwnStorage,
		"DeleteSubAgentRemovesSubtree":              TestDeleteSubAgentRemovesSubtree,
		"DestroyThenReuse":                          TestDestroyThenReuse,
		"EvictionRehydratesWithStorageIntact":       TestEvictionRehydratesWithStorageIntact,
		"ScheduleAfterAndAtFireWithPayload":         TestScheduleAfterAndAtFireWithPayload,
		"ScheduleDueWhileStoppedFiresOnceOnRestart": TestScheduleDueWhileStoppedFiresOnceOnRestart,
		"GateNoLostUpdates":                         TestGateNoLostUpdates,
		"MigrateOncePerRuntime":                     TestMigrateOncePerRuntime,
		"WakeShardsReadsOnlyTheirReasons":           TestWakeShardsReadsOnlyTheirReasons,
		"DestroyDropsDescendantsOnOtherNodes":       TestDestroyDropsDescendantsOnOtherNodes,
	} {
		t.Run(name, test)
	}
}
