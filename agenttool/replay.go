package agenttool

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// LayerConnect replays the whole registry to a new connection: for each run
// in start order, started, the child's stored chunks and, for a finished
// run, its terminal event, all with replay:true and the same sequence
// numbers as live. Live events that arrive meanwhile are held back and sent
// after the replay, so the connection sees every frame once and in order.
func (h *host) LayerConnect(ctx context.Context, conn *agent.Conn) {
	h.mu.Lock()
	h.admitted[conn] = true
	none := h.hasRuns == 0
	if !none {
		buf := []pendingFrame{}
		h.replaying[conn] = &buf
	}
	h.mu.Unlock()
	if none {
		return
	}
	sent, active := h.replay(ctx, conn)
	h.mu.Lock()
	defer h.mu.Unlock()
	buf, ok := h.replaying[conn]
	delete(h.replaying, conn)
	if !ok {
		return
	}
	// The replay read the chunks of runs in flight as stored, which can
	// be ahead of what the parent has forwarded so far: live
	// frames up to the replayed sequence are dropped for this connection
	// until the forwarder passes it.
	// So are the frames of a run awaited here whose end is stored but
	// not yet broadcast (a child's end writes its parent's terminal row,
	// and the parent sends the terminal event after it), and of a run
	// being finished here (its row is written, then broadcast).
	marks := map[string]int64{}
	for id, hw := range sent {
		if active[id] || h.live[id] != nil || h.finishing[id] > 0 {
			marks[id] = hw
		}
	}
	for _, f := range *buf {
		if max, replayed := sent[f.runID]; replayed && f.seq <= max {
			continue
		}
		delete(marks, f.runID)
		conn.SendRaw(f.frame)
	}
	if len(marks) > 0 {
		h.replayed[conn] = marks
	}
}

// replay sends the registry to conn and returns the highest sequence sent
// per run, and the runs that were in flight.
//
// The runs and their stored chunks are read in one snapshot (a terminal
// written in between would renumber the chunks stored after its mark),
// and each run is sent as soon as its chunks have been read, so the
// client parses the first runs while the later ones are still read. The
// first replayFirst runs are read and sent before the others are read at
// all: a registry of a thousand runs takes milliseconds to read, which
// the client would otherwise spend waiting for its first frame.
func (h *host) replay(ctx context.Context, conn *agent.Conn) (map[string]int64, map[string]bool) {
	sent := map[string]int64{}
	active := map[string]bool{}
	var listed int
	err := h.rt.DB().View(ctx, func(tx store.Tx) error {
		// What runs on other nodes wait for, read before their chunks and
		// again after them (remoteWaits).
		var before map[string]childWait
		if h.opts.Remote != nil && h.rt.Placement() != nil {
			var err error
			if before, err = h.childWaits(ctx, tx); err != nil {
				return err
			}
		}
		var later []laterWait
		send := func(runs []runRow, groups *chunkReader, skip map[string]bool) error {
			defer groups.close()
			// The chunks come grouped by child, in the children's order,
			// which is nearly the runs' start order: a group read ahead of
			// its run waits here.
			ahead := map[string][]chunk{}
			for _, r := range runs {
				chunks, ok := ahead[r.RunID]
				delete(ahead, r.RunID)
				for !ok {
					run, list, more := groups.next()
					if !more {
						break
					}
					switch {
					case run == r.RunID:
						chunks, ok = list, true
					case !skip[run]:
						ahead[run] = list
					}
				}
				if lw, ok := h.replayRun(conn, r, chunks, sent, active); ok && len(before) > 0 {
					later = append(later, lw)
				}
			}
			return groups.err()
		}
		first, err := h.replayRuns(ctx, tx, nil, replayFirst)
		if err != nil {
			return err
		}
		listed = len(first)
		if len(first) == 0 {
			return nil
		}
		groups, err := h.chunkGroups(ctx, tx, first)
		if err != nil {
			return err
		}
		if err := send(first, groups, nil); err != nil {
			return err
		}
		if len(first) == replayFirst {
			rest, err := h.replayRuns(ctx, tx, &first[len(first)-1], 0)
			if err != nil {
				return err
			}
			listed += len(rest)
			if len(rest) > 0 {
				if groups, err = h.chunkGroups(ctx, tx, nil); err != nil {
					return err
				}
				sentFirst := make(map[string]bool, len(first))
				for _, r := range first {
					sentFirst[r.RunID] = true
				}
				if err := send(rest, groups, sentFirst); err != nil {
					return err
				}
			}
		}
		return h.replayRemoteWaits(ctx, tx, conn, before, later, sent)
	})
	if err != nil {
		h.b.Logger().Error("agenttool: replay", "err", err)
	}
	h.mu.Lock()
	switch {
	case listed > 0:
		h.hasRuns = 1
	case err == nil && h.hasRuns == -1:
		// None when listed; a run recorded since (hasRuns = 1) must not
		// be forgotten, or a later connection would skip its replay and
		// miss a started event broadcast before it was admitted.
		h.hasRuns = 0
	}
	h.mu.Unlock()
	return sent, active
}

