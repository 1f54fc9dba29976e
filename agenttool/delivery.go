package agenttool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/store"
)

// finishWakeReason is the wake reason (agent.Base.KeepAwake) of a parent
// with the recorded, undelivered end of awaited run runID: written with
// the end (writeTerminalTx), deleted with its delivery mark
// (clearFinishWakeTx). Each end has its own, so its delivery needs no
// count of the others.
func finishWakeReason(runID string) string { return finishWakePrefix + runID }

// finishWakePrefix starts every finishWakeReason.
const finishWakePrefix = "agent-tool-finish:"

// clearFinishWakeTx deletes the wake reason of run runID's undelivered end
// in tx, which marks the end delivered.
func (h *host) clearFinishWakeTx(ctx context.Context, tx store.Tx, runID string) error {
	_, err := tx.Exec(ctx, `DELETE FROM instance_wake WHERE instance_id = ? AND reason = ?`, h.iid, finishWakeReason(runID))
	if err != nil {
		return fmt.Errorf("agenttool: clear the wake reason of %s: %w", runID, err)
	}
	return nil
}

// errDelivered refuses a transaction of a finish hook whose end another
// delivery recorded first.
var errDelivered = errors.New("agenttool: the run's end was delivered already")

type deliveryKeyKey struct{}

// DeliveryKey returns the idempotency key of the delivery that ctx belongs
// to: inside OnAgentToolFinish, one key per recorded end of a run (the
// same on every delivery of that end, on any node, after any restart);
// "" elsewhere. A hook whose effects leave the database (a message sent, a
// request to another service) passes it along, so the receiver drops a
// repeated delivery.
func DeliveryKey(ctx context.Context) string {
	k, _ := ctx.Value(deliveryKeyKey{}).(string)
	return k
}

// finishDelivery is one delivery of an awaited run's end to the parent's
// OnAgentToolFinish. Its fence rides every write transaction the hook runs
// with its context and marks the end delivered in it: the hook's writes
// and the mark commit together or not at all.
type finishDelivery struct {
	h     *host
	runID string
	marks string // terminal_marks of the end delivered: which end it is
	stamp int64  // finish_delivered_at this delivery writes

	mu   sync.Mutex
	done bool // the hook returned: the fence no longer marks anything
	ran  bool // a transaction of the hook carried the mark
}

