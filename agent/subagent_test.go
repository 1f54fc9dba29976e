package agent_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
)

// A sub-agent has its own state, KV and private SQL tables (even with the
// same table name as its parent) and knows its parent's path.
func TestSubAgentHasOwnStorage(t *testing.T) {
	h := newHooks()
	e := startRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ctx := context.Background()
	rootPath := agent.Root("Probe", "root")
	parent := getProbe(t, e.rt, rootPath)

	if ok, err := parent.HasSubAgent(ctx, "Probe", "kid"); err != nil || ok {
		t.Fatalf("HasSubAgent before creation = %v, %v", ok, err)
	}
	child, err := agent.SubAgent[*Probe](ctx, parent, "Probe", "kid")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := parent.HasSubAgent(ctx, "Probe", "kid"); err != nil || !ok {
		t.Fatalf("HasSubAgent after creation = %v, %v", ok, err)
	}
	if parent.ParentPath() != nil {
		t.Errorf("root ParentPath = %v, want nil", parent.ParentPath())
	}
	if !child.ParentPath().Equal(rootPath) {
		t.Errorf("child ParentPath = %v, want %v", child.ParentPath(), rootPath)
	}
	if child.Name() != "kid" || child.ClassName() != "Probe" || !child.Path().Equal(rootPath.Child("Probe", "kid")) {
		t.Errorf("child identity: name %q class %q path %v", child.Name(), child.ClassName(), child.Path())
	}
	if child.InstanceID() == parent.InstanceID() {
		t.Fatal("child shares the parent's instance id")
	}
	again, err := agent.SubAgent[*Probe](ctx, parent, "Probe", "kid")
	if err != nil || again != child {
		t.Fatalf("second SubAgent returned another value (%p vs %p, %v)", again, child, err)
	}

	if _, err := parent.Bump(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := child.Bump(ctx, 100); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Probe{parent, child} {
		if err := p.Storage().Put(ctx, "who", p.Name()); err != nil {
			t.Fatal(err)
		}
		writeNote(t, p, "note of "+p.Name())
	}
	// Read back after eviction, from storage.
	e.rt.Evict(child.Path())
	e.rt.Evict(rootPath)
	parent = getProbe(t, e.rt, rootPath)
	child, err = agent.SubAgent[*Probe](ctx, parent, "Probe", "kid")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p     *Probe
		count int
	}{{parent, 1}, {child, 100}} {
		var s count
		if err := c.p.DecodeState(&s); err != nil || s.Count != c.count {
			t.Errorf("%s state = %+v, %v; want count %d", c.p.Name(), s, err, c.count)
		}
		var who string
		if ok, err := c.p.Storage().Get(ctx, "who", &who); err != nil || !ok || who != c.p.Name() {
			t.Errorf("%s KV who = %q, %v, %v", c.p.Name(), who, ok, err)
		}
		if notes := readNotes(t, c.p); !slices.Equal(notes, []string{"note of " + c.p.Name()}) {
			t.Errorf("%s notes = %q", c.p.Name(), notes)
		}
	}

	// A typed SubAgent of the wrong type fails cleanly.
	type other struct{ agent.Base }
	if _, err := agent.SubAgent[*other](ctx, parent, "Probe", "kid"); err == nil {
		t.Error("SubAgent with the wrong type parameter succeeded")
	}
	if _, err := parent.SubAgent(ctx, "Unregistered", "x"); err == nil {
		t.Error("SubAgent of an unregistered class succeeded")
	}
}