// replayFirst is how many runs a connect replay sends before it reads the
// rest of the registry.
const replayFirst = 32

// replayCols are the registry columns a replay sends (replayRuns).
const replayCols = `run_id, parent_tool_call_id, agent_type, input_preview, status, summary, error_message,
	interrupted_reason, child_still_running, display_metadata, display_order, started_at, terminal_marks`

// replayRuns reads the runs in start order, after the run after (all from
// the first with nil), at most limit of them (0: no limit), with only
// what a replay sends of each: not their outputs, usage, budgets or
// detached settings.
func (h *host) replayRuns(ctx context.Context, tx store.Tx, after *runRow, limit int) ([]runRow, error) {
	q := `SELECT ` + replayCols + ` FROM agent_tool_runs WHERE instance_id = ?`
	args := []any{h.iid}
	if after != nil {
		at := after.StartedAt.UnixMilli()
		q += ` AND (started_at > ? OR (started_at = ? AND run_id > ?))`
		args = append(args, at, at, after.RunID)
	}
	q += ` ORDER BY started_at, run_id`
	if limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, limit)
	}
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("agenttool: read the registry: %w", err)
	}
	defer rows.Close()
	var out []runRow
	for rows.Next() {
		var r runRow
		var c sentCols
		if err := rows.Scan(&r.RunID, &c.ptc, &r.AgentType, &c.preview, &r.Status, &c.summary, &c.errMsg,
			&c.reason, &c.still, &c.display, &r.DisplayOrder, &c.started, &c.marks); err != nil {
			return nil, fmt.Errorf("agenttool: read the registry: %w", err)
		}
		c.fill(&r)
		out = append(out, r)
	}
	return out, rows.Err()
}

// replayRun sends one run: started, its stored chunks and, for a finished
// run, its terminal event.
//
// A run whose child is on another node is not told waiting here: it is
// returned, with the position its wait would take, for replayRemoteWaits.
func (h *host) replayRun(conn *agent.Conn, r runRow, chunks []chunk, sent map[string]int64, active map[string]bool) (laterWait, bool) {
	send := func(seq int64, ev Event) {
		frame, err := encodeFrame(Frame{Type: wire.AgentToolEvent, ParentToolCallID: r.ParentToolCallID, Sequence: seq, Replay: true, Event: ev})
		if err == nil {
			conn.SendRaw(frame)
			sent[r.RunID] = max(sent[r.RunID], seq)
		}
	}
	order := r.DisplayOrder
	send(0, Event{Kind: "started", RunID: r.RunID, AgentType: r.AgentType, InputPreview: r.InputPreview, Order: &order, Display: r.Display})
	var waiting []chat.WaitingCall
	remote := r.Status.Active() && h.remote(h.b.Path().Child(r.AgentType, r.RunID)) != nil
	if r.Status.Active() {
		if !remote {
			waiting = h.residentWaiting(r)
		}
		active[r.RunID] = true
	}
	for _, c := range compact(chunks) {
		send(eventSeq(c.seq, r.marks), Event{Kind: "chunk", RunID: r.RunID, Body: c.body})
	}
	at := 0
	if n := len(chunks); n > 0 {
		at = chunks[n-1].seq + 1
	}
	if len(waiting) > 0 {
		// A run that waits for input says so, as live (waiting.go).
		send(eventSeq(at, r.marks), Event{Kind: "chunk", RunID: r.RunID, Body: waitingProgress(at, waiting)})
	}
	if !r.Status.Active() && len(r.marks) > 0 {
		send(terminalSeq(r.marks), terminalEvent(r.Result()))
	}
	return laterWait{r: r, at: at}, remote
}

