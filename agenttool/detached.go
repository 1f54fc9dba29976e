package agenttool

import (
	"context"
	"encoding/json"
	"fmt"
	"go/token"
	"reflect"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/store"
)

// DetachedOptions make a run detached: RunAgentTool returns a handle right
// after dispatch, the run outlives the turn that started it, and its end is
// delivered durably — by OnFinish, or as a chat notification.
type DetachedOptions struct {
	// OnFinish names a method of the parent, func(ctx context.Context, run
	// Run, result Result) error, called once when the run ends (at least
	// once if it fails). Give it with the function OnFinish and a method
	// value, OnFinish(a.OnImportDone), so that the compiler checks the
	// method and its signature, or as the method's name ("OnImportDone").
	// It is resolved by name on the rehydrated parent, so it survives
	// restarts; a name the parent has no such method for is refused at
	// dispatch. It wins over Notify.
	OnFinish string
	// Notify adds a message about the run's end to the parent's chat and
	// lets its model take a turn with it (chat parents only).
	Notify bool
	// NotifySource is metadata.source of notification messages.
	NotifySource string
	// MaxBudget is the run's absolute ceiling; zero means the parent's
	// DetachedMaxBudget (24 h by default). Past it the run is interrupted
	// (budget-exceeded) and the child torn down.
	MaxBudget time.Duration
	// NoProgressBudget is how long the child may stay silent after its
	// first progress signal; zero means the parent's default (1 h), a
	// negative value disables it. Past it the run is interrupted
	// (no-progress) and the child torn down.
	NoProgressBudget time.Duration
	// OnMilestones posts a chat message when the child reaches one of
	// these milestones (each at most once per run).
	OnMilestones *MilestoneNotices
}

// OnFinish returns the durable key of a detached run's completion
// callback given as a method value of the parent, for
// DetachedOptions.OnFinish:
//
//	Detached: &agenttool.DetachedOptions{OnFinish: agenttool.OnFinish(a.OnImportDone)}
//
// The compiler checks the callback's signature; the key is the method's
// name, derived as agent.Method documents, and RunAgentTool checks when it
// dispatches the run that the parent has a method of that name and
// signature. A function that is not a method value (a closure) gets a key
// that dispatch refuses: the callback must outlive the process, so it is
// a method found again on the rehydrated parent.
func OnFinish(fn func(ctx context.Context, run Run, result Result) error) string {
	return agent.Method(fn)
}

// MilestoneMode says how a milestone notification reaches the chat.
type MilestoneMode string

// Milestone modes.
const (
	// MilestoneNarrate adds an assistant status line; the model does not
	// take a turn.
	MilestoneNarrate MilestoneMode = "narrate"
	// MilestoneReact adds a user-role message the model answers.
	MilestoneReact MilestoneMode = "react"
)

// MilestoneNotices choose the milestones that notify the parent's chat.
type MilestoneNotices struct {
	Names []string      `json:"names"`
	Mode  MilestoneMode `json:"mode"`
}

// Defaults of detached budgets.
const (
	DefaultDetachedMaxBudget = 24 * time.Hour
	DefaultNoProgressBudget  = time.Hour
	deliveryLease            = 60 * time.Second
)

// reconcileCadence is the delay before each reconcile tick; the last one
// repeats.
var reconcileCadence = [...]time.Duration{5 * time.Second, 15 * time.Second, 30 * time.Second, 2 * time.Minute}

// DetachedBudgeter overrides the parent's default detached budgets (the
// seed's detachedMaxBudgetMs and detachedNoProgressBudgetMs); zero keeps a
// default, a negative no-progress budget disables it.
type DetachedBudgeter interface {
	DetachedBudgets() (maxBudget, noProgress time.Duration)
}

// CompletionFormatter overrides the text of a notify message; an empty
// string suppresses the message.
type CompletionFormatter interface {
	FormatDetachedCompletion(run Run, result Result) string
}

// MilestoneFormatter overrides the text of a milestone notification; an
// empty string suppresses it.
type MilestoneFormatter interface {
	FormatDetachedMilestone(run Run, m Milestone) string
}

var (
	runType    = reflect.TypeFor[Run]()
	resultType = reflect.TypeFor[Result]()
)

