package agenttool

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/store"
)

// notifyFinish adds the message about a detached run's end to the parent's
// chat and lets the model take a turn with it. It is idempotent per (run,
// status): the message id and the submission key are derived from both.
func (h *host) notifyFinish(ctx context.Context, row runRow, run Run, res Result) error {
	cb, ok := chatOf(h.a)
	if !ok {
		return fmt.Errorf("agenttool: notify needs a chat parent (embed chat.Base)")
	}
	text := defaultCompletionText(run, res)
	if f, ok := h.a.(CompletionFormatter); ok {
		_ = agent.Enter(ctx, h.a, func(context.Context) error {
			text = f.FormatDetachedCompletion(run, res)
			return nil
		})
	}
	if text == "" {
		return nil
	}
	id := "detached-finish:" + run.RunID + ":" + string(res.Status)
	meta, _ := json.Marshal(map[string]any{"source": notifySource(row), "runId": run.RunID,
		"agentType": run.AgentType, "status": res.Status})
	msg := message.Message{ID: id, Role: message.RoleUser, Metadata: meta,
		Parts: []message.Part{{Type: message.PartText, Text: text}}}
	_, err := cb.SubmitMessages(ctx, []message.Message{msg}, chat.SubmitOptions{IdempotencyKey: id})
	return err
}

// defaultNotifySource is metadata.source of notifications of a run that
// names no NotifySource.
const defaultNotifySource = "detached-agent-tool"

func notifySource(row runRow) string {
	if row.det.NotifySource != "" {
		return row.det.NotifySource
	}
	return defaultNotifySource
}

// defaultCompletionText is the seed's formatDetachedCompletion.
func defaultCompletionText(run Run, res Result) string {
	head := fmt.Sprintf("Background task %q (run %s)", run.AgentType, run.RunID)
	switch res.Status {
	case StatusCompleted:
		if res.Summary == "" {
			return head + " finished successfully."
		}
		return head + " finished:\n\n" + res.Summary
	case StatusAborted:
		return head + " was cancelled."
	case StatusInterrupted:
		if res.Reason == ReasonBudgetExceeded {
			return head + " ran out of time before completing and was stopped."
		}
		if res.Error == "" {
			return head + " was interrupted before completing."
		}
		return head + " was interrupted before completing: " + res.Error
	default:
		if res.Error == "" {
			return head + " failed."
		}
		return head + " failed: " + res.Error
	}
}

// milestoneNotice delivers the chat notification of one milestone of a
// detached run, at most once per (run, name).
func (h *host) milestoneNotice(ctx context.Context, row runRow, m Milestone) {
	mn := row.det.OnMilestones
	if mn == nil || !slices.Contains(mn.Names, m.Name) {
		return
	}
	cb, ok := chatOf(h.a)
	if !ok {
		return
	}
	var claimed bool
	err := h.b.DB().Update(ctx, func(tx store.Tx) error {
		r, err := tx.Exec(ctx, `INSERT INTO agent_tool_milestone_notices (instance_id, run_id, name, delivered_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (instance_id, run_id, name) DO NOTHING`, h.iid, row.RunID, m.Name, h.rt.Clock().Now().UnixMilli())
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		claimed = n == 1
		return err
	})
	if err != nil || !claimed {
		return
	}
	text := fmt.Sprintf("Background task %q (run %s) reached milestone %q.", row.AgentType, row.RunID, m.Name)
	if m.Message != "" {
		text += " " + m.Message
	}
	if f, ok := h.a.(MilestoneFormatter); ok {
		_ = agent.Enter(ctx, h.a, func(context.Context) error {
			text = f.FormatDetachedMilestone(row.Run, m)
			return nil
		})
	}
	if text == "" {
		return
	}
	id := "detached-ms:" + row.RunID + ":" + m.Name
	meta, _ := json.Marshal(map[string]any{"source": notifySource(row), "runId": row.RunID, "milestone": m.Name})
	parts := []message.Part{{Type: message.PartText, Text: text}}
	actx := agent.WithAgent(ctx, h.a)
	if mn.Mode == MilestoneReact {
		msg := message.Message{ID: id, Role: message.RoleUser, Metadata: meta, Parts: parts}
		_, err = cb.SubmitMessages(actx, []message.Message{msg}, chat.SubmitOptions{IdempotencyKey: id})
	} else {
		msg := message.Message{ID: id, Role: message.RoleAssistant, Metadata: meta, Parts: parts}
		_, err = cb.AppendMessages(actx, []message.Message{msg})
	}
	if err != nil {
		h.b.Logger().Warn("agenttool: milestone notice", "run", row.RunID, "milestone", m.Name, "err", err)
	}
}

// deliverMilestoneNotices delivers the notices of milestones a child
// reached while the parent was not following (after an eviction or a
// restart).
func (h *host) deliverMilestoneNotices(ctx context.Context, row runRow, ch childOps) {
	if row.det.OnMilestones == nil {
		return
	}
	ms, err := ch.milestones(ctx, row.RunID)
	if err != nil {
		return
	}
	for _, m := range ms {
		h.milestoneNotice(ctx, row, m)
	}
}

// signalDispatcher hands progress signals seen while following a child to
// the parent's hooks on a goroutine of its own, so the child's stream is
// never held up by them.
type signalDispatcher struct {
	h    *host
	row  runRow
	ch   chan ProgressEvent
	done chan struct{}
	once sync.Once
}

func (h *host) newSignalDispatcher(row runRow) *signalDispatcher {
	_, observes := h.a.(ProgressObserver)
	if !observes && row.det.OnMilestones == nil {
		return nil
	}
	d := &signalDispatcher{h: h, row: row, ch: make(chan ProgressEvent, 256), done: make(chan struct{})}
	h.rt.Go(func(ctx context.Context) {
		defer close(d.done)
		for ev := range d.ch {
			// Each signal is one input of the parent.
			_ = agent.Enter(ctx, h.a, func(ctx context.Context) error {
				if o, ok := h.a.(ProgressObserver); ok {
					o.OnProgress(ctx, row.Run, ev)
				}
				if ev.Milestone != nil {
					h.milestoneNotice(ctx, row, *ev.Milestone)
				}
				return nil
			})
		}
	})
	return d
}

// offer queues a chunk body if it is a signal. It never blocks: a full
// queue drops the signal (OnProgress is not durable, and milestone notices
// are delivered by the reconcile as well).
func (d *signalDispatcher) offer(body string) {
	if d == nil {
		return
	}
	ev, ok := progressOf(body)
	if !ok {
		return
	}
	select {
	case d.ch <- ev:
	default:
	}
}

func (d *signalDispatcher) close() {
	if d == nil {
		return
	}
	d.once.Do(func() { close(d.ch) })
	<-d.done
}
