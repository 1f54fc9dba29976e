package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/client/agenttools"
	"github.com/agentry/agentry/wire"
)

// screen renders a chat session: the assistant's text as it streams, a
// line per helper run event (with the progress line redrawn in place on a
// terminal), notices of background runs and the end of every turn. Its
// methods are safe for concurrent use; frames are handled by one goroutine.
type screen struct {
	tty bool
	tr  *agenttools.Tracker // fed by handle, on the rendering goroutine

	mu       sync.Mutex
	w        io.Writer
	werr     error  // the first write error; later writes are dropped
	midLine  bool   // the cursor is not at the start of a line
	live     string // the run whose progress line is the open line (terminal only)
	textTurn string // the turn whose text the current line holds
	runs     map[string]*runView
	nruns    int // runs announced so far; numbers them
	turns    map[string]*turnView
	notices  map[string]bool
	gone     bool // the connection ended
}

// runView is what the screen has shown of a run.
type runView struct {
	announced  bool             // the started line was printed
	label      string           // "[n] Name"
	milestones int              // milestones shown (or known from a replay)
	progress   string           // progressKey of the progress shown
	status     agenttool.Status // status shown
	frac       *float64         // latest fraction reported
}

// turnView is the screen's record of a chat turn.
type turnView struct {
	errText string
	texted  bool   // some of its text was shown
	pending string // text not shown yet: the unfinished line (not a terminal)
	done    chan struct{}
	ended   bool
	seqSeen bool // a chunk with a seq was shown; lastSeq is the latest
	lastSeq int
}

// newScreen returns a screen writing to w; tty enables in-place redraws.
func newScreen(w io.Writer, tty bool, tr *agenttools.Tracker) *screen {
	return &screen{w: w, tty: tty, tr: tr, runs: map[string]*runView{}, turns: map[string]*turnView{}, notices: map[string]bool{}}
}

// write writes s; the caller holds mu.
func (s *screen) write(str string) {
	if s.werr != nil || str == "" {
		return
	}
	if _, err := io.WriteString(s.w, str); err != nil {
		s.werr = err
		return
	}
	s.midLine = !strings.HasSuffix(str, "\n")
}

// newline ends the current line if the cursor is not at its start; the
// caller holds mu.
func (s *screen) newline() {
	if s.midLine {
		s.write("\n")
	}
	s.live, s.textTurn = "", ""
}

// line prints str on a line of its own.
func (s *screen) line(str string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lineLocked(str)
}

func (s *screen) lineLocked(str string) {
	s.newline()
	s.write(str + "\n")
}

// runLine prints the progress or final line of a run. On a terminal it
// replaces the run's progress line if that is the current line; a progress
// line stays open so that the next one can replace it.
func (s *screen) runLine(runID, str string, final bool) {
	if !s.tty {
		s.lineLocked(str)
		return
	}
	if s.live == runID && s.midLine {
		s.write("\r\x1b[K")
	} else {
		s.newline()
	}
	if final {
		s.write(str + "\n")
		s.live = ""
		return
	}
	s.write(str)
	s.live = runID
}

// end finishes the output: the cursor is left at the start of a line.
func (s *screen) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.newline()
}

// lost records that the connection ended: turns still waiting are
// released.
func (s *screen) lost() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone = true
	for _, t := range s.turns {
		if !t.ended {
			t.ended = true
			close(t.done)
		}
	}
}

// turnDone returns a channel closed once the turn id has ended and its end
// was rendered (or the connection ended).
func (s *screen) turnDone(id string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.turn(id)
	if s.gone && !t.ended {
		t.ended = true
		close(t.done)
	}
	return t.done
}

// turn returns the record of turn id; the caller holds mu.
func (s *screen) turn(id string) *turnView {
	t := s.turns[id]
	if t == nil {
		t = &turnView{done: make(chan struct{})}
		s.turns[id] = t
	}
	return t
}

// seenNotices marks the notices in msgs as shown.
func (s *screen) seenNotices(msgs []message.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		s.notices[m.ID] = true
	}
}