// DeleteSubAgent (and Destroy) remove the child and its descendants: rows,
// KV, schedules, private tables (gone from sqlite_master), in-memory
// instances and connections; the parent and its data are untouched.
func TestDeleteSubAgentRemovesSubtree(t *testing.T) {
	h := newHooks()
	e := newRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ev := record(t, e.rt.Diag(), diag.ChannelAgent)
	e.start()
	ctx := context.Background()
	rootPath := agent.Root("Probe", "root")
	parent := getProbe(t, e.rt, rootPath)
	child, err := agent.SubAgent[*Probe](ctx, parent, "Probe", "kid")
	if err != nil {
		t.Fatal(err)
	}
	grand, err := agent.SubAgent[*Probe](ctx, child, "Probe", "grandkid")
	if err != nil {
		t.Fatal(err)
	}
	sibling, err := agent.SubAgent[*Probe](ctx, parent, "Probe", "kid2")
	if err != nil {
		t.Fatal(err)
	}
	all := []*Probe{parent, child, grand, sibling}
	ids := map[string]int64{}
	for _, p := range all {
		ids[p.Name()] = p.InstanceID()
		if _, err := p.Bump(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := p.Storage().Put(ctx, "k", 1); err != nil {
			t.Fatal(err)
		}
		writeNote(t, p, p.Name())
		if _, err := p.ScheduleAfter(ctx, time.Hour, "Tick", nil); err != nil {
			t.Fatal(err)
		}
	}
	table := func(name string) string { return fmt.Sprintf("u%d_notes", ids[name]) }
	tables := e.userTables()
	for _, p := range all {
		if !tables[table(p.Name())] {
			t.Fatalf("table %s missing before delete; have %v", table(p.Name()), tables)
		}
	}

	conns := map[string]*fakeTransport{}
	for _, p := range all {
		tr := newTransport()
		if _, err := e.rt.Connect(ctx, p.Path(), "c-"+p.Name(), nil, tr); err != nil {
			t.Fatal(err)
		}
		conns[p.Name()] = tr
	}

	if err := parent.DeleteSubAgent(ctx, "Probe", "kid"); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, "destroy", child.Path().String())

	for _, gone := range []*Probe{child, grand} {
		if code := conns[gone.Name()].closedWith(t); code != 1000 {
			t.Errorf("%s connection closed with %d, want 1000", gone.Name(), code)
		}
		if ok, err := e.rt.Exists(ctx, gone.Path()); err != nil || ok {
			t.Errorf("%s Exists after delete = %v, %v", gone.Name(), ok, err)
		}
		if e.rt.Resident(gone.Path()) {
			t.Errorf("%s still resident", gone.Name())
		}
		id := ids[gone.Name()]
		for _, q := range []string{
			`SELECT count(*) FROM instances WHERE id = ?`,
			`SELECT count(*) FROM kv WHERE instance_id = ?`,
			`SELECT count(*) FROM schedules WHERE instance_id = ?`,
			`SELECT count(*) FROM user_tables WHERE instance_id = ?`,
		} {
			if n := e.queryInt(q, id); n != 0 {
				t.Errorf("%s: %s = %d after delete", gone.Name(), q, n)
			}
		}
	}
	tables = e.userTables()
	for _, name := range []string{"kid", "grandkid"} {
		if tables[table(name)] {
			t.Errorf("table %s still in sqlite_master", table(name))
		}
	}
	for _, kept := range []*Probe{parent, sibling} {
		if !tables[table(kept.Name())] {
			t.Errorf("table of %s was dropped", kept.Name())
		}
		if conns[kept.Name()].isClosed() {
			t.Errorf("connection of %s was closed", kept.Name())
		}
		if ok, _ := e.rt.Exists(ctx, kept.Path()); !ok {
			t.Errorf("%s was destroyed", kept.Name())
		}
		if n := e.queryInt(`SELECT count(*) FROM schedules WHERE instance_id = ?`, kept.InstanceID()); n != 1 {
			t.Errorf("%s has %d schedules, want 1", kept.Name(), n)
		}
	}
	if notes := readNotes(t, parent); !slices.Equal(notes, []string{"root"}) {
		t.Errorf("parent notes = %q", notes)
	}

	// The child's name can be used again: a fresh, empty instance.
	fresh, err := agent.SubAgent[*Probe](ctx, parent, "Probe", "kid")
	if err != nil {
		t.Fatal(err)
	}
	if fresh.State() != nil {
		t.Errorf("recreated child has the old state %s", fresh.State())
	}
	if ok, _ := fresh.HasSubAgent(ctx, "Probe", "grandkid"); ok {
		t.Error("recreated child still has the old grandchild")
	}

	// Deleting a missing child is not an error; Destroy of the root removes
	// everything.
	if err := parent.DeleteSubAgent(ctx, "Probe", "never"); err != nil {
		t.Errorf("DeleteSubAgent of a missing child: %v", err)
	}
	if err := parent.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"root", "kid2"} {
		if code := conns[name].closedWith(t); code != 1000 {
			t.Errorf("%s connection closed with %d", name, code)
		}
	}
	if n := e.queryInt(`SELECT count(*) FROM instances`); n != 0 {
		t.Errorf("%d instances left after destroying the root", n)
	}
	if n := e.queryInt(`SELECT count(*) FROM schedules`); n != 0 {
		t.Errorf("%d schedules left after destroying the root", n)
	}
	if tables := e.userTables(); len(tables) != 0 {
		t.Errorf("user tables left: %v", tables)
	}
	if n := e.rt.ResidentCount(); n != 0 {
		t.Errorf("%d instances resident after destroying the root", n)
	}
}

