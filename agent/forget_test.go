package agent_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/store"
)

// twoNodes is the placement of one node of a pretend cluster whose other
// node owns every instance named "elsewhere-…" once moved is set; it
// records what Destroy asks the other node to forget, and forgets it on
// that node's runtime.
type twoNodes struct {
	mu     sync.Mutex
	moved  bool
	other  *agent.Runtime
	forgot [][]string
}

func (p *twoNodes) Owns(path agent.Path) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.moved || !isElsewhere(path)
}

func isElsewhere(path agent.Path) bool {
	n := path.Leaf().Name
	return len(n) > 10 && n[:10] == "elsewhere-"
}

func (p *twoNodes) Epoch(path agent.Path) (int64, bool) { return 1, p.Owns(path) }

func (p *twoNodes) Fence(context.Context, store.Tx, agent.Path, int64) error { return nil }

func (p *twoNodes) ForgetRemote(ctx context.Context, paths []agent.Path) error {
	var list []string
	for _, path := range paths {
		list = append(list, path.String())
	}
	slices.Sort(list)
	p.mu.Lock()
	p.forgot = append(p.forgot, list)
	other := p.other
	p.mu.Unlock()
	other.ForgetDestroyed(paths)
	return nil
}

// TestDestroyDropsDescendantsOnOtherNodes: destroying an instance whose
// descendants other nodes own (and hold in memory) tells those nodes to
// drop them, with the paths of every such descendant, deep ones too;
// ForgetDestroyed there drops them and what is below them, and closes
// their connections.
func TestDestroyDropsDescendantsOnOtherNodes(t *testing.T) {
	ctx := context.Background()
	classes := []agent.Class{{Name: "Sleeper", New: func() agent.Agent { return &sleeper{} }}}
	place := &twoNodes{}
	e := startRuntime(t, rtOptions{place: place, classes: classes})
	// The other node: a runtime of its own on the same database.
	other := startRuntime(t, rtOptions{dir: e.dir, classes: classes})
	place.other = other.rt
	root := agent.Root("Sleeper", "root")
	child := root.Child("Sleeper", "elsewhere-child")
	local := child.Child("Sleeper", "here")
	deep := local.Child("Sleeper", "elsewhere-deep")
	for _, p := range []agent.Path{root, child, local, deep} {
		if _, err := e.rt.Get(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// The other node took child and deep over and holds them (and one
	// below deep) in memory, with a client on deep.
	place.mu.Lock()
	place.moved = true
	place.mu.Unlock()
	e.rt.Drop(isElsewhere)
	var held []agent.Path
	for _, p := range []agent.Path{child, deep, deep.Child("Sleeper", "below")} {
		if _, err := other.rt.Get(ctx, p); err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	tr := newTransport()
	if _, err := other.rt.Connect(ctx, deep, "c1", nil, tr); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Destroy(ctx, root); err != nil {
		t.Fatal(err)
	}
	// Below deep is the other node's too (its leaf name says nothing):
	// forgetting deep drops it.
	want := []string{child.String(), deep.String()}
	slices.Sort(want)
	if len(place.forgot) != 1 || !slices.Equal(place.forgot[0], want) {
		t.Fatalf("asked the other node to forget %v, want once %v", place.forgot, want)
	}
	for _, p := range held {
		if _, ok := other.rt.Lookup(p); ok {
			t.Errorf("%s is still in the other node's memory", p)
		}
	}
	if code := tr.closedWith(t); code != 1000 {
		t.Errorf("the client of a destroyed instance was closed with %d, want 1000", code)
	}
	if _, ok := e.rt.Lookup(local); ok {
		t.Errorf("%s is still in memory here", local)
	}
	if n := e.queryInt(`SELECT COUNT(*) FROM instances`); n != 0 {
		t.Errorf("%d instance rows remain", n)
	}
}
