package agenttool

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentry/agentry/store"
)

// inspectChild returns the child's record of a run, or nil when the child
// has none (which means "not known yet", never failure).
func (h *host) inspectChild(ctx context.Context, runID string) (*Inspection, error) {
	h.mu.Lock()
	_, known := h.child[runID]
	h.mu.Unlock()
	if h.fresh && !known {
		// Created by this hydration: every run it has, it started here.
		return nil, nil
	}
	var in *Inspection
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		in, err = scanInspection(tx.QueryRow(ctx, `SELECT `+inspectionCols+`
			FROM agent_tool_child_runs r WHERE r.instance_id = ? AND r.run_id = ?`, h.iid, runID))
		if err != nil {
			return err
		}
		if in.Milestones, err = h.queryMilestones(ctx, tx, runID); err != nil {
			return fmt.Errorf("milestones: %w", err)
		}
		return nil
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("agenttool: inspect child run: %w", err)
	}
	if in.Status == childRunning {
		h.mu.Lock()
		if cr := h.child[runID]; cr != nil {
			in.Waiting = cr.waiting
		}
		h.mu.Unlock()
	}
	return in, nil
}

// cancelChildRun aborts a run executing here; its watcher records aborted
// with reason.
func (h *host) cancelChildRun(ctx context.Context, runID, reason string) error {
	h.mu.Lock()
	cr, ok := h.child[runID]
	if ok {
		cr.reason = reason
		cr.stopWaitLocked()
	}
	h.mu.Unlock()
	if cb, has := chatOf(h.a); ok && has {
		// Its watcher records the end: aborted if the turn was still
		// running, its real result if the turn had already ended.
		cb.CancelTurn(cr.streamID)
		return nil
	}
	// Not running here: record the end directly.
	now := h.rt.Clock().Now().UnixMilli()
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_child_runs SET status = ?, error_message = ?, completed_at = ?
			WHERE instance_id = ? AND run_id = ? AND completed_at IS NULL`, StatusAborted, reason, now, h.iid, runID)
		return err
	})
	if err == nil {
		h.hintParent()
	}
	return err
}

// inspectionCols are the columns of agent_tool_child_runs (as r) that
// scanInspection reads.
const inspectionCols = `r.run_id, r.request_id, r.status, r.summary, r.output_json, r.error_message, r.started_at, r.completed_at,
	r.progress_json, r.last_signal_at, r.waiting_json`

// scanInspection reads a child's record of a run (inspectionCols).
func scanInspection(row interface{ Scan(...any) error }) (*Inspection, error) {
	var in Inspection
	var req, summary, output, errMsg, progress, waiting sql.NullString
	var started int64
	var completed, signal sql.NullInt64
	if err := row.Scan(&in.RunID, &req, &in.Status, &summary, &output, &errMsg, &started, &completed, &progress, &signal, &waiting); err != nil {
		return nil, err
	}
	if waiting.Valid && !completed.Valid {
		// Written by this package (recordWait): a value that does not
		// decode reads as not waiting.
		_ = json.Unmarshal([]byte(waiting.String), &in.Waiting)
	}
	in.RequestID, in.Summary, in.Error = req.String, summary.String, errMsg.String
	if output.Valid {
		in.Output = json.RawMessage(output.String)
	}
	in.StartedAt = time.UnixMilli(started)
	if completed.Valid {
		t := time.UnixMilli(completed.Int64)
		in.CompletedAt = &t
	}
	if progress.Valid {
		in.Progress = json.RawMessage(progress.String)
	}
	if signal.Valid {
		t := time.UnixMilli(signal.Int64)
		in.LastSignalAt = &t
	}
	return &in, nil
}

// childRunRef is a run this instance was executing as a child: its id and
// the id of its turn (empty when the turn's id was not recorded).
type childRunRef struct{ runID, streamID string }

// queryChildRuns lists the runs this instance was executing, unfinished.
func (h *host) queryChildRuns(ctx context.Context, tx store.Tx) ([]childRunRef, error) {
	rows, err := tx.Query(ctx, `SELECT run_id, COALESCE(request_id, '') FROM agent_tool_child_runs
		WHERE instance_id = ? AND completed_at IS NULL`, h.iid)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var list []childRunRef
	for rows.Next() {
		var p childRunRef
		if err := rows.Scan(&p.runID, &p.streamID); err != nil {
			return nil, err
		}
		list = append(list, p)
	}
	return list, rows.Err()
}

// resumeChildRuns re-arms the watchers of runs that were executing here
// before an eviction or a restart (list); the chat layer resumes their
// turns.
func (h *host) resumeChildRuns(ctx context.Context, list []childRunRef) error {
	if len(list) == 0 {
		return nil
	}
	cb, ok := chatOf(h.a)
	if !ok {
		return nil
	}
	for _, p := range list {
		if p.streamID == "" {
			// Recorded, and perhaps submitted, but the turn's id was not
			// written (a crash in between): the submission's key finds the
			// turn. Never submitted: the parent's recovery starts it.
			id, found, err := cb.SubmittedTurn(ctx, submissionKey(p.runID))
			if err != nil {
				return fmt.Errorf("agenttool: resume child runs: %w", err)
			}
			if !found {
				continue
			}
			if err := h.recordTurnID(ctx, p.runID, id); err != nil {
				return err
			}
			p.streamID = id
		}
		cr := h.track(p.runID, p.streamID, false)
		// The hook of the first start is not stored: attach it again, so
		// that the resumed turn's end records the run's end in its own
		// commit. (The turn runs once the agent has started, after this.)
		if end := h.endHook(cr); end != nil {
			cb.AttachEnd(p.streamID, end)
		}
	}
	return nil
}

// submissionKey is the idempotency key of a run's child turn.
func submissionKey(runID string) string { return "agent-tool:" + runID }

// recordTurnID records the id of the child turn that executes a run.
func (h *host) recordTurnID(ctx context.Context, runID, streamID string) error {
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_child_runs SET request_id = ? WHERE instance_id = ? AND run_id = ?`, streamID, h.iid, runID)
		return err
	})
	if err != nil {
		return fmt.Errorf("agenttool: record child turn: %w", err)
	}
	return nil
}

// childInput returns the input a child run was recorded with.
func (h *host) childInput(ctx context.Context, runID string) (json.RawMessage, error) {
	var in sql.NullString
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT input_json FROM agent_tool_child_runs WHERE instance_id = ? AND run_id = ?`, h.iid, runID).Scan(&in)
	})
	if err != nil || !in.Valid {
		return nil, err
	}
	return json.RawMessage(in.String), nil
}
