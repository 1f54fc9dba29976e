// Package soakcrash is a crash soak test of agents as tools. A real server
// (test/soakcrash/server) runs a mixed workload — four chat Parents, each
// asking round after round for two awaited Worker children at once (three
// tool steps and streamed text each), and a detached Worker run on every
// even round — and the test SIGKILLs it at random moments and restarts it
// on the same data folder, at least 20 times (SOAK_KILLS; 30 by default, 24
// with -race).
//
// One client per Parent, a "tab", stays open across the restarts: after
// each restart it reconnects to the same Parent and keeps accumulating
// agent-tool events with the npm reducer's semantics (dedupe by run and
// sequence over the hook's lifetime; see reducer_test.go, a port of
// test/npm/tool-events.mjs). The tab also drives its Parent: it asks for
// round k over RPC and, once the round's turn has ended, for round k+1; a
// round whose answer was lost in a kill is asked again (it is keyed, so it
// never runs twice).
//
// A kill comes after a random number (seeded math/rand; the seed is logged,
// SOAK_SEED replays it) of live agent-tool frames observed by the tabs, so
// it lands at a random point of the streams. After the last kill the server
// is restarted once more and every run is let finish. Then the test checks:
//
//	(a) no (parent, runId, sequence) was ever delivered, to any client, live
//	    or in a replay, with two different events;
//	(b) every run ended completed, and for every run the text the tab ended
//	    with equals the text of a fresh replay (a new connection after the
//	    end) and the text of the child's final assistant message (its
//	    transcript, read through the parent's drill-in route), every text
//	    part included: what a restart cut short is kept, marked, for those
//	    who saw it; each step's text appears once in the answer proper
//	    (chat.MessageText, which leaves the cut parts out);
//	(c) no child executed anything after its turn had ended: the server logs
//	    each model step, tool step and turn end of a Worker to exec.log in the
//	    data folder, and no model or tool step (and no second end) of a child
//	    may follow its first end. A tool step or model step that a kill
//	    interrupted before its result was committed runs again after the
//	    restart — that is allowed (at-least-once for an interrupted step);
//	    the test logs how many executions each step had, and requires every
//	    step of every child to have run at least once.
//
// The whole registry of a Parent is checked, detached runs included; a run
// that never ends is reported as not completed once a deadline passed.
// When node and test/npm/node_modules are there (`make npm`), the frames
// every client received are also reduced by the node replica
// (test/npm/reduce-frames.mjs), which must agree with the Go port.
//
// The test is skipped with -short. On a 2-core machine it takes about 25 s
// (about 1 min with -race).
package soakcrash

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

// serverBin is test/soakcrash/server, built once (with -race when the tests
// run with -race).
var serverBin = &testenv.Binary{Pkg: "github.com/agentry/agentry/test/soakcrash/server", Race: testenv.Race}

func TestMain(m *testing.M) { testenv.Main(m, serverBin) }

const (
	// waitLimit bounds every wait: a deadline for a broken test, never a
	// way to let time pass.
	waitLimit = 30 * time.Second
	// parents is the number of Parent instances (and tabs).
	parents = 4
	// defaultKills is how many times the server is killed (SOAK_KILLS);
	// raceKills with -race, where the server is several times slower.
	defaultKills = 30
	raceKills    = 24
	// maxKillFrames bounds the random number of live frames between a
	// restart and the next kill (0 kills right after the tabs reconnect,
	// while the runs recover).
	maxKillFrames = 1000
	// delay is the scripted models' delay between two streamed events.
	delay = "10ms"
	// steps and execLog are server.Steps and server.ExecLog.
	steps   = 3
	execLog = "exec.log"
)

// runState is a registry row as the server's runs RPC returns it.
type runState struct {
	RunID            string `json:"runId"`
	ParentToolCallID string `json:"parentToolCallId"`
	Status           string `json:"status"`
	Error            string `json:"error"`
}

// ---------------------------------------------------------------------------
// What every client saw.