// onFinishMethod finds the parent's OnFinish method by name.
func onFinishMethod(a agent.Agent, name string) (reflect.Value, error) {
	m := reflect.ValueOf(a).MethodByName(name)
	if !m.IsValid() && !token.IsIdentifier(name) {
		return reflect.Value{}, fmt.Errorf("agenttool: OnFinish %q is not a method name: give a method value of the parent, "+
			"agenttool.OnFinish(a.OnDone), or its name", name)
	}
	if !m.IsValid() {
		return reflect.Value{}, fmt.Errorf("agenttool: OnFinish method %q does not exist on %T", name, a)
	}
	t := m.Type()
	if t.NumIn() != 3 || t.In(0) != reflect.TypeFor[context.Context]() || t.In(1) != runType || t.In(2) != resultType ||
		t.NumOut() > 1 || (t.NumOut() == 1 && t.Out(0) != reflect.TypeFor[error]()) {
		return reflect.Value{}, fmt.Errorf("agenttool: OnFinish method %q must be func(context.Context, agenttool.Run, agenttool.Result) error", name)
	}
	return m, nil
}

// detachedColumns validates detached options and resolves their defaults.
func (h *host) detachedColumns(o *DetachedOptions, now time.Time) (detachedCols, error) {
	if o == nil {
		return detachedCols{}, nil
	}
	if o.OnFinish != "" {
		if _, err := onFinishMethod(h.a, o.OnFinish); err != nil {
			return detachedCols{}, err
		}
	}
	maxBudget, noProgress := DefaultDetachedMaxBudget, DefaultNoProgressBudget
	if b, ok := h.a.(DetachedBudgeter); ok {
		m, n := b.DetachedBudgets()
		if m > 0 {
			maxBudget = m
		}
		if n != 0 {
			noProgress = n
		}
	}
	if o.MaxBudget > 0 {
		maxBudget = o.MaxBudget
	}
	if o.NoProgressBudget != 0 {
		noProgress = o.NoProgressBudget
	}
	at := now.Add(maxBudget)
	d := detachedCols{Detached: true, OnFinish: o.OnFinish, Notify: o.Notify, NotifySource: o.NotifySource,
		MaxBudgetAt: &at, OnMilestones: o.OnMilestones}
	if noProgress > 0 {
		d.NoProgressBudget = noProgress
	}
	return d, nil
}

// follow keeps following a detached run in the background (the fast path):
// its chunks reach the parent's clients and its end is delivered as soon as
// it happens, while the parent is in memory.
func (h *host) follow(row runRow) { h.followHeld(row, nil) }

// followHeld is follow for a run that holds slot s of its parent's bound
// on runs executing at once: the follower holds it until the run ends.
func (h *host) followHeld(row runRow, s *runSlot) {
	h.mu.Lock()
	_, live := h.live[row.RunID]
	h.mu.Unlock()
	if live {
		s.release()
		return
	}
	release := h.b.KeepAlive()
	h.rt.Go(func(ctx context.Context) {
		defer release()
		defer s.release()
		ctx = agent.WithAgent(ctx, h.a)
		if r := h.remote(h.b.Path().Child(row.AgentType, row.RunID)); r != nil {
			h.followRemote(ctx, row, r)
			return
		}
		child, releaseChild, err := h.rt.Acquire(ctx, h.b.Path().Child(row.AgentType, row.RunID))
		if err != nil {
			return
		}
		defer releaseChild()
		ch, err := hostOf(child)
		if err != nil {
			return
		}
		insp, err := ch.inspectChild(ctx, row.RunID)
		if err != nil || insp == nil || insp.RequestID == "" {
			return // the reconcile keeps watching
		}
		cr := ch.track(row.RunID, insp.RequestID, insp.Status != childRunning)
		if _, err := h.await(ctx, row, child, cr, reattachLimits{}); err != nil && ctx.Err() == nil {
			h.b.Logger().Error("agenttool: detached run", "run", row.RunID, "err", err)
		}
	})
}

// slot is a delivery ledger slot.
type slot string

const (
	slotFinish slot = "finish"
	slotGiveUp slot = "give_up"
)