// laterWait is a replayed run whose child is on another node, and the
// position its wait for input would take.
type laterWait struct {
	r  runRow
	at int
}

// childWait is a child's record of a run that waits for input: its turn
// and what it waits for.
type childWait struct {
	streamID string
	waiting  []chat.WaitingCall
}

// childWaits reads the runs of this parent's children that wait for
// input, by run id, from their records (which a child on another node
// writes, recordWait).
func (h *host) childWaits(ctx context.Context, tx store.Tx) (map[string]childWait, error) {
	rows, err := tx.Query(ctx, `SELECT c.run_id, COALESCE(c.request_id, ''), c.waiting_json
		FROM instances i JOIN agent_tool_child_runs c ON c.instance_id = i.id AND i.name = c.run_id
		WHERE i.parent_id = ? AND c.waiting_json IS NOT NULL AND c.completed_at IS NULL`, h.iid)
	if err != nil {
		return nil, fmt.Errorf("agenttool: read children's waits: %w", err)
	}
	defer rows.Close()
	out := map[string]childWait{}
	for rows.Next() {
		var runID, raw string
		var w childWait
		if err := rows.Scan(&runID, &w.streamID, &raw); err != nil {
			return nil, fmt.Errorf("agenttool: read children's waits: %w", err)
		}
		if json.Unmarshal([]byte(raw), &w.waiting) == nil && len(w.waiting) > 0 {
			out[runID] = w
		}
	}
	return out, rows.Err()
}

// replayRemoteWaits tells conn which replayed runs on other nodes wait for
// input. The children's records were read before the replay's chunks
// (before) and are read again now: a wait is told only when both reads
// find it on the same turn, so the chunks read in between are that
// turn's, complete (the turn's end commits before its wait is recorded),
// and nothing of a continuation. A wait that began or ended in between is
// told by the live follower.
func (h *host) replayRemoteWaits(ctx context.Context, tx store.Tx, conn *agent.Conn, before map[string]childWait, later []laterWait, sent map[string]int64) error {
	if len(later) == 0 {
		return nil
	}
	now, err := h.childWaits(ctx, tx)
	if err != nil {
		return err
	}
	for _, lw := range later {
		b, ok := before[lw.r.RunID]
		n, still := now[lw.r.RunID]
		if !ok || !still || b.streamID != n.streamID {
			continue
		}
		seq := eventSeq(lw.at, lw.r.marks)
		frame, err := encodeFrame(Frame{Type: wire.AgentToolEvent, ParentToolCallID: lw.r.ParentToolCallID, Sequence: seq, Replay: true,
			Event: Event{Kind: "chunk", RunID: lw.r.RunID, Body: waitingProgress(lw.at, n.waiting)}})
		if err == nil {
			conn.SendRaw(frame)
			sent[lw.r.RunID] = max(sent[lw.r.RunID], seq)
		}
	}
	return nil
}

type chunk struct {
	seq  int
	body string
}

// chunkGroups reads the stored stream chunks of every child run of this
// parent in one query, run by run.
func (h *host) chunkGroups(ctx context.Context, tx store.Tx, runs []runRow) (*chunkReader, error) {
	q, args := chunkGroupsQuery, []any{h.iid}
	if runs != nil {
		// These runs' children only, found by their paths (unique, so
		// indexed): not every child of the parent.
		var b strings.Builder
		for i, r := range runs {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("?")
			args = append(args, h.b.Path().Child(r.AgentType, r.RunID).String())
		}
		q = chunkGroupsOfQuery + `(` + b.String() + `)`
	}
	// Without an ORDER BY (which made SQLite sort every chunk of every
	// run in a temporary B-tree), the rows come in the primary key's
	// order, child by child.
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("agenttool: read the runs' chunks: %w", err)
	}
	return &chunkReader{rows: rows}, nil
}

