package mcpserver

import (
	"context"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
)

// maxPendingProgress bounds the progress signals waiting for a slow
// client. The child's signals are coalesced already (latest wins within
// 200 ms), so the queue is short unless the client stops reading; past
// the bound a newer snapshot replaces the newest waiting one, and a
// milestone is never dropped for a snapshot.
const maxPendingProgress = 32

// progressRelay forwards a run's progress signals to the MCP client as
// notifications/progress, in order, from a goroutine of its own: the
// registry calls offer with its lock held, so offer never blocks.
type progressRelay struct {
	session *mcp.ServerSession
	token   any
	call    context.Context // the call's: the SDK sends on the call's stream

	mu      sync.Mutex
	cond    *sync.Cond
	pending []agenttool.ProgressEvent
	closed  bool
	done    chan struct{}
	once    sync.Once

	last float64 // the last progress value sent (it must increase)
}

// newProgressRelay returns the relay of the call whose handler runs in ctx.
func newProgressRelay(ctx context.Context, rt *agent.Runtime, session *mcp.ServerSession, token any) *progressRelay {
	p := &progressRelay{session: session, token: token, call: ctx, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	rt.Go(func(ctx context.Context) { p.loop(ctx) })
	return p
}

// offer queues the progress signal an event carries, if it carries one.
func (p *progressRelay) offer(ev agenttool.Event) {
	pe, ok := agenttool.ProgressOf(ev)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if len(p.pending) >= maxPendingProgress {
		for i := len(p.pending) - 1; i >= 0; i-- {
			if p.pending[i].Milestone == nil {
				if pe.Milestone == nil {
					p.pending[i] = pe
					return
				}
				p.pending = append(p.pending[:i], p.pending[i+1:]...)
				break
			}
		}
		if len(p.pending) >= maxPendingProgress {
			return // all milestones: the oldest ones stay
		}
	}
	p.pending = append(p.pending, pe)
	p.cond.Signal()
}

// close stops taking signals, sends the ones waiting and returns when they
// are sent; it is idempotent and safe on a nil relay.
func (p *progressRelay) close() {
	if p == nil {
		return
	}
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.cond.Signal()
		p.mu.Unlock()
	})
	<-p.done
}

func (p *progressRelay) loop(ctx context.Context) {
	defer close(p.done)
	stopped := func() {
		p.mu.Lock()
		p.closed = true
		p.pending = nil
		p.cond.Signal()
		p.mu.Unlock()
	}
	defer context.AfterFunc(ctx, stopped)()
	defer context.AfterFunc(p.call, stopped)()
	for {
		p.mu.Lock()
		for len(p.pending) == 0 && !p.closed {
			p.cond.Wait()
		}
		if len(p.pending) == 0 {
			p.mu.Unlock()
			return
		}
		pe := p.pending[0]
		p.pending = p.pending[1:]
		p.mu.Unlock()
		// The call's context routes the notification to the call's own
		// response stream (and its replay), not the session's.
		if err := p.session.NotifyProgress(p.call, p.params(pe)); err != nil {
			// The client went away; the call's result tells it the rest.
			p.mu.Lock()
			p.closed, p.pending = true, nil
			p.mu.Unlock()
			return
		}
	}
}

// params maps a signal to notifications/progress: the fraction as a
// percentage of 100 when the child reports one, the message (or the
// phase, or the milestone) as the message. Progress must increase with
// every notification, so a signal that does not move the fraction moves
// it by a hundredth of a percent.
func (p *progressRelay) params(pe agenttool.ProgressEvent) *mcp.ProgressNotificationParams {
	v := p.last + 0.01
	var total float64
	if pe.Fraction != nil {
		total = 100
		if f := *pe.Fraction * 100; f > p.last {
			v = f
		}
	}
	p.last = v
	msg := pe.Message
	if msg == "" {
		msg = pe.Phase
	}
	if pe.Milestone != nil {
		msg = "milestone " + pe.Milestone.Name + func() string {
			if pe.Milestone.Message != "" {
				return ": " + pe.Milestone.Message
			}
			return ""
		}()
	}
	return &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: v, Total: total, Message: msg}
}