// deliver runs the delivery funnel for one slot of a detached run: the slot
// is claimed by compare-and-set with a lease, the global OnAgentToolFinish
// and the run's OnFinish (or its notify message) are called, and the slot is
// marked delivered. A claim that is held, or a slot already delivered, makes
// it a no-op; a failing callback leaves the claim to expire, so a later
// reconcile delivers again (at least once).
func (h *host) deliver(ctx context.Context, s slot, row runRow, run Run, res Result) error {
	now := h.rt.Clock().Now()
	var won bool
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		r, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET `+string(s)+`_claimed_at = ?
			WHERE instance_id = ? AND run_id = ? AND `+string(s)+`_delivered_at IS NULL
			AND (`+string(s)+`_claimed_at IS NULL OR `+string(s)+`_claimed_at <= ?)`,
			now.UnixMilli(), h.iid, row.RunID, now.Add(-deliveryLease).UnixMilli())
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		won = n == 1
		return err
	})
	if err != nil || !won {
		return err
	}
	// The delivery joins the run's trace, also when it comes after a
	// restart.
	ctx, span := h.rt.Tracer().Start(runSpanContext(ctx, row), "agent_tool.deliver",
		trace.WithAttributes(agent.AttrAgent.String(h.b.Path().String()), attrRunID.String(row.RunID),
			attrType.String(row.AgentType), attrStatus.String(string(res.Status))))
	defer func() { agent.EndSpan(span, err) }()
	// The delivery is one input of the parent.
	callback := row.det.OnFinish
	cbErr := agent.Enter(ctx, h.a, func(actx context.Context) error {
		if o, ok := h.a.(FinishObserver); ok {
			o.OnAgentToolFinish(actx, run, res)
		}
		switch {
		case callback != "":
			return h.callOnFinish(actx, callback, run, res)
		case row.det.Notify:
			callback = "notify"
			return h.notifyFinish(actx, row, run, res)
		}
		return nil
	})
	if cbErr != nil {
		h.publish(ctx, "detached:delivery_failed", map[string]any{"runId": row.RunID, "kind": string(s), "status": string(res.Status),
			"callback": callback, "error": cbErr.Error()})
		err = fmt.Errorf("agenttool: deliver %s of %s: %w", s, row.RunID, cbErr)
		return err
	}
	err = h.b.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET `+string(s)+`_delivered_at = ? WHERE instance_id = ? AND run_id = ?`,
			h.rt.Clock().Now().UnixMilli(), h.iid, row.RunID)
		return err
	})
	if err == nil {
		h.publish(ctx, "detached:delivered", map[string]any{"runId": row.RunID, "kind": string(s), "status": string(res.Status)})
	}
	return err
}

func (h *host) callOnFinish(ctx context.Context, name string, run Run, res Result) (err error) {
	m, err := onFinishMethod(h.a, name)
	if err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("OnFinish %s panicked: %v", name, p)
		}
	}()
	out := m.Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(run), reflect.ValueOf(res)})
	if len(out) == 1 && !out[0].IsNil() {
		return out[0].Interface().(error)
	}
	return nil
}