// childChunksFrom and childChunksOn join a child's record of a run (c, in
// agent_tool_child_runs) to the chunks (ch) of the run's stream: its
// turn's, and those of the continuations that its waits for input led to
// (they write the same message and continue its sequence).
//
// CROSS JOIN fixes SQLite's join order to the one written: the child's
// streams, then each stream's chunks by the chunks' primary key. Left to
// itself, SQLite read every chunk of the child and looked its stream up
// for each, one index search per chunk (twice the time for a replay of
// 1,000 runs). PostgreSQL plans a CROSS JOIN with these conditions as the
// inner join it is.
const (
	childChunksFrom = `agent_tool_child_runs c
		CROSS JOIN chat_streams s0
		CROSS JOIN chat_streams s
		CROSS JOIN chat_chunks ch`
	childChunksOn = `s0.instance_id = c.instance_id AND s0.id = c.request_id
		AND s.instance_id = c.instance_id AND s.message_id = s0.message_id AND s.retain = 1
		AND ch.instance_id = c.instance_id AND ch.stream_id = s.id`
)

// chunkGroupsQuery reads the chunks of every child run of the parent whose
// instance id it is given; chunkGroupsOfQuery, followed by a list of
// paths in parentheses, those of the children with these paths.
const (
	chunkGroupsQuery = `SELECT c.run_id, ch.seq, ch.body
		FROM instances i CROSS JOIN ` + childChunksFrom + `
		WHERE i.parent_id = ? AND c.instance_id = i.id AND c.run_id = i.name AND ` + childChunksOn
	chunkGroupsOfQuery = `SELECT c.run_id, ch.seq, ch.body
		FROM instances i CROSS JOIN ` + childChunksFrom + `
		WHERE i.parent_id = ? AND c.instance_id = i.id AND c.run_id = i.name AND ` + childChunksOn + `
		AND i.path IN `
)

// chunkReader hands out the rows of chunkGroups one run at a time.
type chunkReader struct {
	rows    *sql.Rows
	pending *runChunk // the first row of the next run, read ahead
	failed  error
	done    bool
}

type runChunk struct {
	run string
	c   chunk
}

// next returns the next run's chunks in sequence order; more is false
// once every row was read.
func (r *chunkReader) next() (run string, list []chunk, more bool) {
	if r.pending != nil {
		run, list = r.pending.run, []chunk{r.pending.c}
		r.pending = nil
	}
	for !r.done && r.rows.Next() {
		var id string
		var c chunk
		if err := r.rows.Scan(&id, &c.seq, &c.body); err != nil {
			r.failed, r.done = err, true
			break
		}
		if list != nil && id != run {
			r.pending = &runChunk{id, c}
			break
		}
		run = id
		list = append(list, c)
	}
	if r.pending == nil && !r.done {
		r.done = true
		r.failed = r.rows.Err()
	}
	if list == nil {
		return "", nil, false
	}
	if !slices.IsSortedFunc(list, byChunkSeq) {
		slices.SortFunc(list, byChunkSeq)
	}
	return run, list, true
}

func (r *chunkReader) err() error { return r.failed }

func (r *chunkReader) close() { r.rows.Close() }

func byChunkSeq(a, b chunk) int { return cmp.Compare(a.seq, b.seq) }

// residentWaiting returns what a run in flight waits for, if it waits,
// from its child if that is in memory (a child waiting for input stays
// resident). A replay does not wake children: their committed chunks are
// all in the snapshot it read, and one whose hydration is slow must not
// hold up the connection.
func (h *host) residentWaiting(r runRow) []chat.WaitingCall {
	child, ok := h.rt.Lookup(h.b.Path().Child(r.AgentType, r.RunID))
	if !ok {
		return nil
	}
	ch, err := hostOf(child)
	if err != nil {
		return nil
	}
	return ch.waitingOf(r.RunID)
}

