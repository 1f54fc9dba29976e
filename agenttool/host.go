package agenttool

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// Options configure agent tools on a runtime.
type Options struct {
	// OpenDrillIn lets clients reach any agent-tool child through its
	// parent's route, subject only to the parent's OnBeforeSubAgent. By
	// default a child created by an agent tool is reachable only while the
	// parent's registry holds its run.
	OpenDrillIn bool
	// Remote reaches children owned by other nodes of a cluster
	// (agent.Options.Placement); package cluster sets it. Without it
	// every child is served by this runtime.
	Remote Remote
	// RemotePoll is how often a parent reads the progress of a run whose
	// child is on another node; zero means DefaultRemotePoll. When Remote
	// also implements Hints, the follower is woken by them and polls ten
	// times less often, as a fallback for a lost hint.
	RemotePoll time.Duration
	// MaxRunningAgentTools bounds, per parent, the agent-tool runs whose
	// child executes at once: a run past it is recorded and announced
	// (status starting) and waits for a slot, first come first served; it
	// is never refused. Zero means DefaultMaxRunningAgentTools, negative
	// unlimited; a parent's RunningLimiter overrides it.
	MaxRunningAgentTools int
}

type optionsKey struct{}

// Install enables agent tools on every agent of rt. Call it before Start;
// after it, Install returns agent.ErrStarted and changes nothing. It also
// has the runtime check every class for methods named as an agent-tool
// hook (OnAgentToolFinish, AgentToolOutput, …) with another signature.
func Install(rt *agent.Runtime, opts Options) error {
	if rt.Started() {
		return fmt.Errorf("agenttool: Install: %w", agent.ErrStarted)
	}
	if _, ok := rt.Value(optionsKey{}).(*Options); ok {
		return errors.New("agenttool: Install called twice on one runtime")
	}
	o := &opts
	if err := rt.DeclareHooks(hooks...); err != nil {
		return err
	}
	slots := newSlotTable()
	if err := rt.Use(func(a agent.Agent) agent.Layer {
		return &host{a: a, b: agent.BaseOf(a), rt: rt, opts: o, slots: slots}
	}); err != nil {
		return err
	}
	rt.SetValue(optionsKey{}, o)
	return nil
}

// hooks are the agent-tool hook interfaces (of parents and of children).
var hooks = []agent.Hook{
	agent.HookFor[StartObserver](nil),
	agent.HookFor[FinishObserver](nil),
	agent.HookFor[ConcurrencyLimiter](nil),
	agent.HookFor[RunningLimiter](nil),
	agent.HookFor[ProgressObserver](nil),
	agent.HookFor[DetachedBudgeter](nil),
	agent.HookFor[CompletionFormatter](nil),
	agent.HookFor[MilestoneFormatter](nil),
	agent.HookFor[ReattachNoProgressTimeouter](nil),
	agent.HookFor[ReattachMaxWindower](nil),
	agent.HookFor[InputFormatter](nil),
	agent.HookFor[OutputProvider](nil),
	agent.HookFor[SummaryProvider](nil),
}

// Hooks of the parent, all optional.

// StartObserver is told when a run is dispatched (the seed's
// onAgentToolStart).
type StartObserver interface {
	OnAgentToolStart(ctx context.Context, run Run)
}

// FinishObserver is told when a run reaches a terminal state (the seed's
// onAgentToolFinish), including cancel and clear of a run in flight: once
// per recorded end. A run ends once, with what its child did, also when
// the parent's recovery finds it in flight (docs/concurrency.md, "A run
// ends once"); only a run given up after the parent waited a whole budget
// (interrupted: no-progress, window-exceeded, inspect-failed) and repaired
// by a later re-dispatch of its id has two.
//
// The delivery of an awaited run's end is durable, in the parent's
// registry row: a crash (or the loss of the parent's node) after the end
// was recorded and before the hook was told leaves it undelivered, and the
// parent's next start (a restart, the node that takes its shard over, or
// its next use) calls the hook again. The contract:
//
//   - Writes the hook makes through ctx (Storage().Update, DB().Update, a
//     dispatch: any write transaction of the runtime's database run with
//     ctx) commit together with the mark that the end was delivered, in the
//     same transaction, so they happen exactly once: a delivery that comes
//     again after a crash finds the end delivered (and is not made), and
//     one that loses a race with another is refused (its transaction rolls
//     back). A transaction of the hook that fails in the database after
//     its writes (at its commit) leaves the end undelivered, to be
//     delivered again at the next start; an error that the hook's write
//     returns before that (a failed statement) is the hook's to handle,
//     and the end counts as delivered when the hook returns.
//   - Anything else the hook does (memory, a message to another service)
//     happens at least once. DeliveryKey(ctx) is the same on every
//     delivery of one end: pass it as an idempotency key.
//   - A hook that writes nothing through ctx costs one write after it
//     returned (the mark); a crash before that write delivers it again.
//
// Detached runs are delivered through their own ledger (DetachedOptions).
type FinishObserver interface {
	OnAgentToolFinish(ctx context.Context, run Run, result Result)
}

