package agenttool

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/store"
)

// Runs across nodes. In a cluster (agent.Options.Placement) a parent's
// children are placed by their own path, so a child is often owned by
// another node. The parent then reaches it through Options.Remote: the
// child's owner starts and cancels the run (StartRemoteChild and
// CancelRemoteChild, called by the cluster's node-to-node calls), and the
// parent follows the run in the shared database: the child's record of
// the run and its turn's committed chunks, read every RemotePoll. The
// database is the source of truth; a wake-up hint only shortens the wait.

// Remote reaches the owner of a child on another node of a cluster.
type Remote interface {
	// StartChild asks the child's owner to start the run (idempotently:
	// a run the child knows is not started again) and returns the id of
	// the child's turn.
	StartChild(ctx context.Context, req RemoteStart) (streamID string, err error)
	// CancelChild asks the child's owner to abort the run.
	CancelChild(ctx context.Context, req RemoteCancel) error
	// DestroyChild asks the child's owner to destroy the child: its rows,
	// its descendants' rows, and the instance in the owner's memory.
	DestroyChild(ctx context.Context, child agent.Path) error
	// AnswerChild gives the child's owner the answer to a call its run
	// waits for (AnswerRemoteChild there). A refusal wraps
	// ErrRunNotWaiting (no such run in flight in the child) or
	// chat.ErrNotWaiting (the call does not wait for this answer).
	AnswerChild(ctx context.Context, req RemoteAnswer) error
}

// Hints wake a parent that follows a run whose child is on another node
// (PostgreSQL's LISTEN/NOTIFY in a cluster). A hint is never the source of
// truth: the follower reads the child's record and stream from the
// database when woken, and still polls, only less often. A Remote that
// also implements Hints provides them.
type Hints interface {
	// Hint tells the nodes that the child's record of a run or its
	// stream changed (committed). Best effort, never blocking: a lost
	// hint delays a follower until its next poll.
	Hint(child agent.Path)
	// Watch returns a channel that receives a value after a Hint for
	// child on any node, and a function that ends the watch. A nil
	// channel means no hints now (the follower polls at RemotePoll).
	Watch(child agent.Path) (<-chan struct{}, func())
}

// RemoteStart is a run to start in a child on another node.
type RemoteStart struct {
	ParentPath agent.Path      `json:"parentPath"`
	Class      string          `json:"class"`
	RunID      string          `json:"runId"`
	Input      json.RawMessage `json:"input,omitempty"`
}

// Child returns the path of the child.
func (r RemoteStart) Child() agent.Path { return r.ParentPath.Child(r.Class, r.RunID) }

// RemoteCancel is a run to abort in a child on another node.
type RemoteCancel struct {
	Child  agent.Path `json:"child"`
	RunID  string     `json:"runId"`
	Reason string     `json:"reason"`
}

// The kinds of RemoteAnswer.
const (
	// AnswerApproval answers an approval request (Approved, Reason).
	AnswerApproval = "approval"
	// AnswerOutput answers a client-side tool's call with its output
	// (Output, or ErrorText when it failed).
	AnswerOutput = "output"
)

// maxAnswerOutput bounds the output of a client-side tool's call that a
// parent gives to a child on another node.
const maxAnswerOutput = 4 << 20

