package agenttool

import "sync"

// onDemand runs a function on a goroutine of its own each time it is
// kicked, at most one at a time: kicks that come while it runs make one
// more run, and no goroutine exists while none is pending. An awaited run
// has two such watches (its usage relay and its progress crediter); as
// goroutines parked for the run's whole life they were a sixth of a busy
// server's goroutines, each with a stack the SQLite calls had grown.
type onDemand struct {
	fn      func()
	mu      sync.Mutex
	idle    sync.Cond // signaled when the goroutine ends; L is &mu
	running bool
	pending bool // kicked while running: run once more
	stopped bool
}

func newOnDemand(fn func()) *onDemand {
	d := &onDemand{fn: fn}
	d.idle.L = &d.mu
	return d
}

// kick runs fn soon, on a goroutine of its own; it never blocks. After
// stop it does nothing.
func (d *onDemand) kick() {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.stopped:
	case d.running:
		d.pending = true
	default:
		d.running = true
		go d.run()
	}
}

func (d *onDemand) run() {
	d.fn()
	d.mu.Lock()
	for d.pending {
		d.pending = false
		d.mu.Unlock()
		d.fn()
		d.mu.Lock()
	}
	d.running = false
	d.idle.Broadcast()
	d.mu.Unlock()
}

// stop refuses later kicks and returns once the runs already kicked have
// ended.
func (d *onDemand) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	for d.running {
		d.idle.Wait()
	}
}
