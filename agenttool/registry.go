package agenttool

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/store"
)

// runRow is a registry row with the bookkeeping the wire needs.
type runRow struct {
	Run
	marks []int // child stream positions at each terminal event (see eventSeq)
	det   detachedCols
	// traceParent is the run's span (agent.TraceParent), if any.
	traceParent string
	// inFlight: its terminal write records an end only over a run still
	// in flight (a recovery's, which read it so), never over one that
	// another path ended meanwhile, interrupted or not.
	inFlight bool
	// queued is the input of a run waiting for a slot (queued_input),
	// kept until its child starts.
	queued json.RawMessage
}

// detachedCols are the registry columns of a detached run.
type detachedCols struct {
	Detached         bool
	OnFinish         string
	Notify           bool
	NotifySource     string
	MaxBudgetAt      *time.Time
	NoProgressBudget time.Duration // 0: disabled
	OnMilestones     *MilestoneNotices
	FinishDelivered  bool
	GiveUpDelivered  bool
}

const runCols = `run_id, parent_tool_call_id, agent_type, input_preview, status, summary, output_json, error_message,
	interrupted_reason, child_still_running, display_metadata, display_order, started_at, completed_at, terminal_marks,
	detached, detached_on_finish, detached_notify, detached_notify_source, detached_max_budget_at,
	detached_no_progress_budget_ms, detached_on_milestones, finish_delivered_at, give_up_delivered_at, usage_json, token_budget, trace_parent, queued_input`

// sentCols are the registry columns a client is sent of a run, as scanned:
// scanRun reads them among all the others, replayRuns alone.
type sentCols struct {
	ptc, preview, summary, errMsg, reason, display, marks sql.NullString
	still                                                 sql.NullInt64
	started                                               int64
}

// fill sets row's fields from the scanned columns.
func (c *sentCols) fill(row *runRow) {
	row.ParentToolCallID = c.ptc.String
	if c.preview.Valid {
		row.InputPreview = json.RawMessage(c.preview.String)
	}
	row.Summary, row.Error, row.Reason = c.summary.String, c.errMsg.String, Reason(c.reason.String)
	if c.still.Valid {
		b := c.still.Int64 != 0
		row.ChildStillRunning = &b
	}
	if c.display.Valid {
		_ = json.Unmarshal([]byte(c.display.String), &row.Display)
	}
	row.StartedAt = time.UnixMilli(c.started)
	if c.marks.Valid {
		_ = json.Unmarshal([]byte(c.marks.String), &row.marks)
	}
}

func scanRun(r interface{ Scan(...any) error }) (runRow, error) {
	var row runRow
	var c sentCols
	var output sql.NullString
	var completed sql.NullInt64
	var detached, notify int
	var onFinish, source, onMilestones, traceParent sql.NullString
	var maxAt, noProgress, finishDelivered, giveUpDelivered sql.NullInt64
	var usage, budget, queued sql.NullString
	err := r.Scan(&row.RunID, &c.ptc, &row.AgentType, &c.preview, &row.Status, &c.summary, &output, &c.errMsg,
		&c.reason, &c.still, &c.display, &row.DisplayOrder, &c.started, &completed, &c.marks,
		&detached, &onFinish, &notify, &source, &maxAt, &noProgress, &onMilestones, &finishDelivered, &giveUpDelivered,
		&usage, &budget, &traceParent, &queued)
	if err != nil {
		return row, err
	}
	c.fill(&row)
	if queued.Valid {
		row.queued = json.RawMessage(queued.String)
	}
	if usage.Valid {
		var u chat.Usage
		if json.Unmarshal([]byte(usage.String), &u) == nil {
			row.Usage = &u
		}
	}
	if budget.Valid {
		_ = json.Unmarshal([]byte(budget.String), &row.TokenBudget)
	}
	row.traceParent = traceParent.String
	row.det = detachedCols{Detached: detached != 0, OnFinish: onFinish.String, Notify: notify != 0, NotifySource: source.String,
		NoProgressBudget: time.Duration(noProgress.Int64) * time.Millisecond,
		FinishDelivered:  finishDelivered.Valid, GiveUpDelivered: giveUpDelivered.Valid}
	if maxAt.Valid {
		t := time.UnixMilli(maxAt.Int64)
		row.det.MaxBudgetAt = &t
	}
	if onMilestones.Valid {
		var mn MilestoneNotices
		if json.Unmarshal([]byte(onMilestones.String), &mn) == nil {
			row.det.OnMilestones = &mn
		}
	}
	if output.Valid {
		row.Output = json.RawMessage(output.String)
	}
	if completed.Valid {
		t := time.UnixMilli(completed.Int64)
		row.CompletedAt = &t
	}
	return row, nil
}