// RemoteAnswer is the answer to a call that a run of a child on another
// node waits for: an approval, or a client-side tool's output.
type RemoteAnswer struct {
	Child      agent.Path      `json:"child"`
	RunID      string          `json:"runId"`
	ToolCallID string          `json:"toolCallId"`
	Kind       string          `json:"kind"`
	Approved   bool            `json:"approved,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	Output     json.RawMessage `json:"output,omitempty"`
	ErrorText  string          `json:"errorText,omitempty"`
}

// ErrBadRemoteCall is the error of a node-to-node call whose request is
// malformed.
var ErrBadRemoteCall = errors.New("agenttool: bad remote call")

// DefaultRemotePoll is how often a parent reads the progress of a run whose
// child is on another node.
const DefaultRemotePoll = 100 * time.Millisecond

// hintedPollFactor lengthens the poll of a follower that receives hints:
// the poll is then only the fallback for a lost hint.
const hintedPollFactor = 10

// StartRemoteChild starts, on this node (the child's owner), the run a
// parent on another node dispatched, and returns the child's turn id. It
// answers only with a run whose record and turn are committed, and only
// while this node owns the child: a node that lost the child's shard (one
// paused past its lease answers the calls queued meanwhile) refuses with
// agent.ErrNotOwner, whatever its start did, and the caller asks the new
// owner, whose start of the same run id is idempotent.
func StartRemoteChild(ctx context.Context, rt *agent.Runtime, req RemoteStart) (string, error) {
	if len(req.ParentPath) == 0 || req.RunID == "" || !rt.HasClass(req.Class) {
		return "", fmt.Errorf("%w: start needs a parent path, a run id and a known class", ErrBadRemoteCall)
	}
	path := req.Child()
	notOwner := func(err error) error {
		if err != nil {
			return fmt.Errorf("agenttool: start %s: %w (%w)", path, agent.ErrNotOwner, err)
		}
		return fmt.Errorf("agenttool: start %s: %w", path, agent.ErrNotOwner)
	}
	if !rt.Owns(path) {
		// An instance still in memory here is not ours to answer for.
		return "", notOwner(nil)
	}
	id, err := startRemoteChild(ctx, rt, req)
	if !rt.Owns(path) {
		// The lease ended during the start (a hydration or a submission
		// cut by the pause, or one that committed): it is the new
		// owner's to answer for.
		return "", notOwner(err)
	}
	return id, err
}

// startRemoteChild is StartRemoteChild past its ownership checks.
func startRemoteChild(ctx context.Context, rt *agent.Runtime, req RemoteStart) (string, error) {
	child, release, err := rt.Acquire(ctx, req.Child())
	if err != nil {
		return "", err
	}
	defer release()
	ch, err := hostOf(child)
	if err != nil {
		return "", err
	}
	cr, _, err := ch.startChildRun(ctx, req.RunID, req.Input, ChildRequest{RunID: req.RunID, AgentType: req.Class, ParentPath: req.ParentPath}, childStart{})
	if err != nil {
		return "", err
	}
	ch.mu.Lock()
	id := cr.streamID
	ch.mu.Unlock()
	return id, nil
}

// CancelRemoteChild aborts, on this node (the child's owner), a run whose
// parent is on another node.
func CancelRemoteChild(ctx context.Context, rt *agent.Runtime, req RemoteCancel) error {
	if len(req.Child) < 2 || req.RunID == "" {
		return fmt.Errorf("%w: cancel needs a child path and a run id", ErrBadRemoteCall)
	}
	child, release, err := rt.Acquire(ctx, req.Child)
	if err != nil {
		return err
	}
	defer release()
	ch, err := hostOf(child)
	if err != nil {
		return err
	}
	return ch.cancelChildRun(ctx, req.RunID, req.Reason)
}

// AnswerRemoteChild gives, on this node (the child's owner), the answer a
// parent on another node received for a call the child's run waits for;
// the run goes on with its continuation turn. Only a run the child has a
// record of, unfinished, is answered (ErrRunNotWaiting otherwise: a
// guessed or finished run id wakes no instance), and only while this node
// owns the child (agent.ErrNotOwner otherwise, and the caller asks the
// new owner; an answer whose write was fenced did not land).
func AnswerRemoteChild(ctx context.Context, rt *agent.Runtime, req RemoteAnswer) error {
	if len(req.Child) < 2 || req.RunID == "" || req.Child[len(req.Child)-1].Name != req.RunID || req.ToolCallID == "" ||
		(req.Kind != AnswerApproval && req.Kind != AnswerOutput) {
		return fmt.Errorf("%w: answer needs a child path named by its run id, a tool call id and a kind (approval or output)", ErrBadRemoteCall)
	}
	if len(req.Output) > maxAnswerOutput {
		return fmt.Errorf("%w: answer output over %d bytes", ErrBadRemoteCall, maxAnswerOutput)
	}
	if !rt.Owns(req.Child) {
		return fmt.Errorf("agenttool: answer %s: %w", req.Child, agent.ErrNotOwner)
	}
	var open int
	err := rt.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM agent_tool_child_runs r JOIN instances i ON i.id = r.instance_id
			WHERE i.path = ? AND r.run_id = ? AND r.completed_at IS NULL`, req.Child.String(), req.RunID).Scan(&open)
	})
	if err != nil {
		return fmt.Errorf("agenttool: answer %s: %w", req.Child, err)
	}
	if open == 0 {
		return fmt.Errorf("%w: %s has no run %s in flight", ErrRunNotWaiting, req.Child, req.RunID)
	}
	err = answerChild(ctx, rt, req)
	if err != nil && !rt.Owns(req.Child) {
		return fmt.Errorf("agenttool: answer %s: %w (%w)", req.Child, agent.ErrNotOwner, err)
	}
	return err
}

