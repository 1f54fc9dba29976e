package chat

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/store"
)

// SchemaVersion is the newest version of the chat layer's schema
// (component "chat" of store.Migrate) this build knows; a database
// migrated further by a newer build is refused (store.ErrSchemaTooNew).
func SchemaVersion() int { return store.LatestVersion(migrations) }

// migrations is the chat layer's schema. Every table is keyed by the
// instance id and cascades with the instance.
var migrations = []store.Migration{{
	Version: 1,
	Statements: []string{
		`CREATE TABLE IF NOT EXISTS chat_messages (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			id TEXT NOT NULL,
			position BIGINT NOT NULL,
			role TEXT NOT NULL,
			body TEXT NOT NULL,
			PRIMARY KEY (instance_id, id))`,
		`CREATE INDEX IF NOT EXISTS chat_messages_order ON chat_messages(instance_id, position)`,
		`CREATE TABLE IF NOT EXISTS chat_streams (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			id TEXT NOT NULL,
			message_id TEXT NOT NULL,
			status TEXT NOT NULL,
			outcome TEXT,
			error TEXT,
			message_ids TEXT,
			continuation INTEGER NOT NULL DEFAULT 0,
			body TEXT,
			attempts BIGINT NOT NULL DEFAULT 0,
			next_seq BIGINT NOT NULL DEFAULT 0,
			created_at BIGINT NOT NULL,
			finished_at BIGINT,
			PRIMARY KEY (instance_id, id))`,
		`CREATE INDEX IF NOT EXISTS chat_streams_status ON chat_streams(instance_id, status, created_at)`,
		`CREATE TABLE IF NOT EXISTS chat_chunks (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			stream_id TEXT NOT NULL,
			seq BIGINT NOT NULL,
			body TEXT NOT NULL,
			PRIMARY KEY (instance_id, stream_id, seq))`,
		`CREATE TABLE IF NOT EXISTS chat_submissions (
			instance_id BIGINT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
			key TEXT NOT NULL,
			stream_id TEXT NOT NULL,
			created_at BIGINT NOT NULL,
			PRIMARY KEY (instance_id, key))`,
	},
}, {
	Version: 2,
	Statements: []string{
		`ALTER TABLE chat_streams ADD COLUMN retain INTEGER NOT NULL DEFAULT 0`,
	},
}, {
	// tools_from is the stream position where the running step's tool
	// calls began executing; recovery resumes them instead of asking the
	// model again.
	Version: 3,
	Statements: []string{
		`ALTER TABLE chat_streams ADD COLUMN tools_from BIGINT`,
	},
}, {
	// work is the stream's recovery work meter (produced content and tool
	// units, see recovery.go); chat_recovery_incidents holds the recovery
	// incident of an interrupted turn.
	Version:    4,
	Statements: recoveryMigration,
}, {
	// trace_parent is the W3C traceparent of the span that submitted the
	// turn: the turn's span (also a recovered turn's, after a restart)
	// joins that trace.
	Version:    5,
	Statements: []string{`ALTER TABLE chat_streams ADD COLUMN trace_parent TEXT`},
}}

// Stream statuses in chat_streams.
const (
	statusQueued    = "queued"
	statusStreaming = "streaming"
	statusDone      = "done"
)

// Outcomes of a turn, as sent on its terminal frame.
const (
	OutcomeCompleted = "completed"
	OutcomeError     = "error"
	OutcomeAborted   = "aborted"
	OutcomeSkipped   = "skipped"
)

// streamRow is one row of chat_streams.
type streamRow struct {
	ID           string
	MessageID    string
	Status       string
	Outcome      string
	Error        string
	MessageIDs   []string
	Continuation bool
	Body         json.RawMessage
	Attempts     int
	NextSeq      int
	Retain       bool
	ToolsFrom    int    // -1 when no step is executing tools
	TraceParent  string // the submitter's span (agent.TraceParent), if any
	// prev is the stream a continuation goes on from (set when it is
	// accepted; not stored).
	prev string
}