func (h *host) readRun(ctx context.Context, runID string) (runRow, bool, error) {
	var row runRow
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		row, err = scanRun(tx.QueryRow(ctx, `SELECT `+runCols+` FROM agent_tool_runs WHERE instance_id = ? AND run_id = ?`, h.iid, runID))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return row, false, nil
	}
	return row, err == nil, err
}

func (h *host) listRuns(ctx context.Context, where string, args ...any) ([]runRow, error) {
	var out []runRow
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		out, err = h.queryRuns(ctx, tx, where, args...)
		return err
	})
	return out, err
}

// queryRuns lists this parent's runs that match where, in start order.
func (h *host) queryRuns(ctx context.Context, tx store.Tx, where string, args ...any) ([]runRow, error) {
	rows, err := tx.Query(ctx, `SELECT `+runCols+` FROM agent_tool_runs WHERE instance_id = ? `+where+` ORDER BY started_at, run_id`,
		append([]any{h.iid}, args...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []runRow
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// insertRun writes a new starting row unless the concurrency cap is
// reached (checked in the same statement). It reports whether the row was
// written; inserted=false with exists=true means the run id is taken.
// queued is the input of a run that waits for a slot (nil otherwise).
func (h *host) insertRun(ctx context.Context, r Run, maxActive int, det detachedCols, queued json.RawMessage) (inserted, exists bool, err error) {
	ms := h.takeMarks()
	err = h.b.DB().Update(ctx, func(tx store.Tx) error {
		var err error
		if err := h.writeMarksTx(ctx, tx, ms); err != nil {
			return err
		}
		inserted, exists, err = h.insertRunTx(ctx, tx, r, maxActive, det, queued)
		return err
	})
	if err != nil {
		h.restoreMarks(ms)
	}
	if inserted {
		h.mu.Lock()
		h.hasRuns = 1
		h.mu.Unlock()
	}
	return inserted, exists, err
}

// countInFlight counts a parent's runs in flight, for the concurrency cap.
// Its condition is the partial index agent_tool_runs_active's, written the
// same way, so that SQLite and PostgreSQL count through that index.
const countInFlight = `SELECT COUNT(*) FROM agent_tool_runs WHERE instance_id = ? AND status IN ('starting', 'running')`

// insertRunTx is insertRun's writes in tx; the row gets r.Status.
func (h *host) insertRunTx(ctx context.Context, tx store.Tx, r Run, maxActive int, det detachedCols, queued json.RawMessage) (inserted, exists bool, err error) {
	display, _ := marshalOrNil(r.Display)
	var maxAt, noProgress, milestones any
	if det.MaxBudgetAt != nil {
		maxAt = det.MaxBudgetAt.UnixMilli()
	}
	if det.NoProgressBudget > 0 {
		noProgress = det.NoProgressBudget.Milliseconds()
	}
	if det.OnMilestones != nil {
		b, _ := json.Marshal(det.OnMilestones)
		milestones = string(b)
	}
	err = func() error {
		// The parent's row lock orders concurrent dispatches (on an engine
		// with concurrent writers), so the existence check and the
		// concurrency cap below count what the dispatch before committed.
		var locked int64
		if err := tx.QueryRow(ctx, `SELECT id FROM instances WHERE id = ? FOR UPDATE`, h.iid).Scan(&locked); err != nil {
			return err
		}
		query := `INSERT INTO agent_tool_runs (instance_id, run_id, parent_tool_call_id, agent_type, input_preview,
				status, display_metadata, display_order, started_at, detached, detached_on_finish, detached_notify,
				detached_notify_source, detached_max_budget_at, detached_no_progress_budget_ms, detached_on_milestones, token_budget, trace_parent,
				queued_input)`
		args := []any{h.iid, r.RunID, nullStr(r.ParentToolCallID), r.AgentType, nullStr(string(r.InputPreview)),
			r.Status, display, r.DisplayOrder, r.StartedAt.UnixMilli(), boolInt(det.Detached), nullStr(det.OnFinish),
			boolInt(det.Notify), nullStr(det.NotifySource), maxAt, noProgress, milestones, r.TokenBudget.column(), nullStr(agent.TraceParent(ctx)),
			queuedColumn(queued)}
		if maxActive > 0 {
			var n int
			if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM agent_tool_runs WHERE instance_id = ? AND run_id = ?`, h.iid, r.RunID).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				exists = true
				return nil
			}
			// The cap counts the runs in flight through the partial index
			// agent_tool_runs_active (its condition written the same way),
			// not the whole registry. Without a cap nothing is counted:
			// a parent with many retained runs dispatches as fast as a
			// new one.
			query += ` SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE (` + countInFlight + `) < ?`
			args = append(args, h.iid, maxActive)
		} else {
			// Without a cap, the insert itself finds a run id the registry
			// holds: it inserts nothing.
			query += ` VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (instance_id, run_id) DO NOTHING`
		}
		res, err := tx.Exec(ctx, query, args...)
		if err != nil {
			return err
		}
		affected, err := res.RowsAffected()
		inserted = affected == 1
		if err == nil && maxActive <= 0 && !inserted {
			exists = true
		}
		if err != nil || !inserted {
			return err
		}
		// Remember the class: the drill-in gate keeps guarding it after a
		// clear.
		_, err = tx.Exec(ctx, `INSERT INTO agent_tool_classes (instance_id, agent_type) VALUES (?, ?)
			ON CONFLICT (instance_id, agent_type) DO NOTHING`, h.iid, r.AgentType)
		return err
	}()
	return inserted, exists, err
}

func (h *host) markRunning(ctx context.Context, runID string) error {
	return h.b.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET status = ?, queued_input = NULL WHERE instance_id = ? AND run_id = ? AND status = ?`,
			StatusRunning, h.iid, runID, StatusStarting)
		return err
	})
}

// writeTerminal is the guarded terminal write: it never replaces a hard
// terminal, and records the child-stream mark of this terminal event. It
// reports whether it won, and returns the chunks of the run's stream from
// mark on that were stored before it.
//
// The mark is at least the child's next stream sequence as stored: a
// terminal event is numbered after every chunk of the run's stream that
// was committed before it, since a client may have seen any of those (a
// connect replay reads a run in flight from its child, ahead of what the
// parent forwarded). The caller's mark can be behind that (a recovery that
// could not inspect the child, a follower that had not been handed the
// last commit yet); the stored stream is read in the same transaction, and
// the chunks the caller did not forward are returned for it to send
// before the terminal event.
func (h *host) writeTerminal(ctx context.Context, row runRow, res Result, mark int) (bool, []int, []chunk, error) {
	var won bool
	var marks []int
	var late []chunk
	now := h.rt.Clock().Now().UnixMilli()
	child := h.b.Path().Child(row.AgentType, row.RunID).String()
	from := mark
	if n := len(row.marks); n > 0 {
		from = max(from, row.marks[n-1]) // sent before the run's last terminal
	}
	_, observed := h.a.(FinishObserver)
	ms := h.takeMarks()
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		if err := h.writeMarksTx(ctx, tx, ms); err != nil {
			return err
		}
		var err error
		if late, err = storedStreamFrom(ctx, tx, child, row.RunID, from); err != nil {
			return err
		}
		if n := len(late); n > 0 {
			mark = late[n-1].seq + 1
		}
		won, marks, err = writeTerminalTx(ctx, tx, h, row.RunID, res, mark, now, observed, row.inFlight)
		return err
	})
	if err != nil {
		h.restoreMarks(ms)
	}
	return won, marks, late, err
}

