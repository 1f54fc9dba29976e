package chat

import (
	"context"
	"fmt"
	"hash/maphash"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/store"
)

// storedTranscript mirrors an instance's stored transcript: each stored
// message's position and a hash of its stored body, by id. A client's chat
// request carries the whole chat; comparing it with the mirror, instead of
// with the rows, reads nothing from the store per turn, however long the
// chat.
//
// It is guarded by the core's acceptMu, which every change to the
// transcript holds from its comparison to its commit. It is brought up to
// date after each commit that writes messages (wrote), and lost after a
// write whose outcome is not known (lose): the next comparison reads the
// rows again (load). An instance that hydrates from the store starts with
// it lost; a new one starts with it empty.
//
// The hash is maphash's 64 bits under a seed of the mirror's own: a
// changed message whose body hashed as the stored one's would not be
// written, a chance of one in 2^64 per message compared, which no client
// can aim at without the seed.
type storedTranscript struct {
	seed  maphash.Seed
	known bool
	rows  map[string]storedRow
}

// storedRow is a stored message's position and the hash of its body.
type storedRow struct {
	pos int
	sum uint64
}

func newStoredTranscript(known bool) storedTranscript {
	return storedTranscript{seed: maphash.MakeSeed(), known: known, rows: map[string]storedRow{}}
}

func (s *storedTranscript) sum(body string) uint64 { return maphash.String(s.seed, body) }

// lose forgets the mirror: a write's outcome is not known.
func (s *storedTranscript) lose() {
	s.known = false
	clear(s.rows)
}

// cleared records that the transcript was deleted.
func (s *storedTranscript) cleared() {
	s.known = true
	clear(s.rows)
}

// wrote records a committed plan (or, err non-nil, loses the mirror).
func (s *storedTranscript) wrote(p transcriptPlan, err error) {
	if err != nil || !s.known {
		s.lose()
		return
	}
	for _, w := range p.writes {
		s.rows[w.m.ID] = storedRow{pos: w.pos, sum: s.sum(w.body)}
	}
	for _, id := range p.deletes {
		delete(s.rows, id)
	}
}

// load reads the stored rows into the mirror unless it is known.
func (s *storedTranscript) load(ctx context.Context, tx store.Tx, iid int64) error {
	if s.known {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT id, position, body FROM chat_messages WHERE instance_id = ?`, iid)
	if err != nil {
		return err
	}
	defer rows.Close()
	clear(s.rows)
	for rows.Next() {
		var id, body string
		var pos int
		if err := rows.Scan(&id, &pos, &body); err != nil {
			return err
		}
		s.rows[id] = storedRow{pos: pos, sum: s.sum(body)}
	}
	if err := rows.Err(); err != nil {
		clear(s.rows)
		return err
	}
	s.known = true
	return nil
}

// diff plans what makes the stored transcript exactly msgs (a message
// whose id repeats is stored once, as its last occurrence): a message
// stored under its id at its position with the same body is left alone,
// any other is written, and a stored message msgs does not hold is
// deleted. The mirror must be known; diff does not change it.
func (s *storedTranscript) diff(msgs []message.Message) (transcriptPlan, error) {
	var p transcriptPlan
	var buf []byte
	seen := make(map[string]struct{}, len(msgs))
	matched := 0 // distinct ids of msgs that are stored
	for i := range msgs {
		m := &msgs[i]
		var err error
		if buf, err = m.AppendJSON(buf[:0]); err != nil {
			return p, fmt.Errorf("encode message %s: %w", m.ID, err)
		}
		_, repeated := seen[m.ID]
		seen[m.ID] = struct{}{}
		r, stored := s.rows[m.ID]
		if stored && !repeated {
			matched++
			if r.pos == i && r.sum == maphash.Bytes(s.seed, buf) { // as sum(string(buf)), without the copy
				continue
			}
		}
		// A repeated id is written the second time: the last occurrence
		// is the one that stays.
		p.writes = append(p.writes, plannedMessage{pos: i, m: m, body: string(buf)})
	}
	if matched < len(s.rows) {
		for id := range s.rows {
			if _, ok := seen[id]; !ok {
				p.deletes = append(p.deletes, id)
			}
		}
	}
	return p, nil
}

// plan reads the mirror if it is lost (in a read transaction of its own)
// and plans msgs against it. The caller holds acceptMu until it records
// the plan's write (wrote).
func (s *storedTranscript) plan(ctx context.Context, db store.DB, iid int64, msgs []message.Message) (transcriptPlan, error) {
	if !s.known {
		if err := db.View(ctx, func(tx store.Tx) error { return s.load(ctx, tx, iid) }); err != nil {
			return transcriptPlan{}, fmt.Errorf("read stored transcript: %w", err)
		}
	}
	return s.diff(msgs)
}

// encodeMessages plans the writes of msgs at the positions from first on.
func encodeMessages(first int, msgs []message.Message) (transcriptPlan, error) {
	p := transcriptPlan{writes: make([]plannedMessage, 0, len(msgs))}
	for i := range msgs {
		m := &msgs[i]
		body, err := m.MarshalJSON() // what json.Marshal writes, without its second pass
		if err != nil {
			return transcriptPlan{}, fmt.Errorf("encode message %s: %w", m.ID, err)
		}
		p.writes = append(p.writes, plannedMessage{pos: first + i, m: m, body: string(body)})
	}
	return p, nil
}