func loadMessages(ctx context.Context, tx store.Tx, iid int64) ([]message.Message, error) {
	rows, err := tx.Query(ctx, `SELECT body FROM chat_messages WHERE instance_id = ? ORDER BY position`, iid)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []message.Message
	for rows.Next() {
		var body string
		if err := rows.Scan(&body); err != nil {
			return nil, err
		}
		var m message.Message
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			return nil, fmt.Errorf("decode stored message: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// transcriptPlan is a change to the stored transcript (storedTranscript's
// diff, encodeMessages): the messages to write, with their
// positions and encodings, and the stored ones to delete.
type transcriptPlan struct {
	writes  []plannedMessage
	deletes []string
}

type plannedMessage struct {
	pos  int
	m    *message.Message
	body string
}

// apply writes the plan in tx.
func (p transcriptPlan) apply(ctx context.Context, tx store.Tx, iid int64) error {
	for _, w := range p.writes {
		if err := upsertMessage(ctx, tx, iid, w.pos, w.m, w.body); err != nil {
			return err
		}
	}
	for _, id := range p.deletes {
		if _, err := tx.Exec(ctx, `DELETE FROM chat_messages WHERE instance_id = ? AND id = ?`, iid, id); err != nil {
			return fmt.Errorf("delete message %s: %w", id, err)
		}
	}
	return nil
}

// appendMessages adds msgs after the stored transcript and returns what
// it wrote.
func appendMessages(ctx context.Context, tx store.Tx, iid int64, msgs []message.Message) (transcriptPlan, error) {
	var last int
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(position), -1) FROM chat_messages WHERE instance_id = ?`, iid).Scan(&last); err != nil {
		return transcriptPlan{}, err
	}
	p, err := encodeMessages(last+1, msgs)
	if err != nil {
		return p, err
	}
	return p, p.apply(ctx, tx, iid)
}

// upsertMessage stores m, whose encoding is body, at pos.
func upsertMessage(ctx context.Context, tx store.Tx, iid int64, pos int, m *message.Message, body string) error {
	_, err := tx.Exec(ctx, `INSERT INTO chat_messages (instance_id, id, position, role, body) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (instance_id, id) DO UPDATE SET position = excluded.position, role = excluded.role, body = excluded.body`,
		iid, m.ID, pos, string(m.Role), body)
	return err
}

func insertStream(ctx context.Context, tx store.Tx, iid int64, s streamRow, now int64) error {
	ids, _ := json.Marshal(s.MessageIDs)
	cont := 0
	if s.Continuation {
		cont = 1
	}
	_, err := tx.Exec(ctx, `INSERT INTO chat_streams (instance_id, id, message_id, status, message_ids, continuation, body, created_at, retain, trace_parent, next_seq)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, iid, s.ID, s.MessageID, s.Status, string(ids), cont, nullRaw(s.Body), now, boolInt(s.Retain), nullStr(s.TraceParent), s.NextSeq)
	return err
}

// nextStream returns the id of the continuation that follows the stream
// id (the first stream after it that continues the same message), or "".
func nextStream(ctx context.Context, tx store.Tx, iid int64, id string) (next, status string, err error) {
	err = tx.QueryRow(ctx, `SELECT n.id, n.status FROM chat_streams s JOIN chat_streams n
		ON n.instance_id = s.instance_id AND n.message_id = s.message_id AND n.continuation = 1
			AND (n.created_at > s.created_at OR (n.created_at = s.created_at AND n.id > s.id))
		WHERE s.instance_id = ? AND s.id = ? ORDER BY n.created_at, n.id LIMIT 1`, iid, id).Scan(&next, &status)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", nil
	}
	return next, status, err
}

// continueFrom fills in a continuation's row from the latest stream that
// wrote the same message: its body when the row has none, and for a
// retained stream its retention and next sequence.
func continueFrom(ctx context.Context, tx store.Tx, iid int64, s *streamRow) error {
	var body sql.NullString
	var retain, next int
	err := tx.QueryRow(ctx, `SELECT id, body, retain, next_seq FROM chat_streams WHERE instance_id = ? AND message_id = ?
		ORDER BY created_at DESC, id DESC LIMIT 1`, iid, s.MessageID).Scan(&s.prev, &body, &retain, &next)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if body.Valid {
		s.Body = mergeBody(json.RawMessage(body.String), s.Body)
	}
	if retain != 0 {
		s.Retain, s.NextSeq = true, next
	}
	return nil
}