// compact drops what a replay does not need: the progress snapshots but
// the latest of a run (milestones and content are all kept), and the
// message-metadata chunks whose every field a later message-metadata or
// finish chunk of the run sets again (a client merges metadata deeply, so
// the message ends with the same metadata without them: the usage a turn
// streams after each step is superseded by its finish).
func compact(chunks []chunk) []chunk {
	last := -1
	meta := false
	for i, c := range chunks {
		switch {
		case isProgress(c.body):
			last = i
		case isMetadata(c.body):
			meta = true
		}
	}
	if last < 0 && !meta {
		return chunks
	}
	var drop map[int]bool
	if meta {
		drop = supersededMetadata(chunks)
	}
	out := make([]chunk, 0, len(chunks))
	for i, c := range chunks {
		if (isProgress(c.body) && i != last) || drop[i] {
			continue
		}
		out = append(out, c)
	}
	return out
}

func isProgress(body string) bool {
	return strings.HasPrefix(body, `{"type":"data-agent-progress"`)
}

func isMetadata(body string) bool {
	return strings.HasPrefix(body, `{"type":"message-metadata"`)
}

// supersededMetadata returns the positions of the message-metadata chunks
// that later metadata covers. It walks back from the end, holding the
// union of the metadata seen so far.
func supersededMetadata(chunks []chunk) map[int]bool {
	var later coverage
	var drop map[int]bool
	for i := len(chunks) - 1; i >= 0; i-- {
		body := chunks[i].body
		if !isMetadata(body) && !strings.HasPrefix(body, `{"type":"finish"`) {
			continue
		}
		var ch struct {
			Type            string          `json:"type"`
			MessageMetadata json.RawMessage `json:"messageMetadata"`
		}
		if json.Unmarshal([]byte(body), &ch) != nil || len(ch.MessageMetadata) == 0 {
			continue
		}
		var md any
		if json.Unmarshal(ch.MessageMetadata, &md) != nil {
			continue
		}
		if ch.Type == "message-metadata" && later.covers(md) {
			if drop == nil {
				drop = map[int]bool{}
			}
			drop[i] = true
			continue
		}
		later = later.add(md)
	}
	return drop
}

// coverage is the union of the metadata objects that come later in a
// stream: for each field, nil if some later chunk sets it to a value that
// is not an object (that value wins, whatever came before), or the
// coverage of its fields if every later chunk that sets it sets an object
// (merged field by field).
type coverage map[string]coverage

// covers reports whether a deep merge of the later metadata over md
// leaves no field of md visible: every field of md is set again later.
func (c coverage) covers(md any) bool {
	obj, ok := md.(map[string]any)
	if !ok {
		return false // not an object: the client merges nothing from it
	}
	for k, v := range obj {
		sub, set := c[k]
		if !set {
			return false
		}
		if sub == nil {
			continue // replaced outright later
		}
		if _, isObj := v.(map[string]any); !isObj {
			// Set later to an object only: this value resets what came
			// before it, which the later object would merge into.
			return false
		}
		if !sub.covers(v) {
			return false
		}
	}
	return true
}

// add returns c with md's fields added (md is earlier than what c holds,
// so where c replaces a field outright it stays so).
func (c coverage) add(md any) coverage {
	obj, ok := md.(map[string]any)
	if !ok {
		return c
	}
	if c == nil {
		c = coverage{}
	}
	for k, v := range obj {
		sub, set := c[k]
		switch {
		case set && sub == nil:
			// replaced outright by a later chunk
		case set:
			if inner, isObj := v.(map[string]any); isObj {
				c[k] = sub.add(inner)
			}
		default:
			if inner, isObj := v.(map[string]any); isObj {
				c[k] = coverage{}.add(inner)
			} else {
				c[k] = nil // replaced outright: covers whatever came before
			}
		}
	}
	return c
}