// answerChild is AnswerRemoteChild past its checks.
func answerChild(ctx context.Context, rt *agent.Runtime, req RemoteAnswer) error {
	child, release, err := rt.Acquire(ctx, req.Child)
	if err != nil {
		return fmt.Errorf("agenttool: child %s: %w", req.Child, err)
	}
	defer release()
	cb, ok := chatOf(child)
	if !ok {
		return errNoChat
	}
	return req.apply(ctx, cb)
}

// DestroyRemoteChild destroys, on this node (the child's owner), a child
// whose parent on another node clears its run: the child's rows and its
// descendants' go, and the instance leaves this node's memory.
func DestroyRemoteChild(ctx context.Context, rt *agent.Runtime, child agent.Path) error {
	if len(child) < 2 {
		return fmt.Errorf("%w: destroy needs a child path", ErrBadRemoteCall)
	}
	if !rt.Owns(child) {
		return fmt.Errorf("agenttool: destroy %s: %w", child, agent.ErrNotOwner)
	}
	return rt.Destroy(ctx, child)
}

// hints returns the wake-up between nodes, if the cluster has one.
func (h *host) hints() Hints {
	hs, _ := h.opts.Remote.(Hints)
	return hs
}

// hintParent tells the parent's node, when it is another one, that this
// child's run changed. A no-op on a single node.
func (h *host) hintParent() {
	hs := h.hints()
	if hs == nil || h.rt.Placement() == nil {
		return
	}
	if p := h.b.Path().Parent(); p != nil && !h.rt.Owns(p) {
		hs.Hint(h.b.Path())
	}
}

// remoteWake is a follower's wake-up: the hint channel (nil without
// hints) and the poll's ticker, slower when hints come.
type remoteWake struct {
	hint <-chan struct{}
	tick clockwork.Ticker
	stop func()
}

func (h *host) remoteWake(child agent.Path) *remoteWake {
	w := &remoteWake{stop: func() {}}
	if hs := h.hints(); hs != nil {
		w.hint, w.stop = hs.Watch(child)
	}
	poll := h.opts.RemotePoll
	if poll <= 0 {
		poll = DefaultRemotePoll
	}
	if w.hint != nil {
		poll *= hintedPollFactor
	}
	w.tick = h.rt.Clock().NewTicker(poll)
	return w
}

func (w *remoteWake) close() {
	w.tick.Stop()
	w.stop()
}

// remoteChild is a child on another node, as a parent's reconcile and
// cancel reach it: through its owner for changes, through the database for
// reads.
type remoteChild struct {
	h    *host
	path agent.Path
	r    Remote
}

func (c remoteChild) cancelChildRun(ctx context.Context, runID, reason string) error {
	return c.r.CancelChild(ctx, RemoteCancel{Child: c.path, RunID: runID, Reason: reason})
}

func (c remoteChild) streamNext(ctx context.Context, runID string) int {
	in, err := c.h.remoteInspection(ctx, c.path, runID)
	if err != nil || in == nil || in.RequestID == "" {
		return 0
	}
	chunks, err := chat.StoredChunks(ctx, c.h.rt.DB(), c.path, in.RequestID, -1)
	if err != nil || len(chunks) == 0 {
		return 0
	}
	return chunks[len(chunks)-1].Seq + 1
}

func (c remoteChild) milestones(ctx context.Context, runID string) ([]Milestone, error) {
	var out []Milestone
	err := c.h.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		out, err = queryMilestonesOf(ctx, tx, `(SELECT id FROM instances WHERE path = ?)`, c.path.String(), runID)
		return err
	})
	return out, err
}

