package chat

import (
	"context"
	"fmt"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// write applies a chunk to the message and sends it to the clients.
func (t *turn) write(ch message.Chunk) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if err := t.ctx.Err(); err != nil {
		return context.Cause(t.ctx)
	}
	switch ch.Type {
	case message.ChunkStart:
		return nil // the framework sent it
	case message.ChunkError:
		t.errText = ch.ErrorText
		return fmt.Errorf("%w: %s", errTurnError, ch.ErrorText)
	case message.ChunkFinish:
		t.finished = true
		ch = t.finishMetadata(ch)
	}
	if err := t.builder.Apply(ch); err != nil {
		return fmt.Errorf("chat: invalid chunk stream: %w", err)
	}
	switch ch.Type {
	case message.ChunkStartStep:
		t.stepOpen = true
	case message.ChunkFinishStep:
		t.stepOpen = false
	}
	t.send(ch)
	return nil
}

// writeLive sends a transient chunk to the connected clients, in stream
// order, without storing it, numbering it or applying it to the message
// (ToolStream.Transient).
func (t *turn) writeLive(ch message.Chunk) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if err := t.ctx.Err(); err != nil {
		return context.Cause(t.ctx)
	}
	t.sendChunk(ch, true)
	return nil
}

// send numbers a chunk and queues it for its commit; the flusher sends it
// to the clients once it is committed (the output gate).
func (t *turn) send(ch message.Chunk) { t.sendChunk(ch, false) }

