package chat_test

import (
	"testing"

	"github.com/agentry/agentry/internal/testkit/teststore"
)

// TestOnPostgres runs chat scenarios on PostgreSQL (a scratch cluster,
// internal/testkit/pgtest) in every test run: real turns with tools, idempotent
// submissions and ordered turns (row locks instead of SQLite's single
// writer), stream chunks, the wire protocol, clear and recovery after a
// restart. The whole package runs there with AGENTRY_TEST_STORE=postgres.
func TestOnPostgres(t *testing.T) {
	teststore.RunOnPostgres(t,
		TestToolSuccess,
		TestToolCallsRunInParallel,
		TestSaveMessagesHeadless,
		TestTurnsRunInOrder,
		TestIdempotentSubmission,
		TestChunkPersistenceBatching,
		TestHandlerTurnOnTheWire,
		TestAcceptanceComparesOutsideTheWriter,
		TestAcceptanceReadsNoStoredTranscript,
		TestResumeProtocol,
		TestClearDuringTurn,
		TestRecoverContinueKeepsToolStep,
		TestRecoverCollectsFinishedStream,
	)
}