// storedStreamQuery reads a run's stored stream from a sequence on: the
// child instance's path, the run id and the first sequence.
const storedStreamQuery = `SELECT ch.seq, ch.body FROM instances i CROSS JOIN ` + childChunksFrom + `
		WHERE i.path = ? AND c.instance_id = i.id AND c.run_id = ? AND ` + childChunksOn + `
		AND ch.seq >= ? ORDER BY ch.seq`

// storedStreamFrom returns the stored chunks with a sequence from seq on
// of the stream of run runID of the child instance at path child (its
// turn's and its continuations'), in order.
func storedStreamFrom(ctx context.Context, tx store.Tx, child, runID string, seq int) ([]chunk, error) {
	rows, err := tx.Query(ctx, storedStreamQuery, child, runID, seq)
	if err != nil {
		return nil, fmt.Errorf("agenttool: read the run's stored stream: %w", err)
	}
	defer rows.Close()
	var out []chunk
	for rows.Next() {
		var c chunk
		if err := rows.Scan(&c.seq, &c.body); err != nil {
			return nil, fmt.Errorf("agenttool: read the run's stored stream: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// writeTerminalTx is writeTerminal's writes in tx, on the registry of the
// parent p (the fused end of a child writes it). For an awaited run it
// also opens the end's delivery (finish_delivered_at): pending when the
// parent has a FinishObserver to tell (observed), delivered at once when
// it has none. A pending delivery is a wake reason of the parent of its
// own (finishWakeReason), so that the end is delivered as soon as the
// parent's node (this one after a restart, or the one that takes its
// shard over) starts, even when nothing else of the parent is unfinished.
//
// inFlight limits the write to a run still in flight (starting, running);
// otherwise it records over any end but a hard one.
func writeTerminalTx(ctx context.Context, tx store.Tx, p *host, runID string, res Result, mark int, now int64, observed, inFlight bool) (won bool, marks []int, err error) {
	iid := p.iid
	open := `status NOT IN ('completed', 'error', 'aborted')`
	if inFlight {
		open = `status IN ('starting', 'running')`
	}
	err = func() error {
		var raw sql.NullString
		var detached int
		err := tx.QueryRow(ctx, `SELECT terminal_marks, detached FROM agent_tool_runs WHERE instance_id = ? AND run_id = ? AND `+open,
			iid, runID).Scan(&raw, &detached)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if raw.Valid {
			_ = json.Unmarshal([]byte(raw.String), &marks)
		}
		marks = append(marks, mark)
		mj, _ := json.Marshal(marks)
		var still any
		if res.ChildStillRunning != nil {
			still = boolInt(*res.ChildStillRunning)
		}
		args := []any{res.Status, nullStr(res.Summary), nullStr(string(res.Output)), nullStr(res.Error),
			nullStr(string(res.Reason)), still, now, string(mj), usageColumn(res.Usage)}
		setDelivered := ""
		if detached == 0 {
			// A detached run's deliveries have their own ledger (deliver).
			var delivered any // pending
			if !observed {
				delivered = now
			}
			setDelivered = `, finish_delivered_at = ?`
			args = append(args, delivered)
		}
		r, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET status = ?, summary = ?, output_json = ?, error_message = ?,
				interrupted_reason = ?, child_still_running = ?, completed_at = ?, terminal_marks = ?,
				usage_json = COALESCE(?, usage_json), queued_input = NULL`+setDelivered+`
			WHERE instance_id = ? AND run_id = ? AND `+open,
			append(args, iid, runID)...)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		won = n == 1
		if err != nil || !won || detached != 0 || !observed {
			return err
		}
		return p.b.KeepAwakeTx(ctx, tx, finishWakeReason(runID))
	}()
	return won, marks, err
}

// queuedColumn is the queued_input of a waiting run's input (null for a
// run that does not wait).
func queuedColumn(in json.RawMessage) any {
	if in == nil {
		return nil
	}
	return string(orNull(in))
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func marshalOrNil(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case Display:
		if len(x) == 0 {
			return nil, nil
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return string(b), nil
}

// eventSeq maps a child stream sequence to the run's event sequence. The
// sequence of a run is one monotonic series that live frames, replay and
// re-attach share: started is 0; terminal event j is marks[j]+1+j (marks[j]
// is the child's next stream sequence when that terminal was written); a
// child chunk c is c+1 plus the number of terminal events written before it.
// Numbers are never reused, so a client that deduplicates by (run,
// sequence) never drops a real frame.
func eventSeq(childSeq int, marks []int) int64 {
	n := 0
	for _, m := range marks {
		if m <= childSeq {
			n++
		}
	}
	return int64(childSeq + 1 + n)
}

func terminalSeq(marks []int) int64 {
	j := len(marks) - 1
	return int64(marks[j] + 1 + j)
}