// sendChunk queues a chunk for the flusher; a live chunk goes out in order
// with the committed ones but is not stored and has no sequence number.
func (t *turn) sendChunk(ch message.Chunk, live bool) {
	c := t.c
	// What json.Marshal writes, without its second pass, in the turn's
	// buffer: the stored and sent body is the one copy.
	t.encMu.Lock()
	enc, err := ch.AppendJSON(t.enc[:0])
	t.enc = enc
	body := string(enc)
	t.encMu.Unlock()
	if err != nil {
		c.log.Error("chat: encode chunk", "err", err)
		return
	}
	c.mu.Lock()
	sc := storedChunk{Seq: -1, Body: body, Live: true}
	if !live {
		sc = storedChunk{Seq: t.nextSeq, Body: body, Work: t.credit(ch.Type)}
		t.nextSeq++
	}
	t.unflushed = append(t.unflushed, sc)
	full := len(t.unflushed) >= c.cfg.FlushChunks
	start := !t.flushing
	t.flushing = true
	c.mu.Unlock()
	if start {
		c.rt.Go(func(ctx context.Context) { t.flushLoop(ctx) })
	} else if full {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// flushLoop commits the waiting chunks, batch after batch, until none wait.
// A batch goes at once when the stream's last commit is at least one
// batching window old (the first chunk of a quiet stream), else when the
// window since that commit ends or FlushChunks chunks wait: a stream
// writes at most one transaction per window, however fast or slowly its
// chunks come.
func (t *turn) flushLoop(ctx context.Context) {
	c := t.c
	for {
		c.mu.Lock()
		n := len(t.unflushed)
		last := t.lastCommit
		if n == 0 {
			t.flushing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		// A latency window, not a durable deadline: real time.
		if wait := time.Until(last.Add(c.cfg.FlushInterval)); wait > 0 && n < c.cfg.FlushChunks {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-t.kick:
			case <-ctx.Done():
			}
			timer.Stop()
		}
		if err := t.commit(ctx, nil); err != nil {
			t.failStorage(err)
			if ctx.Err() != nil {
				c.mu.Lock()
				t.flushing = false
				c.mu.Unlock()
				return
			}
		}
	}
}

// failStorage ends a turn whose chunks could not be committed: they never
// reached a client, and the turn cannot go on without them.
func (t *turn) failStorage(err error) {
	if t.c.rt.Context().Err() != nil {
		return // shutting down: the turn recovers from what was committed
	}
	t.c.log.Error("chat: persist chunks", "stream", t.row.ID, "err", err)
	t.cancel(fmt.Errorf("chat: persist chunks: %w", err))
}

// commit writes the waiting chunks (at most FlushChunks of them, unless
// extra is given) together with extra's writes in one transaction, then
// sends them to the clients and followers. A stream deleted by a clear
// gets nothing written and sends nothing; commit reports that with
// gone.
func (t *turn) commit(ctx context.Context, extra func(tx store.Tx) error) error {
	_, err := t.commitGone(ctx, extra)
	return err
}

func (t *turn) commitGone(ctx context.Context, extra func(tx store.Tx) error) (gone bool, err error) {
	c := t.c
	t.commitMu.Lock()
	defer t.commitMu.Unlock()
	c.mu.Lock()
	batch := t.unflushed
	if extra == nil && len(batch) > c.cfg.FlushChunks {
		batch = batch[:c.cfg.FlushChunks:c.cfg.FlushChunks]
	}
	t.unflushed = t.unflushed[len(batch):]
	c.mu.Unlock()
	if len(batch) == 0 && extra == nil {
		return false, nil
	}
	c.mu.Lock()
	t.lastCommit = time.Now()
	c.mu.Unlock()
	if t.unmarked {
		// The turn's first commit: its start chunk, which its clients
		// wait on, goes before the chunks of the streams already flowing.
		ctx = store.WithUrgent(ctx)
	}
	err = c.b.DB().Update(ctx, func(tx store.Tx) error {
		ok, err := insertChunks(ctx, tx, c.iid, t.row.ID, persisted(batch))
		if err != nil || !ok {
			gone = !ok
			return err
		}
		if t.unmarked {
			if err := markStreaming(ctx, tx, c.iid, t.row.ID); err != nil {
				return err
			}
		}
		if extra != nil {
			return extra(tx)
		}
		return nil
	})
	if err != nil || gone {
		return gone, err
	}
	t.unmarked = false
	t.publish(batch)
	return false, nil
}

// markStreaming records that a turn runs (once more).
func markStreaming(ctx context.Context, tx store.Tx, iid int64, id string) error {
	_, err := tx.Exec(ctx, `UPDATE chat_streams SET status = ?, attempts = attempts + 1 WHERE instance_id = ? AND id = ?`,
		statusStreaming, iid, id)
	return err
}

// publish sends committed chunks to the connections that are not waiting
// for a resume and to the stream's followers, in order.
func (t *turn) publish(batch []storedChunk) {
	if len(batch) == 0 {
		return
	}
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != t.gen {
		// Cleared after this batch committed: the clients were told to
		// forget the transcript; nothing of it is sent after that.
		return
	}
	for _, sc := range batch {
		if !sc.Live {
			t.chunks = append(t.chunks, sc)
		}
	}
	var targets []*agent.Conn
	for conn := range c.admitted {
		if _, waiting := c.pending[conn]; waiting {
			continue
		}
		if !t.started && c.awaiting[conn] {
			// Offered the stream below (startedLocked): its replay has
			// this batch; sent live too, it would get it twice.
			continue
		}
		targets = append(targets, conn)
	}
	for _, sc := range batch {
		// Without a connection to take it live (a child's stream, which
		// its parent follows), a chunk's frame is not encoded.
		if len(targets) > 0 {
			f := wire.ChatResponseFrame{Type: wire.ChatResponse, ID: t.row.ID, Body: sc.Body, Continuation: t.row.Continuation}
			seq := sc.Seq
			if !sc.Live {
				f.Seq = &seq
			}
			frame := encodeResponse(f)
			for _, conn := range targets {
				conn.SendRaw(frame)
			}
		}
		if sc.Live {
			continue
		}
		for f := range c.follow[t.row.ID] {
			f.fn(sc.Seq, sc.Body)
		}
	}
	t.startedLocked()
}

// startedLocked records that the turn's stream has begun for clients: the
// connections that probed before (told "pending") get their offer now. c.mu
// held.
func (t *turn) startedLocked() {
	if t.started {
		return
	}
	c := t.c
	t.started = true
	offer := encode(wire.StreamFrame{Type: wire.StreamResuming, ID: t.row.ID})
	for conn := range c.awaiting {
		c.pending[conn] = t.row.ID
		conn.SendRaw(offer)
	}
	clear(c.awaiting)
}
