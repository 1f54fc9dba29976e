package server

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// frameOverhead is what one queued frame costs besides its bytes: its
// slice header in the queue.
const frameOverhead = 24

func frameCost(frame []byte) int64 { return int64(len(frame)) + frameOverhead }

// sendBudget is the memory budget that every socket's send queue shares
// (Options.SendBudgetBytes). used is the sum of the sockets' queued bytes;
// it never passes limit: a frame that would make it pass first closes the
// sockets with the largest queues (1013), dropping what they queued.
type sendBudget struct {
	limit int64
	used  atomic.Int64
	shed  sync.Mutex // one shedder at a time
	// sockets lists the sockets that may be shed.
	sockets func() []*socket
	// onShed reports a socket closed for the budget.
	onShed func(sk *socket, queued int64)
}

// reserve accounts cost bytes for self's queue, shedding the largest
// queues first if needed. It returns false when self itself was shed (or
// the frame is larger than the whole budget); the caller must not queue
// the frame then.
func (b *sendBudget) reserve(self *socket, cost int64) bool {
	if cost > b.limit {
		self.drop("frame larger than the server's send budget")
		return false
	}
	for {
		cur := b.used.Load()
		if cur+cost <= b.limit {
			if b.used.CompareAndSwap(cur, cur+cost) {
				return true
			}
			continue
		}
		if !b.makeRoom(self, cost) {
			return false
		}
	}
}

// makeRoom closes the socket with the largest queue, unless another
// shedder made room meanwhile. It returns false when it closed self.
func (b *sendBudget) makeRoom(self *socket, cost int64) bool {
	b.shed.Lock()
	defer b.shed.Unlock()
	if b.used.Load()+cost <= b.limit {
		return true
	}
	var victim *socket
	var most int64
	for _, sk := range b.sockets() {
		if q := sk.queued.Load(); q > most {
			victim, most = sk, q
		}
	}
	if victim == nil || victim == self {
		// Nothing else to shed (what is used is in flight between
		// reserve and queue, or self is the largest).
		self.drop("client too slow")
		if b.onShed != nil {
			b.onShed(self, most)
		}
		return false
	}
	victim.drop("client too slow")
	if b.onShed != nil {
		b.onShed(victim, most)
	}
	return true
}

func (b *sendBudget) release(cost int64) { b.used.Add(-cost) }

// socket is the agent.Transport of one WebSocket: a bounded queue drained by
// one writer goroutine, so broadcasters never block on a slow client.
type socket struct {
	c            *websocket.Conn
	bc           *batchConn // the connection under c, when it could be wrapped
	path         string     // the instance's, for logs
	writeTimeout time.Duration
	maxFrames    int
	maxBytes     int64
	budget       *sendBudget
	ready        chan struct{} // signalled when frames were queued

	// queued is the cost of the frames waiting, the one being written
	// included; it is written under mu and read without it by shedders.
	queued atomic.Int64

	mu        sync.Mutex
	queue     [][]byte // frames waiting for the writer, oldest first; queue[0] is being written
	closed    bool
	done      chan struct{}
	closeCode int
	closeWhy  string
}