// After Destroy the runtime serves a fresh, empty instance at the same path;
// destroying a missing instance is not an error.
func TestDestroyThenReuse(t *testing.T) {
	h := newHooks()
	e := startRuntime(t, rtOptions{classes: []agent.Class{probeClass(h)}})
	ctx := context.Background()
	path := agent.Root("Probe", "phoenix")
	if _, err := e.rt.Call(ctx, path, "bump", 3); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Destroy(ctx, path); err != nil {
		t.Fatal(err)
	}
	res, err := e.rt.Call(ctx, path, "bump", 1)
	if err != nil || string(res) != "1" {
		t.Fatalf("bump on the recreated instance = %s, %v; want 1", res, err)
	}
	if err := e.rt.Destroy(ctx, agent.Root("Probe", "never-existed")); err != nil {
		t.Fatalf("Destroy of a missing instance: %v", err)
	}
}

// TestSubAgentRowsLinkToParents: a sub-agent created under a resident parent
// (which writes only its own row) and one whose parent is not resident
// (which writes the missing ancestors' rows too) both record their parent's
// row as parent_id, and nothing is stored twice.
func TestSubAgentRowsLinkToParents(t *testing.T) {
	e := newRuntime(t, rtOptions{classes: []agent.Class{probeClass(newHooks())}})
	e.start()
	ctx := context.Background()
	parent := getProbe(t, e.rt, agent.Root("Probe", "p"))
	child, err := agent.SubAgent[*Probe](ctx, parent, "Probe", "kid")
	if err != nil {
		t.Fatal(err)
	}
	// Not resident: the path's parent and grandparent rows are written by
	// the hydration of the leaf.
	far := getProbe(t, e.rt, agent.Root("Probe", "q").Child("Probe", "mid").Child("Probe", "leaf"))
	mid := e.queryInt(`SELECT id FROM instances WHERE path = ?`, agent.Root("Probe", "q").Child("Probe", "mid").String())
	for _, c := range []struct {
		p      *Probe
		parent int64
	}{{child, parent.InstanceID()}, {far, int64(mid)}} {
		if got := e.queryInt(`SELECT parent_id FROM instances WHERE id = ?`, c.p.InstanceID()); int64(got) != c.parent {
			t.Errorf("%s: parent_id %d, want %d", c.p.Path(), got, c.parent)
		}
	}
	if n := e.queryInt(`SELECT COUNT(*) FROM instances`); n != 5 {
		t.Errorf("%d instance rows, want 5 (p, p/kid, q, q/mid, q/mid/leaf)", n)
	}
}
