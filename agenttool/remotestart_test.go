package agenttool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/teststore"
	"github.com/agentry/agentry/store"
)

// pausingPlacement is one node's placement in a test of a child's start
// that runs while the node loses the child (a node paused past its lease):
// once armed, the next fence of the child (the start's submission) waits
// until resume, and owns tells whether the node owns its instances then.
type pausingPlacement struct {
	child   agent.Path
	owns    atomic.Bool
	armed   atomic.Bool
	held    chan struct{} // closed when the armed fence waits
	release chan struct{} // closed by resume
}

func newPausingPlacement(child agent.Path) *pausingPlacement {
	p := &pausingPlacement{child: child, held: make(chan struct{}), release: make(chan struct{})}
	p.owns.Store(true)
	return p
}

func (p *pausingPlacement) Owns(agent.Path) bool { return p.owns.Load() }

// Epoch is the one lease epoch of this test's node, while it owns.
func (p *pausingPlacement) Epoch(agent.Path) (int64, bool) { return 1, p.owns.Load() }

func (p *pausingPlacement) Fence(ctx context.Context, tx store.Tx, path agent.Path, _ int64) error {
	if path.String() == p.child.String() && p.armed.CompareAndSwap(true, false) {
		close(p.held)
		select {
		case <-p.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if !p.owns.Load() {
		return fmt.Errorf("test fence %s: %w", path, agent.ErrNotOwner)
	}
	return nil
}

// resume ends the pause; owned tells whether the node still owns the
// child (its lease outlived the pause).
func (p *pausingPlacement) resume(owned bool) {
	p.owns.Store(owned)
	close(p.release)
}

// startRemoteRig is a runtime on one node of a pretend cluster, the child
// a parent on another node asks it to start, and the diag events of its
// agent tools.
type startRemoteRig struct {
	rt     *agent.Runtime
	db     store.DB
	place  *pausingPlacement
	req    agenttool.RemoteStart
	events *events
}

func newStartRemoteRig(t *testing.T) *startRemoteRig {
	t.Helper()
	k := newKit()
	req := agenttool.RemoteStart{ParentPath: agent.Root("Assistant", "p"), Class: "Researcher", RunID: "run-1",
		Input: json.RawMessage(`{"query":"q"}`)}
	place := newPausingPlacement(req.Child())
	db := teststore.Open(t, &pg, t.TempDir())
	ctx := context.Background()
	rt := newPlacedRuntime(t, db, place, k, agenttool.Options{})
	ev := &events{changed: make(chan struct{})}
	unsub := rt.Diag().Subscribe(diag.ChannelAgentTool, ev.add)
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unsub()
		rt.Close()
		db.Close()
	})
	// The child is in memory (its instance row written) before the pause,
	// as on a node that hydrated it for a first start.
	if _, err := rt.Get(testCtx(t), req.Child()); err != nil {
		t.Fatal(err)
	}
	return &startRemoteRig{rt: rt, db: db, place: place, req: req, events: ev}
}

type startAnswer struct {
	id  string
	err error
}

func (r *startRemoteRig) start(ctx context.Context) <-chan startAnswer {
	ch := make(chan startAnswer, 1)
	go func() {
		id, err := agenttool.StartRemoteChild(ctx, r.rt, r.req)
		ch <- startAnswer{id, err}
	}()
	return ch
}