// ConcurrencyLimiter caps the runs in flight of one agent (the seed's
// maxConcurrentAgentTools); zero or negative means unlimited, the default.
type ConcurrencyLimiter interface {
	MaxConcurrentAgentTools() int
}

// host is the agent-tool layer of one instance: the parent's registry and
// live runs, and the child's runs.
type host struct {
	a    agent.Agent
	b    *agent.Base
	rt   *agent.Runtime
	opts *Options
	iid  int64
	// slots bound the runs executing at once, per parent (slots.go); one
	// table serves the runtime.
	slots *slotTable

	armMu sync.Mutex // serializes arming the reconcile tick
	mu    sync.Mutex
	live  map[string]*liveRun // parent: runs awaited in this process
	// recovering holds the runs whose end the parent's recovery records
	// now (recoveredRow), closed when it is recorded.
	recovering map[string]chan struct{}
	admitted   map[*agent.Conn]bool // connections whose replay has begun
	replaying  map[*agent.Conn]*[]pendingFrame
	// replayed holds, per connection, the last sequence its replay sent of
	// runs that were in flight: a forwarder that catches up later sends
	// those frames again, and the connection must not get them twice.
	replayed map[*agent.Conn]map[string]int64
	hasRuns  int                  // -1 unknown, 0 none, 1 some
	child    map[string]*childRun // child: runs executing here
	// finishing counts, per run, the finish calls between their terminal
	// write and its broadcast.
	finishing map[string]int
	// delivering holds the ends of awaited runs being delivered to
	// OnAgentToolFinish now (deliverFinish).
	delivering map[deliveryID]bool
	// undelivered holds the awaited runs whose end StartLayer found
	// recorded but not delivered, for LayerStarted to deliver.
	undelivered []runRow
	// marks are delivery marks waiting for a transaction (queueMark);
	// markArmed: a flush of them is scheduled.
	marks     []pendingMark
	markArmed bool
	stale     []runRow // parent: runs in flight when hydrated
	// startDetached holds the undelivered detached runs that StartLayer
	// read (startListed), for LayerStarted to resume unless a run was
	// recorded in between (hasRuns is then 1, no longer -1).
	startDetached []runRow
	startListed   bool
	// fresh: this hydration created the instance, so its tables hold only
	// the runs it recorded itself (its child map knows each of them).
	fresh     bool
	unstarted map[string]chan struct{} // parent: recovered runs whose child never started
	watchers  map[string][]*watcher    // parent: WatchRun subscriptions by run id
	queued    map[string]*queuedRun    // parent: detached runs waiting for a slot here
}

var (
	_ agent.Layer          = (*host)(nil)
	_ agent.LayerConnector = (*host)(nil)
	_ agent.LayerGate      = (*host)(nil)
	_ agent.LayerCloser    = (*host)(nil)
)

type pendingFrame struct {
	runID string
	seq   int64
	frame []byte
}

func hostOf(a agent.Agent) (*host, error) {
	h, ok := agent.LayerOf[*host](a)
	if !ok {
		return nil, ErrNotInstalled
	}
	return h, nil
}

