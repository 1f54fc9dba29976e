package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/client"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/internal/proccpu"
	"github.com/agentry/agentry/store/sqlite"
	"github.com/agentry/agentry/wire"
)

// researchTurnsPerInstance is how many turns a user of
// BenchmarkResearchTurn sends to one Assistant before it moves to a new
// one: the transcript grows as it does for a user of bench/load (its
// turns carry, encode and store the whole chat), but not without bound,
// so that an op costs the same at any b.N.
const researchTurnsPerInstance = 8

// BenchmarkResearchTurn measures one awaited research turn through the
// chat path, as a user of bench/load (action "research") makes it: the
// Go client sends "research …" over the WebSocket to the demo's
// Assistant (what `agentry serve` serves, offline models without delay,
// a SQLite file); its model calls the research tool, an awaited
// Researcher child runs web_search (four progress signals) and streams
// its summary in chunks of 8 characters; the Assistant answers from the
// result. The client receives the turn's chunks and the run's
// agent-tool events, and the op ends with the turn's done frame.
//
// One op is one turn. Its allocations (-benchmem) are those of the whole
// process: the server's, and the client's, which is the same code for
// every build. cpu-ms/turn is the process's CPU time (user and system)
// per turn, events/turn the agent-tool events the client received.
// users=N runs N users at once, each on its own instances.
func BenchmarkResearchTurn(b *testing.B) {
	for _, users := range []int{1, 8} {
		b.Run(fmt.Sprintf("users=%d", users), func(b *testing.B) { benchResearchTurn(b, users) })
	}
}

// researchUser is one client of BenchmarkResearchTurn. It keeps the
// terminal agent-tool event of each tool call and only counts the others:
// the client's share of the measured allocations stays small.
type researchUser struct {
	url  string
	id   int
	n    int // turns sent on the current instance
	inst int // instances used
	conn *client.Conn
	wake chan struct{}

	mu     sync.Mutex
	ended  map[string]agenttool.Frame // terminal event by parent tool call
	events int64
}

func (u *researchUser) onFrame(f client.Frame) {
	if f.Type != wire.AgentToolEvent {
		return
	}
	var ev agenttool.Frame
	terminal := !bytes.Contains(f.Data, []byte(`"kind":"started"`)) && !bytes.Contains(f.Data, []byte(`"kind":"chunk"`))
	if terminal {
		if err := json.Unmarshal(f.Data, &ev); err != nil {
			ev.Event.Kind, ev.Event.Error = "undecodable", err.Error()
		}
	}
	u.mu.Lock()
	u.events++
	if terminal {
		u.ended[ev.ParentToolCallID] = ev
	}
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

func (u *researchUser) eventCount() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.events
}

// turn sends one research request and checks its answer: a completed
// turn whose message holds one research call with an output, and whose
// run completed in the agent-tool events.
func (u *researchUser) turn(ctx context.Context) error {
	if u.conn == nil || u.n == researchTurnsPerInstance {
		if u.conn != nil {
			u.conn.Close()
		}
		u.inst++
		u.n = 0
		c, err := client.Dial(ctx, client.Options{BaseURL: u.url, Agent: "Assistant",
			Name: fmt.Sprintf("research-%d-%d", u.id, u.inst), Chat: true, OnFrame: u.onFrame})
		if err != nil {
			return fmt.Errorf("dial: %w", err)
		}
		u.conn = c
	}
	u.n++
	s, err := u.conn.Chat().Send(ctx, fmt.Sprintf("research topic %d of user %d", u.n, u.id))
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	res, err := s.Wait(ctx)
	if err != nil {
		return fmt.Errorf("turn: %w", err)
	}
	if res.Outcome != client.OutcomeCompleted {
		return fmt.Errorf("turn %s ended %s", res.ID, res.Outcome)
	}
	var call string
	for _, p := range res.Message.Parts {
		if p.ToolName() == "research" && p.State == message.StateOutputAvailable {
			call = p.ToolCallID
		}
	}
	if call == "" {
		return fmt.Errorf("turn %s: no research output in %+v", res.ID, res.Message.Parts)
	}
	for {
		u.mu.Lock()
		ev, ok := u.ended[call]
		u.mu.Unlock()
		if ok {
			if ev.Event.Kind != "finished" || ev.Event.Summary == nil || *ev.Event.Summary == "" {
				return fmt.Errorf("run %s of tool call %s ended %s: %s", ev.Event.RunID, call, ev.Event.Kind, ev.Event.Error)
			}
			return nil
		}
		select {
		case <-u.wake:
		case <-u.conn.Done():
			return fmt.Errorf("connection ended: %w", u.conn.Err())
		case <-ctx.Done():
			return fmt.Errorf("run of tool call %s: %w", call, ctx.Err())
		}
	}
}

func benchResearchTurn(b *testing.B, users int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "agentry.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	d, err := demo.Start(ctx, demo.Options{DB: db, Models: agentsastools.Offline(0, nil),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	hs := httptest.NewServer(d.Handler())
	defer hs.Close()
	us := make([]*researchUser, users)
	for i := range us {
		us[i] = &researchUser{url: hs.URL, id: i, wake: make(chan struct{}, 1), ended: map[string]agenttool.Frame{}}
		// Warm up: each user's first turn creates its first instance.
		if err := us[i].turn(ctx); err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		for _, u := range us {
			u.conn.Close()
		}
	}()
	var events int64
	for _, u := range us {
		events -= u.eventCount()
	}
	cpu0, cpuErr := proccpu.Process(os.Getpid(), false)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for _, u := range us {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := u.turn(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	cpu1, err := proccpu.Process(os.Getpid(), false)
	if err == nil && cpuErr == nil {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/turn")
	}
	for _, u := range us {
		events += u.eventCount()
	}
	b.ReportMetric(float64(events)/float64(b.N), "events/turn")
}