func (d *finishDelivery) fence(ctx context.Context, tx store.Tx) error {
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done {
		return nil // a transaction the hook started that outlived it
	}
	r, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET finish_delivered_at = ?
		WHERE instance_id = ? AND run_id = ? AND terminal_marks = ? AND (finish_delivered_at IS NULL OR finish_delivered_at = ?)`,
		d.stamp, d.h.iid, d.runID, d.marks, d.stamp)
	if err != nil {
		return fmt.Errorf("agenttool: mark the end of %s delivered: %w", d.runID, err)
	}
	if n, err := r.RowsAffected(); err != nil || n != 1 {
		if err == nil {
			err = fmt.Errorf("%w: %s", errDelivered, d.runID)
		}
		return err
	}
	if err := d.h.clearFinishWakeTx(ctx, tx, d.runID); err != nil {
		return err
	}
	d.mu.Lock()
	d.ran = true
	d.mu.Unlock()
	return nil
}

// deliveryID names one recorded end of a run, for deliverFinish's
// in-process guard.
type deliveryID struct{ runID, marks string }

// deliverFinish tells the parent's OnAgentToolFinish the end of an awaited
// run that the terminal write with marks recorded, and records the
// delivery (finish_delivered_at). The mark rides the hook's own write
// transactions (finishDelivery.fence), so what the hook writes through its
// context commits exactly once; a hook that writes nothing costs one write
// for the mark after it returned. A crash before the mark leaves the end
// undelivered, and the parent's next start delivers it again
// (redeliverFinishes): the hook runs at least once, its database writes
// exactly once.
//
// A copy of the parent that the runtime has replaced (dropped with a lost
// shard lease, hydrated again) does not deliver: its writes are fenced, so
// its hook's would be refused, and the current copy may have read the
// runs before this end was recorded. It hands the end to the current copy
// (handFinishOver), before the hook and after a hook whose write did not
// carry the mark.
func (h *host) deliverFinish(ctx context.Context, run Run, res Result, marks []int) {
	o, ok := h.a.(FinishObserver)
	if !ok {
		return // the terminal write recorded it delivered
	}
	if cur := h.current(); cur != h {
		h.handFinishOver(cur, run.RunID)
		return
	}
	mj, _ := json.Marshal(marks)
	id := deliveryID{run.RunID, string(mj)}
	h.mu.Lock()
	if h.delivering[id] {
		h.mu.Unlock()
		return
	}
	h.delivering[id] = true
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.delivering, id)
		h.mu.Unlock()
	}()
	d := &finishDelivery{h: h, runID: run.RunID, marks: string(mj), stamp: h.rt.Clock().Now().UnixMilli()}
	hctx := store.WithFence(ctx, d.fence)
	hctx = context.WithValue(hctx, deliveryKeyKey{}, fmt.Sprintf("agent-tool-finish:%s:%s:%d", h.b.Path(), run.RunID, len(marks)))
	err := agent.Enter(hctx, h.a, func(ctx context.Context) error {
		o.OnAgentToolFinish(ctx, run, res)
		return nil
	})
	d.mu.Lock()
	d.done = true
	ran := d.ran
	d.mu.Unlock()
	if err != nil {
		h.b.Logger().Warn("agenttool: deliver finish", "run", run.RunID, "err", err)
		return // not called: delivered at the next start
	}
	if ran {
		// Marked in the hook's own transaction (or, if that transaction
		// failed, left for the next start to deliver again).
		return
	}
	if cur := h.current(); cur != h {
		// Replaced while the hook ran: its mark would be refused.
		h.handFinishOver(cur, run.RunID)
		return
	}
	h.queueMark(pendingMark{runID: run.RunID, marks: d.marks, stamp: d.stamp})
}

// handFinishOver gives the delivery of run runID's recorded end to cur,
// the copy of this parent that the runtime serves now, in the background:
// cur delivers the end unless it is delivered, or a delivery of it is
// under way there (deliverRecorded).
func (h *host) handFinishOver(cur *host, runID string) {
	h.publish(h.rt.Context(), "finish:handed-over", map[string]any{"runId": runID})
	release := cur.b.KeepAlive()
	cur.rt.Go(func(ctx context.Context) {
		defer release()
		cur.deliverRecorded(agent.WithAgent(ctx, cur.a), runID)
	})
}

// deliverRecorded delivers the recorded end of awaited run runID if it is
// not delivered and no delivery of it is under way in this copy of the
// parent. The delivery mark lets only one delivery's writes commit.
func (h *host) deliverRecorded(ctx context.Context, runID string) {
	row, ok, err := h.readRun(ctx, runID)
	if err != nil {
		h.b.Logger().Warn("agenttool: deliver a handed-over end", "run", runID, "err", err) // at the next start
		return
	}
	if !ok || row.det.Detached || row.Status.Active() || row.det.FinishDelivered || h.markPending(runID) {
		return
	}
	h.deliverFinish(ctx, row.Run, row.Result(), row.marks)
}

// markFlushDelay is how long the delivery mark of a hook that wrote
// nothing waits for a transaction of the parent to carry it (its next
// dispatch or terminal write) before it is written on its own.
const markFlushDelay = time.Second

// pendingMark is the delivery mark of a finish hook that wrote nothing
// through its context, not written yet.
type pendingMark struct {
	runID, marks string
	stamp        int64
}

// markPending reports whether a delivery of runID's end is under way in
// this copy of the parent: its hook running, or its mark waiting for a
// transaction (queueMark).
func (h *host) markPending(runID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.delivering {
		if id.runID == runID {
			return true
		}
	}
	for _, m := range h.marks {
		if m.runID == runID {
			return true
		}
	}
	return false
}

// queueMark holds a delivery mark for the parent's next write transaction
// (takeMarks), and writes it after markFlushDelay if none came: a hook
// that writes nothing costs at most one write, and usually none. Until
// the mark is written a crash delivers the end again (at least once).
func (h *host) queueMark(m pendingMark) {
	h.mu.Lock()
	h.marks = append(h.marks, m)
	arm := !h.markArmed
	h.markArmed = true
	h.mu.Unlock()
	if !arm {
		return
	}
	h.rt.Go(func(ctx context.Context) {
		// Real time, not the runtime's clock: nothing waits for this
		// timer, and a test's fake clock must not count it among the
		// timers it waits for.
		t := time.NewTimer(markFlushDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			ctx = context.WithoutCancel(ctx) // closing: write them now
		}
		h.mu.Lock()
		h.markArmed = false
		h.mu.Unlock()
		ms := h.takeMarks()
		if len(ms) == 0 {
			return
		}
		err := h.b.DB().Update(ctx, func(tx store.Tx) error { return h.writeMarksTx(ctx, tx, ms) })
		if err != nil {
			// Not written: the next start delivers those ends again.
			h.b.Logger().Warn("agenttool: mark finishes delivered", "runs", len(ms), "err", err)
		}
	})
}

// takeMarks returns the pending delivery marks for a transaction of the
// parent to write (writeMarksTx); the caller gives them back
// (restoreMarks) if that transaction fails.
func (h *host) takeMarks() []pendingMark {
	h.mu.Lock()
	defer h.mu.Unlock()
	ms := h.marks
	h.marks = nil
	return ms
}

func (h *host) restoreMarks(ms []pendingMark) {
	if len(ms) == 0 {
		return
	}
	h.mu.Lock()
	h.marks = append(h.marks, ms...)
	h.mu.Unlock()
}

// writeMarksTx records delivery marks in tx.
func (h *host) writeMarksTx(ctx context.Context, tx store.Tx, ms []pendingMark) error {
	for _, m := range ms {
		r, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET finish_delivered_at = ?
			WHERE instance_id = ? AND run_id = ? AND terminal_marks = ? AND finish_delivered_at IS NULL`,
			m.stamp, h.iid, m.runID, m.marks)
		if err != nil {
			return fmt.Errorf("agenttool: mark the end of %s delivered: %w", m.runID, err)
		}
		if n, err := r.RowsAffected(); err != nil || n != 1 {
			continue // a later end of the run is pending: its reason stays
		}
		if err := h.clearFinishWakeTx(ctx, tx, m.runID); err != nil {
			return err
		}
	}
	return nil
}

// redeliverFinishes delivers the ends of awaited runs that were recorded
// but not delivered (the process died in between, or the hook's write
// failed), from the parent's start.
func (h *host) redeliverFinishes(ctx context.Context, rows []runRow) {
	for _, row := range rows {
		h.deliverFinish(ctx, row.Run, row.Result(), row.marks)
		h.publish(ctx, "recovery:redelivered", map[string]any{"runId": row.RunID, "agentType": row.AgentType, "status": string(row.Status)})
	}
}

// markDelivered records the ends of rows delivered without a hook to tell.
func (h *host) markDelivered(ctx context.Context, rows []runRow) error {
	now := h.rt.Clock().Now().UnixMilli()
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		for _, row := range rows {
			if _, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET finish_delivered_at = ?
				WHERE instance_id = ? AND run_id = ? AND finish_delivered_at IS NULL`, now, h.iid, row.RunID); err != nil {
				return err
			}
			if err := h.clearFinishWakeTx(ctx, tx, row.RunID); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("agenttool: mark ends delivered: %w", err)
	}
	return nil
}