// gaveUp reports whether a run's give-up slot was claimed: an aborted end
// after a give-up is the teardown's own doing and is not delivered again.
func (h *host) gaveUp(ctx context.Context, runID string) bool {
	var n int
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM agent_tool_runs WHERE instance_id = ? AND run_id = ? AND given_up_at IS NOT NULL`,
			h.iid, runID).Scan(&n)
	})
	if err != nil && ctx.Err() == nil {
		h.b.Logger().Warn("agenttool: read give-up", "run", runID, "err", err)
	}
	return n > 0
}

// reconcileMethod is the layer schedule of the reconcile tick.
const reconcileMethod = "@agenttool/reconcile"

// LayerScheduleName names this layer's schedules.
func (h *host) LayerScheduleName() string { return "agenttool" }

// LayerSchedule runs the reconcile tick.
func (h *host) LayerSchedule(ctx context.Context, name string, payload json.RawMessage) error {
	if name != "reconcile" {
		return fmt.Errorf("agenttool: unknown schedule %q", name)
	}
	var p struct {
		CadenceIndex int `json:"cadenceIndex"`
	}
	_ = json.Unmarshal(payload, &p)
	return h.reconcile(ctx, p.CadenceIndex)
}

// armReconcile makes sure exactly one reconcile tick is scheduled; with
// reset it restarts the cadence from its first (shortest) delay.
func (h *host) armReconcile(ctx context.Context, reset bool) error {
	h.armMu.Lock()
	defer h.armMu.Unlock()
	scheds, err := h.b.Schedules(ctx)
	if err != nil {
		return err
	}
	var existing []agent.Schedule
	for _, s := range scheds {
		if s.Method == reconcileMethod {
			existing = append(existing, s)
		}
	}
	if len(existing) > 0 && !reset {
		return nil
	}
	for _, s := range existing {
		if _, err := h.b.CancelSchedule(ctx, s.ID); err != nil {
			return err
		}
	}
	_, err = h.b.ScheduleAfter(ctx, reconcileCadence[0], reconcileMethod, map[string]int{"cadenceIndex": 0})
	return err
}

// reconcile is the durable delivery path: for every detached run whose end
// is not delivered yet it collects a finished child, enforces the budgets,
// resumes following a running child, and delivers due milestone
// notifications. It schedules the next tick while anything is outstanding.
func (h *host) reconcile(ctx context.Context, cadenceIndex int) error {
	rows, err := h.listRuns(ctx, `AND detached = 1 AND finish_delivered_at IS NULL`)
	if err != nil {
		return fmt.Errorf("agenttool: reconcile: %w", err)
	}
	for _, row := range rows {
		h.reconcileRun(ctx, row)
	}
	rows, err = h.listRuns(ctx, `AND detached = 1 AND finish_delivered_at IS NULL`)
	if err != nil || len(rows) == 0 {
		return err
	}
	next := min(cadenceIndex+1, len(reconcileCadence)-1)
	_, err = h.b.ScheduleAfter(ctx, reconcileCadence[next], reconcileMethod, map[string]int{"cadenceIndex": next})
	return err
}

func (h *host) reconcileRun(ctx context.Context, row runRow) {
	log := h.b.Logger()
	if row.Status.Hard() {
		// The end was recorded but its delivery did not finish.
		if err := h.deliver(ctx, slotFinish, row, row.Run, row.Result()); err != nil {
			log.Warn("agenttool: reconcile delivery", "run", row.RunID, "err", err)
		}
		return
	}
	if row.Status == StatusStarting && row.queued != nil {
		// Waiting for a slot (here, or again after a restart).
		h.queueDetached(row, row.queued)
		return
	}
	if r := h.remote(h.b.Path().Child(row.AgentType, row.RunID)); r != nil {
		h.reconcileRemote(ctx, row, r)
		return
	}
	child, err := h.rt.Get(ctx, h.b.Path().Child(row.AgentType, row.RunID))
	if err != nil {
		log.Warn("agenttool: reconcile child", "run", row.RunID, "err", err)
		return
	}
	ch, err := hostOf(child)
	if err != nil {
		return
	}
	insp, err := ch.inspectChild(ctx, row.RunID)
	if err != nil {
		log.Warn("agenttool: reconcile inspect", "run", row.RunID, "err", err)
		return
	}
	h.deliverMilestoneNotices(ctx, row, ch)
	if insp != nil && insp.Status != childRunning {
		if row.Status == StatusInterrupted && insp.Status == StatusAborted && h.gaveUp(ctx, row.RunID) {
			// Our own teardown: the give-up was the delivery.
			if err := h.markFinishDelivered(ctx, row.RunID); err != nil {
				log.Warn("agenttool: mark delivered", "run", row.RunID, "err", err)
			}
			return
		}
		mark := ch.streamNext(ctx, row.RunID)
		if _, err := h.finish(ctx, row, resultFromInspection(*insp), mark); err != nil {
			log.Warn("agenttool: reconcile finish", "run", row.RunID, "err", err)
		}
		return
	}
	if row.Status != StatusInterrupted {
		now := h.rt.Clock().Now()
		if row.det.MaxBudgetAt != nil && !now.Before(*row.det.MaxBudgetAt) {
			h.giveUp(ctx, row, ch, ReasonBudgetExceeded)
			return
		}
		if row.det.NoProgressBudget > 0 && !ch.isWaiting(row.RunID) {
			// A run that waits for input is waiting, not silent.
			if last := ch.lastSignal(ctx, row.RunID); last != nil && now.Sub(*last) >= row.det.NoProgressBudget {
				h.giveUp(ctx, row, ch, ReasonNoProgress)
				return
			}
		}
	}
	if insp != nil && insp.RequestID != "" {
		h.follow(row)
	}
}

// giveUp interrupts a detached run past a budget and tears its child down.
// The give-up is recorded first, so the child's aborted end that the
// teardown causes is recognised and not delivered a second time.
func (h *host) giveUp(ctx context.Context, row runRow, ch childOps, reason Reason) {
	msg := "Detached agent tool run exceeded its maximum budget; the parent gave up."
	if reason == ReasonNoProgress {
		msg = "Detached agent tool run made no progress within its no-progress budget; the parent gave up."
	}
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET given_up_at = COALESCE(given_up_at, ?) WHERE instance_id = ? AND run_id = ?`,
			h.rt.Clock().Now().UnixMilli(), h.iid, row.RunID)
		return err
	})
	if err != nil {
		h.b.Logger().Warn("agenttool: give up", "run", row.RunID, "err", err)
		return
	}
	tornDown := ch.cancelChildRun(ctx, row.RunID, "agent tool run given up by parent: "+string(reason)) == nil
	res := Result{Status: StatusInterrupted, Error: msg, Reason: reason, ChildStillRunning: ptr(!tornDown)}
	if _, err := h.finish(ctx, row, res, ch.streamNext(ctx, row.RunID)); err != nil {
		h.b.Logger().Warn("agenttool: give up", "run", row.RunID, "err", err)
	}
}

