package agent_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// shardedPlacement owns every instance; an instance's shard is the number
// its name starts with ("2-b" is on shard 2), and it serves the shards in
// served.
type shardedPlacement struct {
	mu     sync.Mutex
	served []int
}

func (p *shardedPlacement) Owns(agent.Path) bool                                     { return true }
func (p *shardedPlacement) Epoch(agent.Path) (int64, bool)                           { return 1, true }
func (p *shardedPlacement) Fence(context.Context, store.Tx, agent.Path, int64) error { return nil }

func (p *shardedPlacement) ShardOf(path agent.Path) int {
	name := path[len(path)-1].Name
	n := 0
	for _, r := range name[:strings.IndexByte(name, '-')] {
		n = n*10 + int(r-'0')
	}
	return n
}

func (p *shardedPlacement) Owned() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.served)
}

type sleeper struct{ agent.Base }

// TestWakeShardsReadsOnlyTheirReasons: a wake reason is stored with its
// instance's shard, and waking the shards a node acquires reads those
// shards' reasons through the shard's index, not the whole cluster's; a
// reason stored without a shard (before the column existed) is filed under
// its shard by the first wake and woken with it.
func TestWakeShardsReadsOnlyTheirReasons(t *testing.T) {
	ctx := context.Background()
	classes := []agent.Class{{Name: "Sleeper", New: func() agent.Agent { return &sleeper{} }}}
	place := &shardedPlacement{served: []int{1, 2, 3}}
	e := startRuntime(t, rtOptions{place: place, classes: classes})
	ids := map[string]int64{}
	for _, name := range []string{"1-a", "2-b", "3-c", "1-d"} {
		a, err := e.rt.Get(ctx, agent.Root("Sleeper", name))
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = agent.BaseOf(a).InstanceID()
		if name == "1-d" {
			continue
		}
		if err := agent.BaseOf(a).KeepAwake(ctx, "test", true); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]int{"1-a": 1, "2-b": 2, "3-c": 3} {
		if got := e.queryInt(`SELECT shard FROM instance_wake WHERE instance_id = ?`, ids[name]); got != want {
			t.Fatalf("%s: wake reason on shard %d, want %d", name, got, want)
		}
	}
	// A reason written before the shard column: no shard.
	err := e.sqlite.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO instance_wake (instance_id, reason) VALUES (?, 'legacy')`, ids["1-d"])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := e.dir
	e.close()

	// The node restarts serving no shard, then acquires shard 1.
	place = &shardedPlacement{}
	e = newRuntime(t, rtOptions{dir: dir, place: place, classes: classes})
	woke := record(t, e.rt.Diag(), diag.ChannelAgent)
	e.start()
	if got := wokenOf(woke.drain()); len(got) != 0 {
		t.Fatalf("a node that serves no shard woke %v", got)
	}
	if err := e.rt.WakeShards(ctx, []int{1}); err != nil {
		t.Fatal(err)
	}
	if got, want := wokenOf(woke.drain()), []string{"Sleeper/1-a", "Sleeper/1-d"}; !slices.Equal(got, want) {
		t.Fatalf("acquiring shard 1 woke %v, want %v", got, want)
	}
	if got := e.queryInt(`SELECT shard FROM instance_wake WHERE instance_id = ?`, ids["1-d"]); got != 1 {
		t.Fatalf("the legacy reason is on shard %d, want 1", got)
	}
	if n := e.queryInt(`SELECT COUNT(*) FROM instance_wake WHERE shard IS NULL`); n != 0 {
		t.Fatalf("%d reasons left without a shard", n)
	}
	if err := e.rt.WakeShards(ctx, []int{2, 4}); err != nil {
		t.Fatal(err)
	}
	if got, want := wokenOf(woke.drain()), []string{"Sleeper/2-b"}; !slices.Equal(got, want) {
		t.Fatalf("acquiring shards 2 and 4 woke %v, want %v", got, want)
	}
}

// wokenOf returns the agents of the wake events, sorted.
func wokenOf(evs []diag.Event) []string {
	var out []string
	for _, ev := range evs {
		if ev.Type == "wake" {
			out = append(out, ev.Agent)
		}
	}
	slices.Sort(out)
	return out
}