func nullRaw(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

const streamCols = `id, message_id, status, outcome, error, message_ids, continuation, body, attempts, next_seq, tools_from, trace_parent`

func scanStream(r interface{ Scan(...any) error }) (streamRow, error) {
	var s streamRow
	var outcome, errText, ids, body, traceParent sql.NullString
	var cont int
	var toolsFrom sql.NullInt64
	if err := r.Scan(&s.ID, &s.MessageID, &s.Status, &outcome, &errText, &ids, &cont, &body, &s.Attempts, &s.NextSeq, &toolsFrom, &traceParent); err != nil {
		return s, err
	}
	s.TraceParent = traceParent.String
	s.ToolsFrom = -1
	if toolsFrom.Valid {
		s.ToolsFrom = int(toolsFrom.Int64)
	}
	s.Outcome, s.Error, s.Continuation = outcome.String, errText.String, cont != 0
	if ids.Valid {
		_ = json.Unmarshal([]byte(ids.String), &s.MessageIDs)
	}
	if body.Valid {
		s.Body = json.RawMessage(body.String)
	}
	return s, nil
}

func getStream(ctx context.Context, tx store.Tx, iid int64, id string) (streamRow, bool, error) {
	s, err := scanStream(tx.QueryRow(ctx, `SELECT `+streamCols+` FROM chat_streams WHERE instance_id = ? AND id = ?`, iid, id))
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	return s, err == nil, err
}

// unfinishedStreams returns queued and streaming turns, oldest first.
func unfinishedStreams(ctx context.Context, tx store.Tx, iid int64) ([]streamRow, error) {
	rows, err := tx.Query(ctx, `SELECT `+streamCols+` FROM chat_streams
		WHERE instance_id = ? AND status <> ? ORDER BY created_at, id`, iid, statusDone)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []streamRow
	for rows.Next() {
		s, err := scanStream(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// storedChunk is one persisted chunk of a stream.
type storedChunk struct {
	Seq  int
	Body string
	Work int // recovery work units it counts for (not stored with it)
	// Live marks a transient chunk: sent to clients in order, never
	// stored (Seq is -1).
	Live bool
}

// persisted returns the chunks of batch that are stored.
func persisted(batch []storedChunk) []storedChunk {
	for i, sc := range batch {
		if sc.Live {
			out := append([]storedChunk(nil), batch[:i]...)
			for _, sc := range batch[i+1:] {
				if !sc.Live {
					out = append(out, sc)
				}
			}
			return out
		}
	}
	return batch
}

func loadChunks(ctx context.Context, tx store.Tx, iid int64, streamID string) ([]storedChunk, error) {
	rows, err := tx.Query(ctx, `SELECT seq, body FROM chat_chunks WHERE instance_id = ? AND stream_id = ? ORDER BY seq`, iid, streamID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storedChunk
	for rows.Next() {
		var c storedChunk
		if err := rows.Scan(&c.Seq, &c.Body); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// insertChunks writes chunks of a stream and reports whether the stream
// still exists (a stream deleted by a clear gets no more chunks). The
// stream's next sequence is moved first (its row's absence is the clear),
// then the chunks go in multi-row statements of up to chunkRows rows.
func insertChunks(ctx context.Context, tx store.Tx, iid int64, streamID string, chunks []storedChunk) (bool, error) {
	if len(chunks) == 0 {
		return streamExists(ctx, tx, iid, streamID)
	}
	next := chunks[len(chunks)-1].Seq + 1
	work := 0
	for _, c := range chunks {
		work += c.Work
	}
	res, err := tx.Exec(ctx, `UPDATE chat_streams SET next_seq = CASE WHEN next_seq < ? THEN ? ELSE next_seq END, work = work + ?
		WHERE instance_id = ? AND id = ?`, next, next, work, iid, streamID)
	if err != nil {
		return true, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	var q strings.Builder
	args := make([]any, 0, 4*min(len(chunks), chunkRows))
	iidArg, streamArg := any(iid), any(streamID) // boxed once, not once per row
	for len(chunks) > 0 {
		batch := chunks[:min(len(chunks), chunkRows)]
		chunks = chunks[len(batch):]
		q.Reset()
		args = args[:0]
		q.WriteString(`INSERT INTO chat_chunks (instance_id, stream_id, seq, body) VALUES `)
		for i, c := range batch {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(?, ?, ?, ?)")
			args = append(args, iidArg, streamArg, c.Seq, c.Body)
		}
		q.WriteString(` ON CONFLICT (instance_id, stream_id, seq) DO NOTHING`)
		if _, err := tx.Exec(ctx, q.String(), args...); err != nil {
			return true, err
		}
	}
	return true, nil
}

// chunkRows bounds the rows of one chunk INSERT (4 parameters each; SQLite
// allows 32,766 parameters, PostgreSQL 65,535).
const chunkRows = 64

// streamExists reports whether the stream row is still there (a clear
// deletes it while its turn may still be finishing).
func streamExists(ctx context.Context, tx store.Tx, iid int64, streamID string) (bool, error) {
	var n int
	err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM chat_streams WHERE instance_id = ? AND id = ?`, iid, streamID).Scan(&n)
	return n > 0, err
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// mergeBody returns the request body base with the members of over put
// over its own.
func mergeBody(base, over json.RawMessage) json.RawMessage {
	if len(over) == 0 {
		return base
	}
	var b, o map[string]json.RawMessage
	if json.Unmarshal(base, &b) != nil || json.Unmarshal(over, &o) != nil {
		return over
	}
	for k, v := range o {
		b[k] = v
	}
	out, err := json.Marshal(b)
	if err != nil {
		return over
	}
	return out
}