// awaitEnd waits, an await point of the parent, until the child's record
// of the run has an end, or until limit has passed.
func (c remoteChild) awaitEnd(ctx context.Context, runID string, limit time.Duration) error {
	h := c.h
	w := h.remoteWake(c.path)
	defer w.close()
	t := h.rt.Clock().NewTimer(limit)
	defer t.Stop()
	return agent.Await(ctx, func() error {
		for {
			if in, err := h.remoteInspection(ctx, c.path, runID); err == nil && (in == nil || in.CompletedAt != nil) {
				return nil
			}
			select {
			case <-w.hint:
			case <-w.tick.Chan():
			case <-t.Chan():
				h.b.Logger().Warn("agenttool: a canceled remote child run has not ended", "run", runID, "waited", limit)
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
}

// remote returns the way to a child on another node, or nil when the
// child is served here (or there is no cluster).
func (h *host) remote(child agent.Path) Remote {
	if h.opts.Remote == nil || h.rt.Placement() == nil || h.rt.Owns(child) {
		return nil
	}
	return h.opts.Remote
}

// remoteInspection reads a child's record of a run from the database; nil
// when the child has none.
func (h *host) remoteInspection(ctx context.Context, child agent.Path, runID string) (*Inspection, error) {
	var in *Inspection
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		in, err = scanInspection(tx.QueryRow(ctx, `SELECT `+inspectionCols+`
			FROM agent_tool_child_runs r JOIN instances i ON i.id = r.instance_id WHERE i.path = ? AND r.run_id = ?`, child.String(), runID))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("agenttool: inspect remote child run: %w", err)
	}
	return in, nil
}

// runRemote dispatches a recorded run to a child on another node and, for
// an awaited run, follows it to its end. s is the run's slot of its
// parent's bound on runs executing at once: the parent holds it while it
// follows the child (a detached run's follower holds it).
func (h *host) runRemote(ctx, awaitCtx context.Context, row runRow, input json.RawMessage, r Remote, s *runSlot) (Result, error) {
	held := s
	defer func() { held.release() }()
	child := h.b.Path().Child(row.AgentType, row.RunID)
	streamID, err := r.StartChild(ctx, RemoteStart{ParentPath: h.b.Path(), Class: row.AgentType, RunID: row.RunID, Input: input})
	if err != nil {
		if !row.det.Detached && h.unreached(err) {
			return Result{}, fmt.Errorf("agenttool: start child of %s: %w", row.RunID, err)
		}
		return h.dispatchFailed(ctx, row, h.runError(row.RunID, fmt.Errorf("start child: %w", err)))
	}
	if err := h.markRunning(ctx, row.RunID); err != nil {
		if h.rt.Context().Err() != nil {
			return Result{}, agent.ErrClosed
		}
		return Result{}, fmt.Errorf("agenttool: mark running: %w", err)
	}
	row.Status = StatusRunning
	if row.det.Detached {
		if err := h.armReconcile(ctx, true); err != nil {
			h.b.Logger().Error("agenttool: arm reconcile", "err", err)
		}
		held = nil
		h.followHeld(row, s)
		return Result{RunID: row.RunID, AgentType: row.AgentType, Status: StatusRunning}, nil
	}
	return h.awaitRemote(awaitCtx, row, child, streamID, input, r)
}

// unreached reports whether a start of an awaited run's child on another
// node failed without an answer of the child's owner: none could be
// reached in time (a database outage, a shard changing hands: the node
// call gave up), or the runtime is closing. Such a run is not ended: it
// stays recorded as starting, its dispatch fails with the error, and a
// dispatch of the same run id starts it (starting is idempotent), as
// after a crash between recording the run and starting its child; the
// parent's recovery waits for that dispatch. Ending it with the error
// made an outage's refusal the run's final result (TestPostgresRestart-
// DuringFanOut: a run ended "timed out", and every repeated request got
// that stored error).
func (h *host) unreached(err error) bool {
	return h.rt.Context().Err() != nil || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, store.ErrUnavailable) || errors.Is(err, agent.ErrNotOwner)
}

// followRemote is follow for a child on another node.
func (h *host) followRemote(ctx context.Context, row runRow, r Remote) {
	child := h.b.Path().Child(row.AgentType, row.RunID)
	insp, err := h.remoteInspection(ctx, child, row.RunID)
	if err != nil || insp == nil || insp.RequestID == "" {
		return // the reconcile keeps watching
	}
	if _, err := h.awaitRemote(ctx, row, child, insp.RequestID, nil, r); err != nil && ctx.Err() == nil {
		h.b.Logger().Error("agenttool: detached run", "run", row.RunID, "err", err)
	}
}

// reconcileRemote is reconcileRun for a child on another node: the
// child's record is read from the database, and a give-up cancels the run
// through the child's owner.
func (h *host) reconcileRemote(ctx context.Context, row runRow, r Remote) {
	log := h.b.Logger()
	rc := remoteChild{h: h, path: h.b.Path().Child(row.AgentType, row.RunID), r: r}
	insp, err := h.remoteInspection(ctx, rc.path, row.RunID)
	if err != nil {
		log.Warn("agenttool: reconcile inspect", "run", row.RunID, "err", err)
		return
	}
	h.deliverMilestoneNotices(ctx, row, rc)
	if insp != nil && insp.CompletedAt != nil {
		if row.Status == StatusInterrupted && insp.Status == StatusAborted && h.gaveUp(ctx, row.RunID) {
			// Our own teardown: the give-up was the delivery.
			if err := h.markFinishDelivered(ctx, row.RunID); err != nil {
				log.Warn("agenttool: mark delivered", "run", row.RunID, "err", err)
			}
			return
		}
		if _, err := h.finish(ctx, row, resultFromInspection(*insp), rc.streamNext(ctx, row.RunID)); err != nil {
			log.Warn("agenttool: reconcile finish", "run", row.RunID, "err", err)
		}
		return
	}
	if row.Status != StatusInterrupted {
		now := h.rt.Clock().Now()
		if row.det.MaxBudgetAt != nil && !now.Before(*row.det.MaxBudgetAt) {
			h.giveUp(ctx, row, rc, ReasonBudgetExceeded)
			return
		}
		// A run that waits for input (the child's record says so) is
		// waiting, not silent; its silence counts from its last signal
		// (the answer is one).
		if row.det.NoProgressBudget > 0 && insp != nil && len(insp.Waiting) == 0 && insp.LastSignalAt != nil &&
			now.Sub(*insp.LastSignalAt) >= row.det.NoProgressBudget {
			h.giveUp(ctx, row, rc, ReasonNoProgress)
			return
		}
	}
	if insp != nil && insp.RequestID != "" {
		h.follow(row)
	}
}

// redispatchRemote is redispatch of an awaited run in flight whose child is
// on another node: the child starts it if it does not know it yet (starting
// is idempotent), and the run is followed to its end.
func (h *host) redispatchRemote(ctx context.Context, row runRow, input json.RawMessage, r Remote) (Result, error) {
	child := h.b.Path().Child(row.AgentType, row.RunID)
	insp, err := h.remoteInspection(ctx, child, row.RunID)
	if err != nil {
		return Result{}, err
	}
	streamID := ""
	if insp != nil {
		streamID = insp.RequestID
	}
	if streamID == "" {
		// Not started (a crash before, or it was waiting for its slot):
		// it starts once it has a slot, held while it is followed.
		s, err := h.awaitSlot(ctx, row)
		if err != nil {
			if h.rt.Context().Err() != nil {
				return Result{}, agent.ErrClosed
			}
			return h.finish(context.WithoutCancel(ctx), row, Result{Status: StatusAborted, Error: causeText(ctx)}, 0)
		}
		defer s.release()
		streamID, err = r.StartChild(ctx, RemoteStart{ParentPath: h.b.Path(), Class: row.AgentType, RunID: row.RunID, Input: input})
		if err != nil {
			if h.unreached(err) {
				return Result{}, fmt.Errorf("agenttool: start child of %s: %w", row.RunID, err)
			}
			return h.finish(ctx, row, Result{Status: StatusError, Error: h.runError(row.RunID, err)}, 0)
		}
		if err := h.redispatched(ctx, row.RunID); err != nil {
			return Result{}, err
		}
	}
	h.publish(ctx, "recovery:reattach", map[string]any{"runId": row.RunID, "agentType": row.AgentType})
	return h.awaitRemote(ctx, row, child, streamID, input, r)
}

// forwardStoredRemote is forwardStored for a child on another node: it
// reads the child's committed chunks from the database.
func (h *host) forwardStoredRemote(ctx context.Context, row runRow, streamID string) int {
	if streamID == "" {
		return 0
	}
	chunks, err := chat.StoredChunks(ctx, h.rt.DB(), h.b.Path().Child(row.AgentType, row.RunID), streamID, -1)
	if err != nil {
		return 0
	}
	return h.forwardStored(ctx, row, chunks)
}