// StartLayer prepares the tables and resumes this instance's child runs.
func (h *host) StartLayer(ctx context.Context, self agent.Agent) error {
	if err := h.rt.Migrate(ctx, "agenttool", migrations); err != nil {
		return err
	}
	// A run's terminal write and a connect replay read the children's
	// streams, whose instances may not have hydrated in this process.
	if err := chat.Migrate(ctx, h.rt); err != nil {
		return err
	}
	h.iid = h.b.InstanceID()
	h.live = map[string]*liveRun{}
	h.recovering = map[string]chan struct{}{}
	h.replaying = map[*agent.Conn]*[]pendingFrame{}
	h.admitted = map[*agent.Conn]bool{}
	h.unstarted = map[string]chan struct{}{}
	h.replayed = map[*agent.Conn]map[string]int64{}
	h.child = map[string]*childRun{}
	h.finishing = map[string]int{}
	h.delivering = map[deliveryID]bool{}
	h.hasRuns = -1
	if h.b.Created() {
		// A new instance has no runs to recover or resume.
		h.fresh = true
		return nil
	}
	// One read for what the start needs: as a parent, the runs in flight
	// before the agent's own OnStart (the ones to recover; runs OnStart
	// dispatches are left alone) and the detached runs whose end is not
	// delivered; as a child, the runs it was executing.
	var stale, detached, undelivered []runRow
	var executing []childRunRef
	_, observed := h.a.(FinishObserver)
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		// One statement: the awaited runs in flight, and those whose end
		// is not delivered (in flight, a run's is not delivered either).
		awaited, err := h.queryRuns(ctx, tx, `AND detached = 0 AND (status IN ('starting', 'running') OR finish_delivered_at IS NULL)`)
		if err != nil {
			return fmt.Errorf("list runs to recover: %w", err)
		}
		for _, r := range awaited {
			if r.Status.Active() {
				stale = append(stale, r)
			} else {
				undelivered = append(undelivered, r)
			}
		}
		if detached, err = h.queryRuns(ctx, tx, undeliveredDetached); err != nil {
			return fmt.Errorf("list detached runs: %w", err)
		}
		if executing, err = h.queryChildRuns(ctx, tx); err != nil {
			return fmt.Errorf("resume child runs: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("agenttool: %w", err)
	}
	h.stale = stale
	if !observed && len(undelivered) > 0 {
		// Ends recorded for a hook the class no longer has: delivered,
		// to no one (their wake reasons go with them).
		if err := h.markDelivered(ctx, undelivered); err != nil {
			h.b.Logger().Warn("agenttool: start", "err", err) // again at the next start
		}
		undelivered = nil
	}
	h.undelivered = undelivered
	h.startDetached, h.startListed = detached, true
	return h.resumeChildRuns(ctx, executing)
}

// LayerClose forgets a connection that closed during its replay.
func (h *host) LayerClose(ctx context.Context, conn *agent.Conn) {
	h.mu.Lock()
	delete(h.replaying, conn)
	delete(h.admitted, conn)
	delete(h.replayed, conn)
	h.mu.Unlock()
}

// broadcast sends an event frame to every connection; connections still
// receiving their connect replay get it after the replay, in order.
func (h *host) broadcast(parentToolCallID string, seq int64, ev Event) {
	frame, err := encodeFrame(Frame{Type: wire.AgentToolEvent, ParentToolCallID: parentToolCallID, Sequence: seq, Event: ev})
	if err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.watchers) > 0 {
		h.notifyWatchers(ev)
	}
	for c := range h.admitted {
		if buf, ok := h.replaying[c]; ok {
			*buf = append(*buf, pendingFrame{runID: ev.RunID, seq: seq, frame: frame})
			continue
		}
		if marks := h.replayed[c]; marks != nil {
			if hw, ok := marks[ev.RunID]; ok {
				if seq <= hw {
					if seq == hw {
						delete(marks, ev.RunID) // caught up
					}
					continue // the replay sent it already
				}
				delete(marks, ev.RunID) // the forwarder has caught up
			}
		}
		c.SendRaw(frame)
	}
}

func (h *host) publish(ctx context.Context, typ string, attrs map[string]any) {
	h.rt.Diag().Publish(ctx, diag.ChannelAgentTool, typ, h.b.Path().String(), attrs)
}

// LayerGate enforces the default drill-in rule: a child created by an agent
// tool is reachable through this parent only while the registry holds its
// run, and a guessed run id of an agent-tool class creates nothing.
func (h *host) LayerGate(ctx context.Context, r *http.Request, class, name string) error {
	if h.opts.OpenDrillIn {
		return nil
	}
	notFound := &agent.HTTPError{Status: http.StatusNotFound, Message: "not found"}
	has, err := h.hasRun(ctx, class, name)
	if err != nil {
		return err
	}
	if has {
		return nil
	}
	if strings.HasPrefix(name, "agent-tool:") {
		return notFound
	}
	var usedClass, childRows int
	err = h.rt.DB().View(ctx, func(tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM agent_tool_classes WHERE instance_id = ? AND agent_type = ?`, h.iid, class).Scan(&usedClass); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM agent_tool_child_runs c JOIN instances i ON i.id = c.instance_id WHERE i.path = ?`,
			h.b.Path().Child(class, name).String()).Scan(&childRows)
	})
	if err != nil {
		return fmt.Errorf("agenttool: gate: %w", err)
	}
	if usedClass > 0 || childRows > 0 {
		return notFound
	}
	return nil
}

func (h *host) hasRun(ctx context.Context, class, runID string) (bool, error) {
	var n int
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM agent_tool_runs WHERE instance_id = ? AND run_id = ? AND agent_type = ?`, h.iid, runID, class).Scan(&n)
	})
	if err != nil {
		return false, fmt.Errorf("agenttool: look up run: %w", err)
	}
	return n > 0, nil
}

// HasAgentToolRun reports whether parent's registry holds run runID of
// class (any status). Drill-in gates use it.
func HasAgentToolRun[C agent.ClassName](ctx context.Context, parent agent.Agent, class C, runID string) (bool, error) {
	h, err := hostOf(parent)
	if err != nil {
		return false, err
	}
	return h.hasRun(ctx, string(class), runID)
}

var errNoChat = errors.New("agenttool: the child class is not a chat agent (embed chat.Base)")