// handle renders one frame from the server.
func (s *screen) handle(f client.Frame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch f.Type {
	case wire.AgentToolEvent:
		var af agenttool.Frame
		if json.Unmarshal(f.Data, &af) == nil && s.tr.Apply(af) {
			s.renderRun(af.Event.RunID, af.Replay)
		}
	case wire.ChatResponse:
		var r struct {
			ID      string `json:"id"`
			Body    string `json:"body"`
			Seq     *int   `json:"seq"`
			Done    bool   `json:"done"`
			Error   bool   `json:"error"`
			Outcome string `json:"outcome"`
		}
		if json.Unmarshal(f.Data, &r) != nil || r.ID == "" {
			return
		}
		if r.Seq != nil {
			// A resumed turn replays its chunks from the first: show the
			// ones not shown yet.
			t := s.turn(r.ID)
			if t.seqSeen && *r.Seq <= t.lastSeq {
				return
			}
			t.seqSeen, t.lastSeq = true, *r.Seq
		}
		s.renderChat(r.ID, r.Body, r.Error, r.Done, r.Outcome)
	case frameLost:
		var msg string
		_ = json.Unmarshal(f.Data, &msg)
		s.lineLocked("connection lost (" + msg + "); reconnecting…")
	case frameReconnected:
		s.lineLocked("reconnected")
	case wire.ChatMessages:
		var m struct {
			Messages []message.Message `json:"messages"`
		}
		if json.Unmarshal(f.Data, &m) == nil {
			s.renderNotices(m.Messages)
		}
	}
}

// renderChat renders one chat response frame of turn id.
func (s *screen) renderChat(id, body string, isErr, done bool, outcome string) {
	t := s.turn(id)
	if t.ended {
		return
	}
	switch {
	case isErr:
		t.errText = body
	case body != "":
		var c message.Chunk
		if json.Unmarshal([]byte(body), &c) != nil {
			break
		}
		switch c.Type {
		case message.ChunkTextDelta:
			if !s.tty {
				// Line by line, so that run lines never split the text.
				t.pending += c.Delta
				for {
					l, rest, ok := strings.Cut(t.pending, "\n")
					if !ok {
						break
					}
					s.textLine(t, l)
					t.pending = rest
				}
				break
			}
			if s.textTurn != id {
				// A new answer, or one continued after other lines.
				prefix := "assistant> "
				if t.texted {
					prefix += "…"
				}
				s.newline()
				s.write(prefix)
				s.textTurn, t.texted = id, true
			}
			s.write(c.Delta)
		case message.ChunkToolOutputError:
			s.lineLocked("tool error: " + c.ErrorText)
		case message.ChunkError:
			s.lineLocked("error: " + c.ErrorText)
		}
	}
	if !done {
		return
	}
	if t.pending != "" {
		s.textLine(t, t.pending)
		t.pending = ""
	}
	if s.textTurn == id {
		s.newline()
	}
	if outcome == "" && t.errText != "" {
		outcome = client.OutcomeError
	}
	switch outcome {
	case client.OutcomeAborted:
		s.lineLocked("(turn cancelled)")
	case client.OutcomeError:
		s.lineLocked("error: " + cmp.Or(t.errText, "the turn failed"))
	case client.OutcomeSkipped:
		s.lineLocked("(turn skipped)")
	}
	t.ended = true
	close(t.done)
}

// textLine prints a whole line of t's text; the first is prefixed. The
// caller holds mu.
func (s *screen) textLine(t *turnView, l string) {
	if !t.texted {
		l = "assistant> " + l
		t.texted = true
	}
	s.lineLocked(l)
}

// renderNotices prints the messages background runs added to the chat
// (their metadata names a runId) that were not shown yet.
func (s *screen) renderNotices(msgs []message.Message) {
	for _, m := range msgs {
		if s.notices[m.ID] {
			continue
		}
		s.notices[m.ID] = true
		var meta struct {
			RunID string `json:"runId"`
		}
		if len(m.Metadata) == 0 || json.Unmarshal(m.Metadata, &meta) != nil || meta.RunID == "" {
			continue
		}
		text, _, _ := strings.Cut(strings.TrimSpace(chat.MessageText(m)), "\n")
		s.lineLocked("notice: " + strings.TrimSpace(text))
	}
}