// childOps are what a parent's reconcile and give-up do with a run's
// child: a *host in this process, a remoteChild on another node.
type childOps interface {
	cancelChildRun(ctx context.Context, runID, reason string) error
	streamNext(ctx context.Context, runID string) int
	milestones(ctx context.Context, runID string) ([]Milestone, error)
}

// markFinishDelivered records the finish slot delivered without a call: the
// aborted end of a run whose give-up was its delivery.
func (h *host) markFinishDelivered(ctx context.Context, runID string) error {
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET finish_delivered_at = COALESCE(finish_delivered_at, ?) WHERE instance_id = ? AND run_id = ?`,
			h.rt.Clock().Now().UnixMilli(), h.iid, runID)
		return err
	})
	if err == nil {
		h.publish(ctx, "detached:delivered", map[string]any{"runId": runID, "kind": string(slotFinish), "status": string(StatusAborted), "suppressed": true})
	}
	return err
}

// undeliveredDetached selects the detached runs whose end is not delivered.
const undeliveredDetached = `AND detached = 1 AND finish_delivered_at IS NULL`

// resumeDetached re-arms the reconcile when detached runs still await
// delivery (after an eviction or a restart), so they are collected, held to
// their budgets and delivered without a client.
func (h *host) resumeDetached(ctx context.Context) {
	h.mu.Lock()
	rows, listed := h.startDetached, h.startListed && h.hasRuns == -1
	h.startDetached, h.startListed = nil, false
	h.mu.Unlock()
	if !listed {
		var err error
		if rows, err = h.listRuns(ctx, undeliveredDetached); err != nil {
			h.b.Logger().Error("agenttool: list detached runs", "err", err)
			return
		}
	}
	if len(rows) == 0 {
		return
	}
	// Keep a schedule that exists: the start may be the tick's own
	// hydration (after an eviction), and resetting would cancel the firing
	// tick and leave two schedules once it reschedules itself.
	if err := h.armReconcile(ctx, false); err != nil {
		h.b.Logger().Error("agenttool: arm reconcile", "err", err)
	}
	// The runs executing already hold slots of the parent's bound before
	// the runs that were waiting for one wait again.
	var queued []runRow
	for _, row := range rows {
		switch {
		case row.Status == StatusStarting && row.queued != nil:
			queued = append(queued, row)
		case row.Status.Active():
			h.followHeld(row, h.forceSlot())
		}
	}
	for _, row := range queued {
		h.queueDetached(row, row.queued)
	}
}
