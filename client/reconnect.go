package client

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"github.com/agentry/agentry/wire"
	"github.com/jonboulle/clockwork"
)

// Reconnect makes a Conn reconnect when its socket is lost, as the npm
// clients (PartySocket) do: the first attempt at once, then after delays
// that grow from MinDelay by Growth up to MaxDelay. A Conn stops trying and
// ends when the server refuses it for good (a close code CloseError.Terminal
// reports, or a 4xx answer to the upgrade other than 429), when MaxRetries
// attempts in a row failed, or when it is closed.
//
// While it reconnects, Send and Call wait (within their ctx) for the new
// socket; calls that were in flight when the socket was lost fail with its
// *CloseError, since the server may or may not have run them. Chat turns in
// flight are not lost: on the new socket each one is resumed (the server
// replays its chunks, which the Stream applies once, then streams the rest
// live, or ends it with its stored outcome if it finished meanwhile), and a
// turn whose request the server never got is sent again.
type Reconnect struct {
	// MinDelay is the delay before the second attempt; zero means a
	// random delay from 1 s to 5 s, as PartySocket's.
	MinDelay time.Duration
	// MaxDelay caps the delay; zero means 10 s.
	MaxDelay time.Duration
	// Growth multiplies the delay after each failed attempt; below 1 means
	// 1.3.
	Growth float64
	// MaxRetries is the most attempts in a row; zero means no limit.
	MaxRetries int
	// ConnectTimeout bounds one attempt (the upgrade and the connect
	// frames); zero means 4 s.
	ConnectTimeout time.Duration
	// Clock measures the delays; nil means the real clock.
	Clock clockwork.Clock
	// OnDisconnect, when set, is called with the error of a lost socket
	// before the Conn reconnects, on the socket's reading goroutine: it
	// must not block or call Close.
	OnDisconnect func(err error)
	// OnReconnect, when set, is called when a new socket is up, before the
	// chat's turns in flight are resumed; it must not block or call Close.
	OnReconnect func()

	// beforeProbe, when set (by this package's tests only), is called on
	// the reconnecting goroutine after the resume has taken stock of the
	// turns in flight and before it sends its probe: a test orders frames
	// of the socket against that point.
	beforeProbe func()
}

func (r Reconnect) withDefaults() Reconnect {
	if r.MinDelay <= 0 {
		r.MinDelay = time.Second + time.Duration(rand.Int64N(int64(4*time.Second)))
	}
	if r.MaxDelay <= 0 {
		r.MaxDelay = 10 * time.Second
	}
	if r.Growth < 1 {
		r.Growth = 1.3
	}
	if r.ConnectTimeout <= 0 {
		r.ConnectTimeout = 4 * time.Second
	}
	if r.Clock == nil {
		r.Clock = clockwork.NewRealClock()
	}
	return r
}

// delay is the wait before attempt n (from 0).
func (r *Reconnect) delay(n int) time.Duration {
	if n == 0 {
		return 0
	}
	d := float64(r.MinDelay) * math.Pow(r.Growth, float64(n-1))
	return time.Duration(min(d, float64(r.MaxDelay)))
}

// wait waits d on r's clock; it reports false if ctx ended first.
func (r *Reconnect) wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := r.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.Chan():
		return true
	case <-ctx.Done():
		return false
	}
}

// resumeAck is the frame that accepts a stream offer.
type resumeAck struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

// goAck acknowledges the offer of stream id on sk, from a goroutine of its
// own: it is called on the reading goroutine, which must not wait on a
// write.
func (c *Conn) goAck(sk *socket, id string) {
	c.loops.Go(func() {
		_ = c.sendOn(c.ctx, sk, resumeAck{wire.StreamResumeAck, id})
	})
}

// resumeAll picks up the chat turns in flight on the new socket: a turn
// the server offered is acknowledged (its chunks are replayed); a turn
// whose request the server never showed it got is sent again (the same
// request id); the others have finished, or wait in the server's queue, so
// a probe asks: without a turn in progress, or with one that is not this
// client's, each is acknowledged (a finished stream replays to its stored
// outcome); a pending one is acknowledged when the server offers it, and
// one the probe's answer offers is acknowledged, also when its offer on
// connect was (see below).
//
// The server holds a socket out of a stream's live chunks and end from
// each offer it sends (cf_agent_stream_resuming, with or without a probe
// id) until an acknowledgement reaches it after that offer. An offer on
// connect can arrive after the stock-taking below and be acknowledged at
// once (handleFrame): when that acknowledgement reaches the server before
// the probe, the probe's answer offers the stream again and only a second
// acknowledgement lets the stream through. The second one costs a second
// replay, which the Stream applies once (chunks are deduplicated by seq).
func (ch *Chat) resumeAll(ctx context.Context) {
	c := ch.c
	c.mu.Lock()
	sk := c.sock
	c.mu.Unlock()
	if sk == nil {
		return // lost again: the next reconnect resumes
	}
	var acks, unknown []string
	var resend [][]byte
	ch.mu.Lock()
	for id, s := range ch.streams {
		switch {
		case ch.offered[id]:
			acks = append(acks, id)
		case !s.accepted && s.request != nil && s.sentOn != sk:
			resend = append(resend, s.request)
			s.sentOn = sk
		default:
			unknown = append(unknown, id)
		}
	}
	ch.resuming = true
	ch.mu.Unlock()
	for _, id := range acks {
		if c.sendOn(ctx, sk, resumeAck{wire.StreamResumeAck, id}) != nil {
			return
		}
	}
	for _, req := range resend {
		if c.writeOn(ctx, sk, req) != nil {
			return
		}
	}
	if len(unknown) == 0 {
		return
	}
	if h := c.opts.Reconnect.beforeProbe; h != nil {
		h()
	}
	probeID := requestID()
	ans := make(chan probeAnswer, 8)
	ch.mu.Lock()
	ch.probes[probeID] = ans
	ch.mu.Unlock()
	defer func() {
		ch.mu.Lock()
		delete(ch.probes, probeID)
		ch.mu.Unlock()
	}()
	if c.sendOn(ctx, sk, struct {
		Type    string `json:"type"`
		ProbeID string `json:"probeId"`
	}{wire.StreamResumeRequest, probeID}) != nil {
		return
	}
	var a probeAnswer
	select {
	case a = <-ans:
	case <-sk.readDone:
		return
	case <-ctx.Done():
		return
	}
	for _, id := range unknown {
		ch.mu.Lock()
		_, still := ch.streams[id]
		offered := ch.offered[id]
		ch.mu.Unlock()
		reoffered := a.typ == wire.StreamResuming && a.id == id
		if !still || (offered && !reoffered) || (a.typ == wire.StreamPending && a.id == id) {
			continue // ended, acknowledged already, or acknowledged when offered
		}
		if c.sendOn(ctx, sk, resumeAck{wire.StreamResumeAck, id}) != nil {
			return
		}
	}
}