// renderRun shows what changed in a run since it was last shown. A replay
// frame (sent on connect for runs that started earlier) only updates what
// counts as shown, so history is not printed again; the run is announced
// at its first live frame.
func (s *screen) renderRun(id string, replay bool) {
	r := s.tr.State().RunsByID[id]
	if r == nil {
		return
	}
	v := s.runs[id]
	if v == nil {
		v = &runView{}
		s.runs[id] = v
	}
	if r.Progress != nil && r.Progress.Fraction != nil {
		v.frac = r.Progress.Fraction
	}
	if replay && !v.announced {
		v.milestones, v.status, v.progress = len(r.Milestones), r.Status, progressKey(r.Progress)
		return
	}
	if !v.announced {
		v.announced = true
		s.nruns++
		v.label = fmt.Sprintf("[%d] %s", s.nruns, runName(r))
		where := ""
		if r.ParentToolCallID == "" {
			where = " in the background"
		}
		str := fmt.Sprintf("▸ %s started%s · run %s", v.label, where, r.RunID)
		if p := inputPreview(r.InputPreview); p != "" {
			str += " · " + p
		}
		s.lineLocked(str)
	}
	name := v.label
	for _, m := range r.Milestones[min(v.milestones, len(r.Milestones)):] {
		str := fmt.Sprintf("  ◆ %s reached milestone %q", name, m.Name)
		if m.Message != "" {
			str += " · " + m.Message
		}
		s.lineLocked(str)
	}
	v.milestones = len(r.Milestones)
	if r.Status != agenttool.StatusRunning && r.Status != agenttool.StatusStarting {
		if r.Status != v.status {
			v.status = r.Status
			s.runLine(id, finalLine(name, r, v.frac), true)
		}
		return
	}
	v.status = r.Status
	if key := progressKey(r.Progress); r.Progress != nil && key != v.progress && r.Progress.Milestone == "" {
		v.progress = key
		s.runLine(id, "  "+name+" "+progressText(v.frac, r.Progress.Phase, r.Progress.Message), false)
	}
}

// runName is the display name of a run, else its class.
func runName(r *agenttools.Run) string {
	if n, ok := r.Display["name"].(string); ok && n != "" {
		return n
	}
	return r.AgentType
}

// progressKey identifies a progress signal for change detection.
func progressKey(p *agenttools.Progress) string {
	if p == nil {
		return ""
	}
	f := "-"
	if p.Fraction != nil {
		f = fmt.Sprint(*p.Fraction)
	}
	return f + "\x00" + p.Phase + "\x00" + p.Message + "\x00" + p.Milestone
}

// finalLine describes how a run ended.
func finalLine(name string, r *agenttools.Run, frac *float64) string {
	switch r.Status {
	case agenttool.StatusCompleted:
		str := fmt.Sprintf("✓ %s %s completed", name, progressText(ptr(1.0), "", ""))
		if sum := firstLine(r.Summary); sum != "" {
			str += " · " + truncate(sum, 120)
		}
		return str
	case agenttool.StatusInterrupted:
		str := fmt.Sprintf("! %s %s interrupted", name, progressText(frac, "", ""))
		if r.Reason != "" {
			str += " (" + string(r.Reason) + ")"
		}
		if r.Error != "" {
			str += " · " + r.Error
		}
		return str
	default: // error, aborted
		str := fmt.Sprintf("✗ %s %s %s", name, progressText(frac, "", ""), r.Status)
		if r.Error != "" {
			str += " · " + r.Error
		}
		return str
	}
}

// progressText renders a progress bar with its percentage, then the phase
// and message when set: "[######....]  60% reading · Reading 2 sources".
func progressText(frac *float64, phase, msg string) string {
	const width = 10
	var b strings.Builder
	if frac == nil {
		b.WriteString("[" + strings.Repeat(".", width) + "]   ?%")
	} else {
		f := math.Max(0, math.Min(1, *frac))
		n := int(math.Round(f * width))
		fmt.Fprintf(&b, "[%s%s] %3d%%", strings.Repeat("#", n), strings.Repeat(".", width-n), int(math.Round(f*100)))
	}
	if phase != "" {
		b.WriteString(" " + phase)
	}
	if msg != "" {
		b.WriteString(" · " + msg)
	}
	return b.String()
}

// inputPreview renders a run's input preview (JSON, or a string holding
// JSON): the value of a one-field object, else compact JSON.
func inputPreview(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		if !json.Valid([]byte(str)) {
			return truncate(strconv.Quote(str), 80)
		}
		raw = json.RawMessage(str)
	}
	var obj map[string]any
	if json.Unmarshal(raw, &obj) == nil && len(obj) == 1 {
		for _, v := range obj {
			if s, ok := v.(string); ok {
				return truncate(strconv.Quote(s), 80)
			}
		}
	}
	return compactJSON(raw, 80)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(l)
}
