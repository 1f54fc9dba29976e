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

// DefaultRemotePoll is how often a parent reads the progress of a run whose
// child is on another node.
const DefaultRemotePoll = 100 * time.Millisecond

// StartRemoteChild starts, on this node (the child's owner), the run a
// parent on another node dispatched, and returns the child's turn id.
func StartRemoteChild(ctx context.Context, rt *agent.Runtime, req RemoteStart) (string, error) {
	if len(req.ParentPath) == 0 || req.RunID == "" || !rt.HasClass(req.Class) {
		return "", errors.New("agenttool: bad remote start")
	}
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
// an awaited run, follows it to its end.
func (h *host) runRemote(ctx, awaitCtx context.Context, row runRow, input json.RawMessage, r Remote) (Result, error) {
	child := h.b.Path().Child(row.AgentType, row.RunID)
	streamID, err := r.StartChild(ctx, RemoteStart{ParentPath: h.b.Path(), Class: row.AgentType, RunID: row.RunID, Input: input})
	if err != nil {
		return h.dispatchFailed(ctx, row, h.runError(row.RunID, fmt.Errorf("start child: %w", err)))
	}
	if err := h.markRunning(ctx, row.RunID); err != nil {
		if h.rt.Context().Err() != nil {
			return Result{}, agent.ErrClosed
		}
		return Result{}, fmt.Errorf("agenttool: mark running: %w", err)
	}
	row.Status = StatusRunning
	return h.awaitRemote(awaitCtx, row, child, streamID, r)
}

// awaitRemote follows a run whose child is on another node: it forwards
// the child's committed chunks to the parent's clients and records the
// run's end once the child's record of it has one. A cancel of the run
// (its context) asks the child's owner to abort it.
func (h *host) awaitRemote(ctx context.Context, row runRow, child agent.Path, streamID string, r Remote) (Result, error) {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lr := &liveRun{cancel: cancel, done: make(chan struct{})}
	h.mu.Lock()
	if other, ok := h.live[row.RunID]; ok && other != ctx.Value(preKey{}) {
		h.mu.Unlock()
		return h.waitLive(ctx, other, row.RunID)
	}
	h.live[row.RunID] = lr
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.live, row.RunID)
		h.mu.Unlock()
		close(lr.done)
	}()
	bg := context.WithoutCancel(ctx)
	after := -1
	if n := len(row.marks); n > 0 {
		after = row.marks[n-1] - 1
	}
	forward := func() {
		chunks, err := chat.StoredChunks(bg, h.rt.DB(), child, streamID, after)
		if err != nil {
			return
		}
		for _, c := range chunks {
			h.current().broadcast(row.ParentToolCallID, eventSeq(c.Seq, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: c.Body})
			after = c.Seq
		}
	}
	poll := h.opts.RemotePoll
	if poll <= 0 {
		poll = DefaultRemotePoll
	}
	tick := h.rt.Clock().NewTicker(poll)
	defer tick.Stop()
	var insp *Inspection
	canceled := false
	err := agent.Await(ctx, func() error {
		for {
			forward()
			in, err := h.remoteInspection(bg, child, row.RunID)
			if err == nil && in != nil && in.CompletedAt != nil {
				insp = in
				forward() // the chunks committed with the end
				return nil
			}
			select {
			case <-h.rt.Context().Done():
				return agent.ErrClosed
			case <-runCtx.Done():
				if !canceled {
					canceled = true
					if err := r.CancelChild(bg, RemoteCancel{Child: child, RunID: row.RunID, Reason: causeText(runCtx)}); err != nil {
						h.b.Logger().Error("agenttool: cancel remote child", "run", row.RunID, "err", err)
					}
				}
				select {
				case <-tick.Chan():
				case <-h.rt.Context().Done():
					return agent.ErrClosed
				}
			case <-tick.Chan():
			}
		}
	})
	if err != nil {
		return Result{}, err // shutting down: the run resumes with the process
	}
	res := resultFromInspection(*insp)
	if runCtx.Err() != nil && res.Status != StatusCompleted {
		res = Result{Status: StatusAborted, Error: causeText(runCtx)}
	}
	return h.finish(bg, row, res, after+1)
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
		streamID, err = r.StartChild(ctx, RemoteStart{ParentPath: h.b.Path(), Class: row.AgentType, RunID: row.RunID, Input: input})
		if err != nil {
			return h.finish(ctx, row, Result{Status: StatusError, Error: h.runError(row.RunID, err)}, 0)
		}
		if err := h.markRunning(ctx, row.RunID); err != nil {
			return Result{}, fmt.Errorf("agenttool: mark running: %w", err)
		}
		h.mu.Lock()
		if ch, ok := h.unstarted[row.RunID]; ok {
			close(ch) // a recovery waiting for this re-dispatch stops waiting
			delete(h.unstarted, row.RunID)
		}
		h.mu.Unlock()
	}
	h.publish(ctx, "recovery:reattach", map[string]any{"runId": row.RunID, "agentType": row.AgentType})
	return h.awaitRemote(ctx, row, child, streamID, r)
}

// forwardStoredRemote is forwardStored for a child on another node: it
// reads the child's committed chunks from the database.
func (h *host) forwardStoredRemote(ctx context.Context, row runRow, streamID string) int {
	if streamID == "" {
		return 0
	}
	chunks, err := chat.StoredChunks(ctx, h.rt.DB(), h.b.Path().Child(row.AgentType, row.RunID), streamID, -1)
	if err != nil || len(chunks) == 0 {
		return 0
	}
	after := -1
	if n := len(row.marks); n > 0 {
		after = row.marks[n-1] - 1
	}
	for _, c := range chunks {
		if c.Seq > after {
			h.broadcast(row.ParentToolCallID, eventSeq(c.Seq, row.marks), Event{Kind: "chunk", RunID: row.RunID, Body: c.Body})
		}
	}
	return chunks[len(chunks)-1].Seq + 1
}
