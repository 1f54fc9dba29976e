package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
)

// runHints runs hs until the test ends.
func runHints(t *testing.T, hs *Hints) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		hs.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// woken waits for a wake-up of ch; the limit only bounds a failing test.
func woken(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("not woken: %s", what)
	}
}

// TestHintsWakeWatchersOnOtherNodes: a hint sent by one node wakes the
// watcher of that child on another node, through PostgreSQL.
func TestHintsWakeWatchersOnOtherNodes(t *testing.T) {
	d := newDB(t)
	child := agent.Path{{Class: "P", Name: "p"}, {Class: "C", Name: "run-1"}}
	sender, follower := NewHints(d.pool, nil, nil), NewHints(d.pool, nil, nil)
	ch, stop := follower.Watch(child)
	defer stop()
	other, stopOther := follower.Watch(child.Parent())
	defer stopOther()
	runHints(t, follower)
	// The listener's connection wakes every watcher once: hints may have
	// been missed before it listened.
	woken(t, ch, "the listener's first connection")
	woken(t, other, "the listener's first connection")
	runHints(t, sender)
	for i := range 3 {
		sender.Hint(child)
		woken(t, ch, "a hint")
		if i == 0 {
			// The other watcher's key was not hinted: only a wake-up
			// sent for it reaches it (checked after the child's, which
			// was sent first).
			sender.Hint(child.Parent())
			woken(t, other, "its own hint")
			select {
			case <-ch:
				t.Fatalf("a hint for another path woke the child's watcher")
			default:
			}
		}
	}
}

// TestHintsReconnectWakesWatchers: when the listening connection is lost
// (here terminated by the server), the node listens again and wakes every
// watcher, since hints sent meanwhile were lost.
func TestHintsReconnectWakesWatchers(t *testing.T) {
	d := newDB(t)
	child := agent.Path{{Class: "P", Name: "p"}, {Class: "C", Name: "run-2"}}
	hs := NewHints(d.pool, nil, nil)
	ch, stop := hs.Watch(child)
	defer stop()
	runHints(t, hs)
	woken(t, ch, "the first connection")
	if _, err := d.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'agentry-hints' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	woken(t, ch, "the reconnection")
	// It listens again: a hint reaches the watcher.
	hs.Hint(child)
	woken(t, ch, "a hint after the reconnection")
}

// TestHintWatchesAreBounded: Watch beyond maxHintWatches gives no channel
// (the follower polls), and ended watches free their place.
func TestHintWatchesAreBounded(t *testing.T) {
	hs := NewHints(nil, nil, nil)
	stops := make([]func(), 0, maxHintWatches)
	for i := range maxHintWatches {
		ch, stop := hs.Watch(agent.Path{{Class: "P", Name: "p"}, {Class: "C", Name: string(rune('a' + i%26))}})
		if ch == nil {
			t.Fatalf("watch %d refused below the bound", i)
		}
		stops = append(stops, stop)
	}
	if ch, _ := hs.Watch(agent.Path{{Class: "P", Name: "x"}}); ch != nil {
		t.Fatalf("a watch beyond the bound was accepted")
	}
	stops[0]()
	stops[0]() // ending twice frees one place
	if ch, stop := hs.Watch(agent.Path{{Class: "P", Name: "x"}}); ch == nil {
		t.Fatalf("no watch after one ended")
	} else {
		stop()
	}
	for _, stop := range stops[1:] {
		stop()
	}
	if len(hs.watches) != 0 || hs.n != 0 {
		t.Fatalf("watches left: %d keys, n=%d", len(hs.watches), hs.n)
	}
}