// Send queues a frame without blocking. A socket whose queue would pass
// its own limits, or whose queue is the largest when the server's budget
// would pass, is closed with 1013 (try again later) and its queue dropped:
// the client reconnects and resumes.
func (sk *socket) Send(frame []byte) bool {
	cost := frameCost(frame)
	sk.mu.Lock()
	if sk.closed {
		sk.mu.Unlock()
		return false
	}
	if len(sk.queue) >= sk.maxFrames || sk.queued.Load()+cost > sk.maxBytes {
		sk.dropLocked(int(websocket.StatusTryAgainLater), "client too slow")
		sk.mu.Unlock()
		return false
	}
	sk.mu.Unlock()
	if !sk.budget.reserve(sk, cost) {
		return false
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.closed || len(sk.queue) >= sk.maxFrames || sk.queued.Load()+cost > sk.maxBytes {
		sk.budget.release(cost)
		sk.dropLocked(int(websocket.StatusTryAgainLater), "client too slow")
		return false
	}
	sk.queue = append(sk.queue, frame)
	sk.queued.Add(cost)
	select {
	case sk.ready <- struct{}{}:
	default:
	}
	return true
}

// head returns the oldest queued frame, which the writer writes next.
func (sk *socket) head() ([]byte, bool) {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if len(sk.queue) == 0 {
		return nil, false
	}
	return sk.queue[0], true
}

// pop removes the frame the writer has written, unless the queue was
// dropped meanwhile (which accounted for it).
func (sk *socket) pop() {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if len(sk.queue) == 0 {
		return
	}
	cost := frameCost(sk.queue[0])
	sk.queue[0] = nil
	sk.queue = sk.queue[1:]
	if len(sk.queue) == 0 {
		sk.queue = nil // let a burst's backing array go
	}
	sk.queued.Add(-cost)
	sk.budget.release(cost)
}

// Close flushes queued frames and then closes the socket with code.
func (sk *socket) Close(code int, reason string) {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	sk.closeLocked(code, reason)
}

// drop closes the socket with 1013 and frees its queue at once.
func (sk *socket) drop(reason string) {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	sk.dropLocked(int(websocket.StatusTryAgainLater), reason)
}

func (sk *socket) dropLocked(code int, reason string) {
	if q := sk.queued.Swap(0); q > 0 {
		sk.budget.release(q)
	}
	for i := range sk.queue {
		sk.queue[i] = nil
	}
	sk.queue = nil
	sk.closeLocked(code, reason)
}

// closedWith reports the code and reason of a close the server initiated.
func (sk *socket) closedWith() (int, string, bool) {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	return sk.closeCode, sk.closeWhy, sk.closed
}

func (sk *socket) closeLocked(code int, reason string) {
	if sk.closed {
		return
	}
	sk.closed = true
	sk.closeCode, sk.closeWhy = code, reason
	close(sk.done)
}

// writeQueued writes the queued frames. With a batchConn under the
// WebSocket, a queue of more than one frame is written as a batch: the
// frames' bytes are kept and go out in writes of up to maxBatchBytes, and
// the network write's deadline bounds the time a client may take to read
// (a frame is popped, releasing its budget, once it is in the batch).
// Without one, each frame is written with a timeout of its own.
func (sk *socket) writeQueued(ctx context.Context) error {
	if sk.bc == nil {
		frame, ok := sk.head()
		if !ok {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, sk.writeTimeout)
		err := sk.c.Write(wctx, websocket.MessageText, frame)
		cancel()
		if err != nil {
			return err
		}
		sk.pop()
		return nil
	}
	// The connection's write deadline bounds every write; a context
	// that is never done costs the WebSocket library no timer a frame.
	wctx := context.WithoutCancel(ctx)
	batch := sk.pending() > 1
	if batch {
		sk.bc.hold()
	}
	for {
		frame, ok := sk.head()
		if !ok {
			break
		}
		if err := sk.c.Write(wctx, websocket.MessageText, frame); err != nil {
			if batch {
				sk.bc.release()
			}
			return err
		}
		sk.pop()
		if !batch {
			return nil
		}
	}
	return sk.bc.release()
}

// pending reports how many frames are queued.
func (sk *socket) pending() int {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	return len(sk.queue)
}

// writeLoop writes queued frames, oldest first, until the socket is closed
// and its queue flushed (or dropped), then closes the WebSocket.
func (sk *socket) writeLoop(ctx context.Context) {
	defer sk.drop("") // a writer that gives up frees what is left
	for {
		if _, ok := sk.head(); ok {
			if err := sk.writeQueued(ctx); err != nil {
				sk.mu.Lock()
				sk.dropLocked(int(websocket.StatusAbnormalClosure), "")
				sk.mu.Unlock()
				sk.c.CloseNow()
				return
			}
			continue
		}
		select {
		case <-sk.ready:
		case <-sk.done:
			if _, ok := sk.head(); ok {
				continue // flush what was queued before the close
			}
			sk.mu.Lock()
			code, why := sk.closeCode, sk.closeWhy
			sk.mu.Unlock()
			if code == int(websocket.StatusAbnormalClosure) || code == 0 {
				sk.c.CloseNow()
			} else {
				sk.c.Close(websocket.StatusCode(code), why)
			}
			return
		}
	}
}