// seqKey names one agent-tool event: run ids are unique per parent only.
type seqKey struct {
	parent, run string
	seq         string
}

// sighting is the first delivery of a seqKey.
type sighting struct {
	event string // the frame's parentToolCallId and event, compacted
	where string // client, life and whether it was a replay
}

// conflict is a seqKey delivered with two different events.
type conflict struct {
	key           seqKey
	first, second sighting
}

// soak is the state shared by the tabs, their drivers and the test.
type soak struct {
	mu        sync.Mutex
	events    map[seqKey]sighting
	conflicts []conflict
	live      int           // live (not replay) agent-tool frames the tabs saw
	liveCh    chan struct{} // closed and replaced when live grows
	draining  bool          // no new round after the current one
	errs      []string      // RPC errors of the drivers
	outcomes  map[string]string
}

func newSoak() *soak {
	return &soak{events: map[seqKey]sighting{}, liveCh: make(chan struct{}), outcomes: map[string]string{}}
}

// observe records one agent-tool frame delivered to a client.
func (s *soak) observe(parent, who string, life int, data []byte, countLive bool) {
	f, ev, ok := parseToolFrame(data)
	if !ok {
		return
	}
	ptc := ""
	if f.ParentToolCallID != nil {
		ptc = *f.ParentToolCallID
	}
	k := seqKey{parent, ev.RunID, f.Sequence.String()}
	now := sighting{event: ptc + " " + compact(f.Event), where: fmt.Sprintf("%s in life %d (replay %v)", who, life, f.Replay)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if first, seen := s.events[k]; !seen {
		s.events[k] = now
	} else if first.event != now.event {
		s.conflicts = append(s.conflicts, conflict{k, first, now})
	}
	if countLive && !f.Replay {
		s.live++
		close(s.liveCh)
		s.liveCh = make(chan struct{})
	}
}

// waitLive waits until the tabs saw n live frames.
func (s *soak) waitLive(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		got, ch := s.live, s.liveCh
		s.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%d live frames of %d: %w", got, n, ctx.Err())
		}
	}
}

func (s *soak) liveCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live
}

func (s *soak) setDraining() {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
}

func (s *soak) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

