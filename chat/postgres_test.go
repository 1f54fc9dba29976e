package chat_test

import "testing"

// TestOnPostgres runs chat scenarios on PostgreSQL (a scratch cluster,
// internal/testkit/pgtest) in every test run: real turns with tools, idempotent
// submissions and ordered turns (row locks instead of SQLite's single
// writer), stream chunks, the wire protocol, clear and recovery after a
// restart. The whole package runs there with AGENTRY_TEST_STORE=postgres.
func TestOnPostgres(t *testing.T) {
	t.Setenv("AGENTRY_TEST_STORE", "postgres")
	for name, test := range map[string]func(*testing.T){
		"ToolSuccess":                   TestToolSuccess,
		"ToolCallsRunInParallel":        TestToolCallsRunInParallel,
		"SaveMessagesHeadless":          TestSaveMessagesHeadless,
		"TurnsRunInOrder":               TestTurnsRunInOrder,
		"IdempotentSubmission":          TestIdempotentSubmission,
		"ChunkPersistenceBatching":      TestChunkPersistenceBatching,
		"HandlerTurnOnTheWire":          TestHandlerTurnOnTheWire,
		"ResumeProtocol":                TestResumeProtocol,
		"ClearDuringTurn":               TestClearDuringTurn,
		"RecoverContinueKeepsToolStep":  TestRecoverContinueKeepsToolStep,
		"RecoverCollectsFinishedStream": TestRecoverCollectsFinishedStream,
	} {
		t.Run(name, test)
	}
}
