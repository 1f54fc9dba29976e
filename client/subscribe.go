package client

import "sync"

// Subscription delivers the frames a Conn receives after Subscribe, in
// order, on the channel C. Frames are queued without bound, so a slow reader
// never holds up the connection. When the connection ends, C delivers what
// was queued and is then closed; Close (or Conn.Close) closes C at once.
type Subscription struct {
	c  *Conn
	ch chan Frame

	mu      sync.Mutex
	queue   []Frame
	ended   bool // the connection ended: close ch once the queue is empty
	stopped bool
	signal  chan struct{} // capacity 1
	stop    chan struct{}
	done    chan struct{} // closed when the pump goroutine returns
}

// Subscribe returns a subscription to every frame the connection receives
// from now on. Frames received before it (such as the connect frames) are
// not replayed; use Options.OnFrame to see those.
func (c *Conn) Subscribe() *Subscription {
	s := &Subscription{
		c:      c,
		ch:     make(chan Frame),
		signal: make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	c.mu.Lock()
	if c.err != nil {
		s.ended = true
	} else {
		c.subs[s] = struct{}{}
	}
	c.mu.Unlock()
	go s.pump()
	return s
}

// C returns the channel of frames.
func (s *Subscription) C() <-chan Frame { return s.ch }

// Close ends the subscription: C is closed and queued frames are dropped.
// It waits for the subscription's goroutine to return.
func (s *Subscription) Close() {
	s.mu.Lock()
	if !s.stopped {
		s.stopped = true
		close(s.stop)
	}
	s.mu.Unlock()
	<-s.done
	s.c.mu.Lock()
	delete(s.c.subs, s)
	s.c.mu.Unlock()
}

func (s *Subscription) push(f Frame) {
	s.mu.Lock()
	s.queue = append(s.queue, f)
	s.mu.Unlock()
	s.wake()
}

func (s *Subscription) end() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.wake()
}

func (s *Subscription) wake() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

func (s *Subscription) pump() {
	defer close(s.done)
	defer close(s.ch)
	for {
		s.mu.Lock()
		q := s.queue
		s.queue = nil
		ended := s.ended
		s.mu.Unlock()
		for _, f := range q {
			select {
			case s.ch <- f:
			case <-s.stop:
				return
			}
		}
		if len(q) > 0 {
			continue
		}
		if ended {
			return
		}
		select {
		case <-s.signal:
		case <-s.stop:
			return
		}
	}
}
