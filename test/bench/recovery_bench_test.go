package bench

// Start-up recovery of agent-tool runs: how long a restarted runtime takes
// to bring every run that was in flight at the crash to completed: open the
// database, New, Start (children with unfinished turns wake and resume
// them), hydrate each parent (its recovery classifies and re-attaches its
// runs), until a recovery:row event for every run.
//
//	go test -run '^$' -bench BenchmarkRecovery -benchtime 3x ./test/bench/

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// recovParent dispatches runs; recovChild is a chat child whose model is
// swapped between the set-up (held on a fake clock: "slow") and the
// measured restart (no delay).
type recovParent struct{ agent.Base }

type recovChild struct {
	chat.Base
	m *atomic.Pointer[scripted.Model]
}

func (c *recovChild) ChatModel() model.Model { return c.m.Load() }

func recovRuntime(ctx context.Context, dir string, clock clockwork.Clock, m *atomic.Pointer[scripted.Model]) (*sqlite.DB, *agent.Runtime, error) {
	db, err := sqlite.Open(ctx, filepath.Join(dir, "agentry.db"))
	if err != nil {
		return nil, nil, err
	}
	rt, err := agent.New(ctx, agent.Options{DB: db, Clock: clock, IdleTimeout: -1})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	rt.MustRegister(agent.Class{Name: "RecovParent", New: func() agent.Agent { return &recovParent{} }, Public: true})
	rt.MustRegister(agent.Class{Name: "RecovChild", New: func() agent.Agent { return &recovChild{m: m} }})
	chat.Configure(rt, chat.Config{})
	agenttool.Install(rt, agenttool.Options{})
	return db, rt, nil
}

const recovText = "A child that was interrupted by a restart and finishes after it."

// recovFixture writes parents×perParent running runs through the real API
// (each child held mid-stream), closes the runtime in the middle, and keeps
// the data folder as the crash left it.
func recovFixture(b testing.TB, parents, perParent int) string {
	b.Helper()
	dir := filepath.Join(tmpDir, fmt.Sprintf("recovery-%dx%d", parents, perParent))
	if _, err := os.Stat(filepath.Join(dir, "agentry.db")); err == nil {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	held := clockwork.NewFakeClock()
	var m atomic.Pointer[scripted.Model]
	m.Store(scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text(recovText)})),
		scripted.WithDelay(time.Millisecond), scripted.WithClock(held)))
	db, rt, err := recovRuntime(ctx, dir, nil, &m)
	if err != nil {
		b.Fatal(err)
	}
	if err := rt.Start(ctx); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for p := range parents {
		parent, err := rt.Get(ctx, agent.Root("RecovParent", fmt.Sprintf("p%04d", p)))
		if err != nil {
			b.Fatal(err)
		}
		for c := range perParent {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The runtime's context, as a chat turn has it: the close
				// ends the call.
				_, _ = agenttool.RunAgentTool(rt.Context(), parent, "RecovChild", agenttool.RunOptions{
					RunID: fmt.Sprintf("r%04d", c), Input: "go"})
			}()
		}
	}
	// Every child streams its first event and waits on the held clock.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := held.BlockUntilContext(wctx, parents*perParent); err != nil {
		b.Fatalf("children did not start: %v", err)
	}
	// And every run is recorded as running with its child's turn (the
	// dispatch writes both right after the child starts streaming).
	for {
		var ready int
		err := db.View(wctx, func(tx store.Tx) error {
			return tx.QueryRow(wctx, `SELECT (SELECT COUNT(*) FROM agent_tool_runs WHERE status = 'running')
				+ (SELECT COUNT(*) FROM agent_tool_child_runs WHERE request_id IS NOT NULL)`).Scan(&ready)
		})
		if err != nil {
			b.Fatal(err)
		}
		if ready == 2*parents*perParent {
			break
		}
		runtime.Gosched()
	}
	rt.Close()
	wg.Wait()
	db.Close()
	return dir
}

func BenchmarkRecovery(b *testing.B) {
	b.Run("1parent-1000children", func(b *testing.B) { benchRecovery(b, 1, 1000) })
	b.Run("1000parents-1child", func(b *testing.B) { benchRecovery(b, 1000, 1) })
}

func benchRecovery(b *testing.B, parents, perParent int) {
	fixture := recovFixture(b, parents, perParent)
	runs := parents * perParent
	var m atomic.Pointer[scripted.Model]
	m.Store(scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text(recovText)}))))
	ctx := context.Background()
	var total time.Duration
	var stats sqlite.Stats
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		dir := filepath.Join(tmpDir, fmt.Sprintf("recovery-run-%d-%d-%d", parents, perParent, i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for _, f := range []string{"agentry.db", "agentry.db-wal", "agentry.db-shm"} {
			if _, err := os.Stat(filepath.Join(fixture, f)); err == nil {
				if err := copyFile(filepath.Join(fixture, f), filepath.Join(dir, f)); err != nil {
					b.Fatal(err)
				}
			}
		}
		var completed, other atomic.Int64
		var firstOther atomic.Value
		all := make(chan struct{})
		var once sync.Once
		b.StartTimer()
		start := time.Now()
		db, rt, err := recovRuntime(ctx, dir, nil, &m)
		if err != nil {
			b.Fatal(err)
		}
		rt.Diag().Subscribe(diag.ChannelAgentTool, func(e diag.Event) {
			if e.Type != "recovery:row" {
				return
			}
			if e.Attrs["status"] == "completed" {
				completed.Add(1)
			} else {
				other.Add(1)
				firstOther.CompareAndSwap(nil, fmt.Sprint(e.Agent, " ", e.Attrs))
			}
			if completed.Load()+other.Load() == int64(runs) {
				once.Do(func() { close(all) })
			}
		})
		if err := rt.Start(ctx); err != nil {
			b.Fatal(err)
		}
		// Hydrate every parent (a no-op for those the start woke), as the
		// first client of each would.
		sem := make(chan struct{}, 64)
		var hw sync.WaitGroup
		for p := range parents {
			sem <- struct{}{}
			hw.Add(1)
			go func() {
				defer hw.Done()
				defer func() { <-sem }()
				if _, err := rt.Get(ctx, agent.Root("RecovParent", fmt.Sprintf("p%04d", p))); err != nil {
					b.Error(err)
				}
			}()
		}
		hw.Wait()
		select {
		case <-all:
		case <-time.After(5 * time.Minute):
			b.Fatalf("recovered %d of %d runs", completed.Load()+other.Load(), runs)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		total += elapsed
		st := db.Stats()
		stats.Views += st.Views
		stats.Updates += st.Updates
		stats.Commits += st.Commits
		stats.Statements += st.Statements
		rt.Close()
		db.Close()
		os.RemoveAll(dir)
		if other.Load() != 0 {
			b.Fatalf("%d of %d runs did not recover as completed (first: %v)", other.Load(), runs, firstOther.Load())
		}
		b.StartTimer()
	}
	b.StopTimer()
	per := total / time.Duration(b.N)
	b.ReportMetric(float64(per.Microseconds())/1000, "ms/recovery")
	b.ReportMetric(float64(runs)/per.Seconds(), "runs/s")
	n := float64(b.N * runs)
	b.ReportMetric(float64(stats.Views)/n, "views/run")
	b.ReportMetric(float64(stats.Updates)/n, "updates/run")
	b.ReportMetric(float64(stats.Commits)/n, "commits/run")
	b.ReportMetric(float64(stats.Statements)/n, "stmts/run")
}