// record returns the child's stored turn id of the run, "" when the child
// has no record of it.
func (r *startRemoteRig) record(t *testing.T) string {
	t.Helper()
	var id string
	err := r.db.View(testCtx(t), func(tx store.Tx) error {
		return tx.QueryRow(testCtx(t), `SELECT COALESCE(MAX(c.request_id), '') FROM agent_tool_child_runs c
			JOIN instances i ON i.id = c.instance_id WHERE i.path = ? AND c.run_id = ?`, r.req.Child().String(), r.req.RunID).Scan(&id)
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// pausedStart starts the run, pauses its submission in the fence, and
// asks for the same run again (the caller's retry, queued on the paused
// node). It returns both answers' channels once the second waits for the
// first's submission, failing the test if the second answers first.
func (r *startRemoteRig) pausedStart(t *testing.T, ctx context.Context) (first, second <-chan startAnswer) {
	t.Helper()
	r.place.armed.Store(true)
	first = r.start(ctx)
	select {
	case <-r.place.held:
	case a := <-first:
		t.Fatalf("the start ended before its submission: %+v", a)
	case <-ctx.Done():
		t.Fatal("timed out waiting for the start's submission")
	}
	second = r.start(ctx)
	waits := func(e diag.Event) bool { return e.Type == "child:start-wait" && e.Attrs["runId"] == r.req.RunID }
	for {
		r.events.mu.Lock()
		changed := r.events.changed
		r.events.mu.Unlock()
		if r.events.countWhere(waits) > 0 {
			break
		}
		select {
		case <-changed:
		case a := <-second:
			t.Fatalf("a start answered while the run's submission had not committed (stored turn %q): %+v", r.record(t), a)
		case <-ctx.Done():
			t.Fatal("timed out waiting for the second start to wait for the first")
		}
	}
	return first, second
}

// TestRemoteStartAnswersOnlyCommittedRuns is the regression test of a
// cluster hang: a node paused past its lease during a child's start
// answered a queued retry of the start with the turn id of the pending
// submission, which then failed (fenced), so the parent followed a run
// that was never stored. A start must answer only with a committed run,
// and a node that lost the child must refuse (agent.ErrNotOwner, which a
// peer call answers 421, so the parent asks the new owner).
func TestRemoteStartAnswersOnlyCommittedRuns(t *testing.T) {
	t.Run("LeaseLost", func(t *testing.T) {
		r := newStartRemoteRig(t)
		ctx := testCtx(t)
		first, second := r.pausedStart(t, ctx)
		r.place.resume(false)
		for i, ch := range []<-chan startAnswer{first, second} {
			a := <-ch
			if a.err == nil || !errors.Is(a.err, agent.ErrNotOwner) {
				t.Errorf("start %d after the lease was lost: %+v, want an agent.ErrNotOwner refusal", i+1, a)
			}
		}
		if id := r.record(t); id != "" {
			t.Errorf("the child has a record of the run (turn %s); the node had lost it", id)
		}
		// A node that lost the child refuses at once, though the child is
		// still in its memory.
		if a := <-r.start(ctx); !errors.Is(a.err, agent.ErrNotOwner) {
			t.Errorf("start on a node that lost the child: %+v, want agent.ErrNotOwner", a)
		}
	})
	t.Run("LeaseKept", func(t *testing.T) {
		r := newStartRemoteRig(t)
		ctx := testCtx(t)
		first, second := r.pausedStart(t, ctx)
		r.place.resume(true)
		a1, a2 := <-first, <-second
		if a1.err != nil || a2.err != nil || a1.id == "" || a1.id != a2.id {
			t.Fatalf("starts: %+v and %+v, want one turn id twice", a1, a2)
		}
		if id := r.record(t); id != a1.id {
			t.Errorf("the child's stored turn is %q, the starts answered %q", id, a1.id)
		}
	})
}

// splitPlacement is a node of a two-node pretend cluster on one database:
// it owns the sub-agents (children) or everything else (parents).
type splitPlacement struct{ children bool }

func (p splitPlacement) Owns(path agent.Path) bool { return (len(path) > 1) == p.children }

// Epoch is the one lease epoch of this test's nodes, for what they own.
func (p splitPlacement) Epoch(path agent.Path) (int64, bool) { return 1, p.Owns(path) }

func (p splitPlacement) Fence(ctx context.Context, tx store.Tx, path agent.Path, _ int64) error {
	if !p.Owns(path) {
		return fmt.Errorf("test fence %s: %w", path, agent.ErrNotOwner)
	}
	return nil
}

// lyingRemote reaches the children's node in-process; its first start
// answers with a turn id whose submission never committed, as a node that
// lost the child while paused did.
type lyingRemote struct {
	child  func() *agent.Runtime
	starts atomic.Int32
}

func (r *lyingRemote) StartChild(ctx context.Context, req agenttool.RemoteStart) (string, error) {
	if r.starts.Add(1) == 1 {
		return "never-committed", nil
	}
	return agenttool.StartRemoteChild(ctx, r.child(), req)
}

func (r *lyingRemote) CancelChild(ctx context.Context, req agenttool.RemoteCancel) error {
	return agenttool.CancelRemoteChild(ctx, r.child(), req)
}

func (r *lyingRemote) DestroyChild(ctx context.Context, child agent.Path) error {
	return agenttool.DestroyRemoteChild(ctx, r.child(), child)
}

// TestRemoteFollowerRestartsUnrecordedRun: a parent told of a child's turn
// that the child has no record of (the hang's other half) does not follow
// it forever: it asks the child's owner to start the run again, and the
// run completes once.
func TestRemoteFollowerRestartsUnrecordedRun(t *testing.T) {
	k := newKit()
	db := teststore.Open(t, &pg, t.TempDir())
	t.Cleanup(func() { db.Close() })
	remote := &lyingRemote{}
	start := func(place splitPlacement, opts agenttool.Options) *agent.Runtime {
		rt := newPlacedRuntime(t, db, place, k, opts)
		if err := rt.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		return rt
	}
	children := start(splitPlacement{children: true}, agenttool.Options{})
	remote.child = func() *agent.Runtime { return children }
	parents := start(splitPlacement{}, agenttool.Options{Remote: remote, RemotePoll: 5 * tick})
	ctx := testCtx(t)
	a, err := parents.Get(ctx, agent.Root("Assistant", "p"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "Q"}, RunID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != agenttool.StatusCompleted || res.Summary != "Findings for Q" {
		t.Fatalf("result: %+v", res)
	}
	if n := remote.starts.Load(); n != 2 {
		t.Errorf("%d starts, want 2 (the unrecorded one, then one through the owner)", n)
	}
	if n := len(k.rec.finishesOf("r1")); n != 1 {
		t.Errorf("OnAgentToolFinish fired %d times, want once", n)
	}
}

func (r *lyingRemote) AnswerChild(ctx context.Context, req agenttool.RemoteAnswer) error {
	return agenttool.AnswerRemoteChild(ctx, r.child(), req)
}

// newPlacedRuntime is a runtime on db, placed by place, with the kit's
// Assistant and Researcher, chat and agent tools (opts); not started.
func newPlacedRuntime(t *testing.T, db store.DB, place agent.Placement, k *kit, opts agenttool.Options) *agent.Runtime {
	t.Helper()
	rt, err := agent.New(context.Background(), agent.Options{DB: db, Placement: place, IdleTimeout: -1, Logger: k.logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []agent.Class{
		{Name: "Assistant", New: func() agent.Agent { return &assistant{k: k} }, Public: true},
		{Name: "Researcher", New: func() agent.Agent { return &researcher{k: k} }},
	} {
		if err := rt.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := chat.Configure(rt, chat.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := agenttool.Install(rt, opts); err != nil {
		t.Fatal(err)
	}
	return rt
}