func (s *soak) errorf(format string, args ...any) {
	s.mu.Lock()
	s.errs = append(s.errs, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

// ---------------------------------------------------------------------------
// Connections.

// frame is a server frame as the tests read it: testenv.WireFrame,
// the tests' one frame type.
type frame = testenv.WireFrame

// errGone is the error of an RPC whose connection ended first.
var errGone = errors.New("connection gone")

// conn is one WebSocket connection of a client to a Parent; pump reads it.
type conn struct {
	ws   *testenv.WSClient[frame]
	gone chan struct{} // closed when the connection ended

	mu     sync.Mutex
	nextID int
	calls  map[string]chan frame
}

func dial(t *testing.T, host, parent string) *conn {
	t.Helper()
	return &conn{ws: testenv.DialWS[frame](t, waitLimit, "ws://"+host+"/agents/parent/"+parent),
		gone: make(chan struct{}), calls: map[string]chan frame{}}
}

// pump reads the connection until it ends; onTool gets every agent-tool
// frame, RPC answers go to their callers.
func (c *conn) pump(onTool func(data []byte)) {
	defer close(c.gone)
	for {
		f, err := c.ws.Next(context.Background())
		if err != nil {
			return
		}
		switch f.Value.Type {
		case wire.AgentToolEvent:
			onTool(f.Raw)
		case wire.RPC:
			if f.Value.Done != nil && !*f.Value.Done {
				continue
			}
			c.mu.Lock()
			ch := c.calls[f.Value.ID]
			delete(c.calls, f.Value.ID)
			c.mu.Unlock()
			if ch != nil {
				ch <- f.Value
			}
		}
	}
}

// call makes an RPC call; errGone means the connection ended first.
func (c *conn) call(ctx context.Context, method string, args ...any) (json.RawMessage, error) {
	ch := make(chan frame, 1)
	c.mu.Lock()
	c.nextID++
	id := fmt.Sprintf("%s-%d", method, c.nextID)
	c.calls[id] = ch
	c.mu.Unlock()
	if args == nil {
		args = []any{}
	}
	if err := c.ws.SendContext(ctx, map[string]any{"type": wire.RPC, "id": id, "method": method, "args": args}); err != nil {
		return nil, errGone
	}
	var f frame
	select {
	case f = <-ch:
	case <-c.gone:
		select {
		case f = <-ch:
		default:
			return nil, errGone
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if !f.Success {
		return nil, fmt.Errorf("rpc %s: %s", method, f.Error)
	}
	return f.Result, nil
}

// ---------------------------------------------------------------------------
// Tabs: one client per Parent that stays open across the restarts.

// tab is a client of one Parent whose reducer state outlives its
// connections, like a browser tab whose socket reconnects.
type tab struct {
	parent string
	s      *soak

	mu      sync.Mutex
	st      *toolEvents
	raw     [][]byte      // every agent-tool frame received, for the node cross-check
	changed chan struct{} // closed and replaced on every frame and new connection
	cur     *conn
	life    int
	lives   map[string]map[int]bool // run → the lives in which live frames of it arrived
	ends    map[string]bool         // run → live started and terminal frames of it arrived
}

func newTab(s *soak, parent string) *tab {
	return &tab{parent: parent, s: s, st: newToolEvents(), changed: make(chan struct{}),
		lives: map[string]map[int]bool{}, ends: map[string]bool{}}
}

// signal wakes the waiters; tb.mu held.
func (tb *tab) signal() {
	close(tb.changed)
	tb.changed = make(chan struct{})
}

// connect dials the Parent on the server of this life.
func (tb *tab) connect(t *testing.T, host string, life int) {
	c := dial(t, host, tb.parent)
	tb.mu.Lock()
	tb.cur, tb.life = c, life
	tb.signal()
	tb.mu.Unlock()
	go c.pump(func(data []byte) {
		tb.s.observe(tb.parent, "tab "+tb.parent, life, data, true)
		tb.mu.Lock()
		tb.st.apply(data)
		tb.raw = append(tb.raw, data)
		if f, ev, ok := parseToolFrame(data); ok && !f.Replay {
			if tb.lives[ev.RunID] == nil {
				tb.lives[ev.RunID] = map[int]bool{}
			}
			tb.lives[ev.RunID][life] = true
			if ev.Kind != "chunk" {
				tb.ends[ev.RunID+" "+ev.Kind] = true
			}
		}
		tb.signal()
		tb.mu.Unlock()
	})
}

// connection returns the current connection once it is not old (nil: any).
func (tb *tab) connection(ctx context.Context, old *conn) (*conn, int, error) {
	for {
		tb.mu.Lock()
		c, life, ch := tb.cur, tb.life, tb.changed
		tb.mu.Unlock()
		if c != nil && c != old {
			return c, life, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}

// until waits until pred holds of the reducer state.
func (tb *tab) until(ctx context.Context, pred func(*toolEvents) bool) error {
	for {
		tb.mu.Lock()
		ok, ch := pred(tb.st), tb.changed
		tb.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// drive asks the Parent for round after round until the soak drains. A
// round is asked again on the next connection when its answer was lost.
func (tb *tab) drive(ctx context.Context) {
	var c *conn
	for k, tries := 1, 0; ; {
		var life int
		var err error
		c, life, err = tb.connection(ctx, c)
		if err != nil {
			return
		}
		res, err := c.call(ctx, "ask", k)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errGone):
			continue // killed: ask again once reconnected
		case err != nil:
			tb.s.errorf("%s round %d (life %d): %v", tb.parent, k, life, err)
			if tries++; tries < 3 {
				c = nil // try again on this connection
				continue
			}
			return
		}
		var outcome string
		_ = json.Unmarshal(res, &outcome)
		tb.s.mu.Lock()
		tb.s.outcomes[fmt.Sprintf("%s round %d", tb.parent, k)] = outcome
		tb.s.mu.Unlock()
		if tb.s.isDraining() {
			return
		}
		k, tries, c = k+1, 0, nil
	}
}

// ---------------------------------------------------------------------------
// The soak.

// quietTB is the test for a server life that the test kills itself: its
// stderr is not logged when the test fails (dozens of them would drown the
// report); the last life's is.
type quietTB struct{ testing.TB }

func (quietTB) Failed() bool { return false }

func serve(tb testing.TB, data string) *testenv.Process {
	tb.Helper()
	return testenv.StartProcess(tb, waitLimit, serverBin.Path(tb), "--addr", "127.0.0.1:0", "--data", data, "--delay", delay)
}

func envInt(t *testing.T, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a server dozens of times")
	}
	seed := envInt(t, "SOAK_SEED", time.Now().UnixNano())
	kills := defaultKills
	if testenv.Race {
		kills = raceKills
	}
	kills = int(envInt(t, "SOAK_KILLS", int64(kills)))
	t.Logf("seed %d (SOAK_SEED=%d replays the kill points), %d kills", seed, seed, kills)
	rng := rand.New(rand.NewPCG(uint64(seed), 0x50a4))
	begin := time.Now()

	data := t.TempDir()
	s := newSoak()
	var tabs []*tab
	for i := range parents {
		tabs = append(tabs, newTab(s, fmt.Sprintf("p%d", i)))
	}
	var drivers sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer drivers.Wait()
	defer cancel()

	var proc *testenv.Process
	var points []string
	for life := 0; ; life++ {
		if life < kills {
			proc = serve(quietTB{t}, data)
		} else {
			proc = serve(t, data)
		}
		for _, tb := range tabs {
			tb.connect(t, proc.Host, life)
		}
		if life == 0 {
			for _, tb := range tabs {
				drivers.Add(1)
				go func() {
					defer drivers.Done()
					tb.drive(ctx)
				}()
			}
		}
		if life == kills {
			break
		}
		// Kill after a random number of live frames: a random point of the
		// children's streams (0: during the recovery of the restart).
		n := rng.IntN(maxKillFrames + 1)
		wctx, wcancel := context.WithTimeout(ctx, waitLimit)
		err := s.waitLive(wctx, s.liveCount()+n)
		wcancel()
		if err != nil {
			t.Fatalf("life %d: waiting for %d live frames: %v", life, n, err)
		}
		proc.Kill()
		points = append(points, strconv.Itoa(n))
		if life == kills-1 {
			s.setDraining()
		}
	}
	t.Logf("%d kills after %s live frames; %v", kills, strings.Join(points, ","), time.Since(begin).Round(time.Millisecond))

	// Let every round end (the drivers stop after the round they are in),
	// then every run, detached ones included, within one deadline.
	done := make(chan struct{})
	go func() {
		drivers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * waitLimit):
		t.Fatalf("the drivers' last rounds did not end within %v; driver errors: %v", 2*waitLimit, s.errs)
	}
	endCtx, endCancel := context.WithTimeout(ctx, waitLimit)
	defer endCancel()
	registry := map[string][]runState{}
	for _, tb := range tabs {
		c, _, err := tb.connection(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(ctx, waitLimit)
		res, err := c.call(rctx, "runs")
		rcancel()
		if err != nil {
			t.Fatalf("%s: runs: %v", tb.parent, err)
		}
		var runs []runState
		if err := json.Unmarshal(res, &runs); err != nil {
			t.Fatal(err)
		}
		registry[tb.parent] = runs
	}
	for _, tb := range tabs {
		err := tb.until(endCtx, func(st *toolEvents) bool {
			for _, r := range registry[tb.parent] {
				if v := st.runs[r.RunID]; v == nil || !hard(v.Status) {
					return false
				}
			}
			return true
		})
		if err != nil {
			t.Errorf("%s: the tab did not see every run end within the deadline", tb.parent)
		}
	}
	t.Logf("all runs ended; %v", time.Since(begin).Round(time.Millisecond))

	// A fresh replay per Parent, and the children's transcripts.
	fresh := map[string]*toolEvents{}
	freshRaw := map[string][][]byte{}
	for _, tb := range tabs {
		st := newToolEvents()
		fresh[tb.parent] = st
		tabEnded := map[string]bool{}
		tb.mu.Lock()
		for id, r := range tb.st.runs {
			tabEnded[id] = hard(r.Status)
		}
		tb.mu.Unlock()
		var mu sync.Mutex
		changed := make(chan struct{})
		c := dial(t, proc.Host, tb.parent)
		go c.pump(func(data []byte) {
			s.observe(tb.parent, "fresh "+tb.parent, kills, data, false)
			mu.Lock()
			st.apply(data)
			freshRaw[tb.parent] = append(freshRaw[tb.parent], data)
			close(changed)
			changed = make(chan struct{})
			mu.Unlock()
		})
		wctx, wcancel := context.WithTimeout(ctx, waitLimit)
		for {
			mu.Lock()
			all, ch := true, changed
			for _, r := range registry[tb.parent] {
				// The whole registry is replayed at once: every run, ended
				// as the tab saw it end.
				if v := st.runs[r.RunID]; v == nil || (tabEnded[r.RunID] && !terminal(v.Status)) {
					all = false
				}
			}
			mu.Unlock()
			if all {
				break
			}
			select {
			case <-ch:
				continue
			case <-wctx.Done():
			}
			t.Errorf("%s: the fresh replay did not end every run", tb.parent)
			break
		}
		wcancel()
		c.ws.Close()
		<-c.gone
	}
	transcripts := map[string]childAnswer{} // parent/run → the child's final assistant message
	for parent, runs := range registry {
		for _, r := range runs {
			transcripts[parent+"/"+r.RunID] = childText(t, proc.Host, parent, r.RunID)
		}
	}
	proc.Stop()
	for _, tb := range tabs {
		tb.mu.Lock()
		c := tb.cur
		tb.mu.Unlock()
		<-c.gone
	}

	// (a) one event per (parent, run, sequence).
	if n := len(s.conflicts); n > 0 {
		runs := map[string]bool{}
		var b strings.Builder
		for i, c := range s.conflicts {
			runs[c.key.parent+"/"+c.key.run] = true
			if i < 3 {
				fmt.Fprintf(&b, "\n  %s %s seq %s:\n    %s: %s\n    %s: %s", c.key.parent, c.key.run, c.key.seq,
					c.first.where, short(c.first.event), c.second.where, short(c.second.event))
			}
		}
		// The first run's whole timeline as first seen, and its other
		// versions, to show where the two diverge.
		first := s.conflicts[0].key
		var seqs []int
		for k := range s.events {
			if k.parent == first.parent && k.run == first.run {
				n, _ := strconv.Atoi(k.seq)
				seqs = append(seqs, n)
			}
		}
		slices.Sort(seqs)
		fmt.Fprintf(&b, "\n  %s %s as first seen:", first.parent, first.run)
		for _, n := range seqs {
			k := seqKey{first.parent, first.run, strconv.Itoa(n)}
			fmt.Fprintf(&b, "\n    %d %s: %s", n, s.events[k].where, short(s.events[k].event))
			for _, c := range s.conflicts {
				if c.key == k {
					fmt.Fprintf(&b, "\n       else %s: %s", c.second.where, short(c.second.event))
					break
				}
			}
		}
		t.Errorf("(a) %d (run, sequence) pairs of %d runs were delivered with two different events; e.g.%s", n, len(runs), b.String())
	}

	// (b) every run completed, and the tab, a fresh replay and the child
	// agree on its text. A run is "hit" unless the tab received its started
	// event, its chunks and its finished event live in one life; a garbled
	// run that no kill hit would be another bug.
	conflicted := map[string]bool{}
	for _, c := range s.conflicts {
		conflicted[c.key.parent+"/"+c.key.run] = true
	}
	var total, hit, garbled, garbledUnhit, garbledReused, replayDiff, dupSteps, restated, dupIDs int
	var notCompleted, examples []string
	completed := map[string]bool{}
	for _, parent := range sortedKeys(registry) {
		tb := tabs[indexOf(tabs, parent)]
		for _, r := range registry[parent] {
			total++
			id := parent + "/" + r.RunID
			want, answer := transcripts[id].rendered, transcripts[id].answer
			tabRun, freshRun := tb.st.runs[r.RunID], fresh[parent].runs[r.RunID]
			tabText, freshText, tabStatus, freshStatus := "", "", "missing", "missing"
			if tabRun != nil {
				tabText, tabStatus = tabRun.Text(), tabRun.Status
			}
			if freshRun != nil {
				freshText, freshStatus = freshRun.Text(), freshRun.Status
			}
			if r.Status != "completed" || tabStatus != "completed" || freshStatus != "completed" {
				notCompleted = append(notCompleted, fmt.Sprintf("%s: registry %s %q, tab %s, fresh replay %s", id, r.Status, r.Error, tabStatus, freshStatus))
				continue
			}
			completed[id] = true
			wasHit := len(tb.lives[r.RunID]) != 1 || !tb.ends[r.RunID+" started"] || !tb.ends[r.RunID+" finished"]
			if wasHit {
				hit++
			}
			if tabText != want {
				garbled++
				if !wasHit {
					garbledUnhit++
				}
				if conflicted[id] {
					garbledReused++
				}
				examples = append(examples, fmt.Sprintf("%s (hit by a kill: %v): the tab shows\n      %q\n    the child answered\n      %q", id, wasHit, tabText, want))
			}
			if freshText != want {
				replayDiff++
				examples = append(examples, fmt.Sprintf("%s: a fresh replay shows\n      %q\n    the child answered\n      %q", id, freshText, want))
			}
			for n := 1; n <= steps; n++ {
				if c := strings.Count(answer, fmt.Sprintf("Step %d of ", n)); c != 1 {
					dupSteps++
					examples = append(examples, fmt.Sprintf("%s: step %d's text appears %d times in the child's answer %q", id, n, c, answer))
				}
			}
			// The scripted model continues what a kill cut (issue 24,
			// item 6): what clients saw is the answer, said once.
			if want != answer {
				restated++
				examples = append(examples, fmt.Sprintf("%s: the child's parts show\n      %q\n    its answer is\n      %q", id, want, answer))
			}
			if d := transcripts[id].dupIDs; len(d) > 0 {
				dupIDs++
				examples = append(examples, fmt.Sprintf("%s: tool call ids %q appear twice in the child's message", id, d))
			}
		}
	}
	t.Logf("%d runs, %d hit by a kill: %d garbled in the tab (%d not hit, %d with a reused sequence; %.0f per 100 kills), %d differ in a fresh replay, %d not completed, %d step texts not once, %d restated, %d with a repeated tool call id",
		total, hit, garbled, garbledUnhit, garbledReused, float64(garbled)*100/float64(max(kills, 1)), replayDiff, len(notCompleted), dupSteps, restated, dupIDs)
	if len(notCompleted) > 0 {
		if len(notCompleted) > 5 {
			notCompleted = append(notCompleted[:5], fmt.Sprintf("… and %d more", len(notCompleted)-5))
		}
		t.Errorf("(b) of %d runs, %d did not complete (registry, tab, fresh replay):\n  %s", total, len(notCompleted), strings.Join(notCompleted, "\n  "))
	}
	if garbled+replayDiff+dupSteps+restated+dupIDs > 0 {
		if len(examples) > 4 {
			examples = append(examples[:4], fmt.Sprintf("… and %d more", len(examples)-4))
		}
		t.Errorf("(b) of %d completed runs, %d tabs' texts (%d of runs no kill hit) and %d fresh replays' texts differ from the child's answer, %d step texts are not there once, %d children restated a cut answer, %d repeat a tool call id:\n  %s",
			len(completed), garbled, garbledUnhit, replayDiff, dupSteps, restated, dupIDs, strings.Join(examples, "\n  "))
	}

	// (c) nothing runs in a child after its turn ended.
	checkExecutions(t, filepath.Join(data, execLog), registry, completed)

	if len(s.errs) > 0 {
		t.Errorf("driver RPC errors: %v", s.errs)
	}
	for k, o := range s.outcomes {
		if o != "completed" {
			t.Errorf("%s ended %q", k, o)
		}
	}
	crossCheck(t, tabs, fresh, freshRaw)
	t.Logf("%d rounds; wall time %v", len(s.outcomes), time.Since(begin).Round(time.Millisecond))
}

func short(s string) string {
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func indexOf(tabs []*tab, parent string) int {
	for i, tb := range tabs {
		if tb.parent == parent {
			return i
		}
	}
	return -1
}

// childAnswer is a child's last assistant message as text: rendered is the
// text of every text part (what a client shows, what a restart cut short
// included), answer the message's text (chat.MessageText: without what a
// restart cut short).
type childAnswer struct {
	rendered, answer string
	// dupIDs are the tool call ids that two tool parts of the message
	// share.
	dupIDs []string
}

// childText reads the child's transcript through the parent's drill-in
// route and returns its last assistant message's text.
func childText(t *testing.T, host, parent, runID string) childAnswer {
	t.Helper()
	var msgs []message.Message
	testenv.GetJSON(t, "http://"+host+"/agents/parent/"+parent+"/sub/worker/"+url.PathEscape(runID)+"/get-messages", &msgs)
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == message.RoleAssistant {
			var b strings.Builder
			for _, p := range msgs[i].Parts {
				if p.Type == message.PartText {
					b.WriteString(p.Text)
				}
			}
			seen := map[string]bool{}
			var dup []string
			for _, p := range msgs[i].Parts {
				if p.IsTool() {
					if seen[p.ToolCallID] {
						dup = append(dup, p.ToolCallID)
					}
					seen[p.ToolCallID] = true
				}
			}
			return childAnswer{rendered: b.String(), answer: chat.MessageText(msgs[i]), dupIDs: dup}
		}
	}
	return childAnswer{}
}

// childPath is the storage path of a run's child, as the server logs it.
func childPath(parent, runID string) string {
	return "Parent/" + url.PathEscape(parent) + "/Worker/" + url.PathEscape(runID)
}

// checkExecutions reads exec.log: (c) no model step, tool step or second
// end of a child after its first end; every model and tool step of every
// completed child ran; and it logs how often each step ran.
func checkExecutions(t *testing.T, file string, registry map[string][]runState, completed map[string]bool) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type child struct {
		ended  bool
		counts map[string]int // "model 0", "tool 1", …
		after  []string       // lines after the first end
		ondone int
	}
	children := map[string]*child{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) != 3 {
			t.Errorf("exec.log: malformed line %q", sc.Text())
			continue
		}
		kind, path, detail := fields[0], fields[1], fields[2]
		c := children[path]
		if c == nil {
			c = &child{counts: map[string]int{}}
			children[path] = c
		}
		switch kind {
		case "ondone":
			c.ondone++
			continue
		case "model", "tool":
			c.counts[kind+" "+detail]++
		}
		if c.ended {
			c.after = append(c.after, kind+" "+detail)
		}
		if kind == "end" {
			c.ended = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// Histograms: step → executions → children.
	hist := map[string]map[int]int{}
	var violations []string
	missing := 0
	for parent, runs := range registry {
		for _, r := range runs {
			path := childPath(parent, r.RunID)
			c := children[path]
			if c == nil {
				c = &child{counts: map[string]int{}}
			}
			for n := 0; n <= steps; n++ {
				for _, kind := range []string{"model", "tool"} {
					if kind == "tool" && n == 0 {
						continue
					}
					k := fmt.Sprintf("%s %d", kind, n)
					if hist[k] == nil {
						hist[k] = map[int]int{}
					}
					hist[k][c.counts[k]]++
					if c.counts[k] == 0 && completed[parent+"/"+r.RunID] {
						missing++
					}
				}
			}
			if len(c.after) > 0 {
				violations = append(violations, fmt.Sprintf("%s ran %s after its turn ended", path, strings.Join(c.after, ", ")))
			}
		}
	}
	var b strings.Builder
	for _, k := range sortedKeys(hist) {
		fmt.Fprintf(&b, " %s:", k)
		var counts []int
		for n := range hist[k] {
			counts = append(counts, n)
		}
		sort.Ints(counts)
		for _, n := range counts {
			fmt.Fprintf(&b, " %d×%d", hist[k][n], n)
		}
		b.WriteString(";")
	}
	t.Logf("executions per step (children × executions; a step a kill interrupted may run twice):%s", b.String())
	if missing > 0 {
		t.Errorf("(c) %d model or tool steps of completed children never ran", missing)
	}
	if len(violations) > 0 {
		if len(violations) > 5 {
			violations = append(violations[:5], fmt.Sprintf("… and %d more", len(violations)-5))
		}
		t.Errorf("(c) finished children ran again:\n  %s", strings.Join(violations, "\n  "))
	}
}

// crossCheck reduces the frames every client received with the node
// replica of useAgentToolEvents (test/npm/reduce-frames.mjs) and compares
// each run's status and text with the Go port's. Without node and
// test/npm/node_modules it only logs that it did not run.
func crossCheck(t *testing.T, tabs []*tab, fresh map[string]*toolEvents, freshRaw map[string][][]byte) {
	t.Helper()
	_, errNode := exec.LookPath("node")
	_, errMods := os.Stat(filepath.Join(testenv.NPMDir(), "node_modules", "agents"))
	if errNode != nil || errMods != nil {
		t.Log("node or test/npm/node_modules missing (`make npm`): the Go reducer was not cross-checked against the npm one")
		return
	}
	dir := t.TempDir()
	states := map[string]*toolEvents{}
	var files []string
	write := func(name string, frames [][]byte, st *toolEvents) {
		var b strings.Builder
		for _, f := range frames {
			line, _ := json.Marshal(string(f))
			b.Write(line)
			b.WriteByte('\n')
		}
		path := filepath.Join(dir, name+".jsonl")
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, path)
		states[path] = st
	}
	for _, tb := range tabs {
		write("tab-"+tb.parent, tb.raw, tb.st)
		write("fresh-"+tb.parent, freshRaw[tb.parent], fresh[tb.parent])
	}
	out := testenv.Node(t, 2*waitLimit, "reduce-frames.mjs", files...)
	var got map[string]map[string]struct {
		Status string `json:"status"`
		Text   string `json:"text"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("reduce-frames.mjs: %v\n%s", err, out)
	}
	diffs := 0
	for _, file := range files {
		st := states[file]
		for id, r := range got[file] {
			mine := st.runs[id]
			if mine == nil || mine.Status != r.Status || mine.Text() != r.Text {
				diffs++
				if diffs <= 3 {
					t.Errorf("the Go reducer and the npm reducer differ on %s in %s: npm %s %q, Go %+v",
						id, filepath.Base(file), r.Status, r.Text, mine)
				}
			}
		}
		if len(got[file]) != len(st.runs) {
			diffs++
			t.Errorf("%s: the npm reducer has %d runs, the Go one %d", filepath.Base(file), len(got[file]), len(st.runs))
		}
	}
	if diffs == 0 {
		t.Logf("the npm reducer (node) agrees with the Go port on every run of %d clients", len(files))
	}
}
