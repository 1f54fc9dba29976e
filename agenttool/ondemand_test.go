package agenttool

import (
	"sync/atomic"
	"testing"
)

// TestOnDemand: a kick runs the function on a goroutine of its own; kicks
// while it runs make one more run, never a second goroutine at once; stop
// waits for the runs kicked and refuses later kicks.
func TestOnDemand(t *testing.T) {
	started := make(chan int, 8)
	release := make(chan struct{})
	var runs, inside, most atomic.Int32
	d := newOnDemand(func() {
		n := inside.Add(1)
		if n > most.Load() {
			most.Store(n)
		}
		started <- int(runs.Add(1))
		<-release
		inside.Add(-1)
	})
	d.kick()
	if n := <-started; n != 1 {
		t.Fatalf("run %d started first", n)
	}
	for range 3 {
		d.kick() // while the first runs: one more run
	}
	release <- struct{}{}
	if n := <-started; n != 2 {
		t.Fatalf("run %d started second", n)
	}
	stopped := make(chan struct{})
	go func() {
		d.stop()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("stop returned while a run was in progress")
	default:
	}
	release <- struct{}{}
	<-stopped
	d.kick() // refused
	if n, m := runs.Load(), most.Load(); n != 2 || m != 1 {
		t.Fatalf("%d runs, at most %d at once; want 2 and 1", n, m)
	}
	if d.running {
		t.Fatal("a goroutine runs after stop")
	}
}
