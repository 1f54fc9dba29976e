package main

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/client/agenttools"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

// TestChatResearch asks a research question: the answer streams, and the
// helper run is shown from start to a completed line with a full bar.
func TestChatResearch(t *testing.T) {
	env := startServer(t, nil)
	c := startChat(t, env, false)
	c.say(t, "Research quantum computing")
	c.out.waitFor(t, `^you> Research quantum computing$`)
	c.out.waitFor(t, `^▸ \[1\] Researcher started · run agent-tool:\S+ · "quantum computing"$`)
	c.out.waitAll(t,
		`^  \[1\] Researcher \[##\.+\]  20% searching · Searching for quantum computing$`,
		`^  ◆ \[1\] Researcher reached milestone "sources-gathered"$`)
	c.out.waitFor(t, `^✓ \[1\] Researcher \[##########\] 100% completed · Quantum computing is worth knowing well\.`)
	c.out.waitFor(t, `^assistant> Quantum computing is worth knowing well\.$`)
	c.exit(t)
}

// TestChatClientToolAndApproval: agentry chat answers get_local_time with
// the local time (the model's follow-up uses it), and answers an approval
// with /deny and /approve.
func TestChatClientToolAndApproval(t *testing.T) {
	env := startServer(t, nil)
	c := startChat(t, env, false)
	c.say(t, "what time is it?")
	c.out.waitFor(t, `^\(answering get_local_time: \d\d:\d\d \S+\)$`)
	c.out.waitFor(t, `^assistant> It is \d\d:\d\d where you are \(\S+\)\.$`)
	c.say(t, "delete my helper runs")
	c.out.waitFor(t, `^\(delete_helper_runs waits for your approval: type /approve or /deny\)$`)
	c.say(t, "/deny")
	c.out.waitFor(t, `OK, I left your helper runs alone\.$`)
	c.say(t, "delete my helper runs")
	c.say(t, "/approve")
	c.out.waitFor(t, `I deleted 0 helper runs\.$`)
	c.exit(t)
}

// TestChatBackground dispatches a background run: it is shown as it runs,
// and the notification turn it causes is printed when it arrives.
func TestChatBackground(t *testing.T) {
	env := startServer(t, nil)
	c := startChat(t, env, false)
	c.say(t, "Research solar panels in the background")
	c.out.waitFor(t, `^▸ \[1\] Researcher started in the background · run agent-tool:\S+ · "solar panels"$`)
	c.out.waitFor(t, `^✓ \[1\] Researcher \[##########\] 100% completed`)
	// The notice and the turn it causes may reach the client in either
	// order.
	c.out.waitAll(t,
		`^notice: Background research on "solar panels" finished:$`,
		`^assistant> Your background research on "solar panels" is done\.`)
	all := c.exit(t)
	if !strings.Contains(all, "I started the research in the background") {
		t.Errorf("no dispatch answer:\n%s", all)
	}
}

// TestChatInterrupt cancels a turn with an interrupt, then exits with a
// second one.
func TestChatInterrupt(t *testing.T) {
	clock := clockwork.NewFakeClock()
	slow := agentsastools.Offline(time.Hour, clock)
	fast := agentsastools.Offline(0, nil)
	env := startServer(t, &agentsastools.Models{Assistant: slow.Assistant, Researcher: fast.Researcher, Planner: fast.Planner})
	c := startChat(t, env, true)
	c.say(t, "Research volcanoes")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// The assistant's model has streamed its first event and waits.
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	c.intr <- os.Interrupt
	c.out.waitFor(t, `^cancelling the turn \(Ctrl-C again to exit\)$`)
	c.out.waitFor(t, `^\(turn cancelled\)$`)
	c.intr <- os.Interrupt
	c.wait(t)
}

// TestScreenTTY checks the terminal rendering: a run's progress line is
// redrawn in place and replaced by its final line; text streams as it
// arrives.
func TestScreenTTY(t *testing.T) {
	tr := agenttools.NewTracker(nil)
	var out strings.Builder
	scr := newScreen(&out, true, tr)
	order := 0
	summary := "Done.\nMore."
	feed := func(seq int64, ev agenttool.Event) {
		t.Helper()
		data, err := json.Marshal(agenttool.Frame{Type: wire.AgentToolEvent, ParentToolCallID: "call-1", Sequence: seq, Event: ev})
		if err != nil {
			t.Fatal(err)
		}
		scr.handle(client.Frame{Type: wire.AgentToolEvent, Data: data})
	}
	progress := func(f float64, phase string) string {
		b, _ := json.Marshal(map[string]any{"type": agenttools.ProgressPart, "transient": true,
			"data": map[string]any{"fraction": f, "phase": phase}})
		return string(b)
	}
	feed(0, agenttool.Event{Kind: "started", RunID: "r1", AgentType: "Researcher", Order: &order,
		InputPreview: json.RawMessage(`{"query":"tides"}`)})
	feed(1, agenttool.Event{Kind: "chunk", RunID: "r1", Body: progress(0.2, "searching")})
	feed(2, agenttool.Event{Kind: "chunk", RunID: "r1", Body: progress(0.6, "reading")})
	feed(3, agenttool.Event{Kind: "finished", RunID: "r1", Summary: &summary})
	chunk := func(body string, done bool) {
		t.Helper()
		data, err := json.Marshal(map[string]any{"type": wire.ChatResponse, "id": "turn-1", "body": body, "done": done})
		if err != nil {
			t.Fatal(err)
		}
		scr.handle(client.Frame{Type: wire.ChatResponse, Data: data})
	}
	chunk(`{"type":"text-delta","id":"t","delta":"Tides "}`, false)
	chunk(`{"type":"text-delta","id":"t","delta":"turn."}`, false)
	chunk("", true)
	want := "▸ [1] Researcher started · run r1 · \"tides\"\n" +
		"  [1] Researcher [##........]  20% searching" +
		"\r\x1b[K  [1] Researcher [######....]  60% reading" +
		"\r\x1b[K✓ [1] Researcher [##########] 100% completed · Done.\n" +
		"assistant> Tides turn.\n"
	if got := out.String(); got != want {
		t.Errorf("output\n%q\nwant\n%q", got, want)
	}
}

// TestChatReconnect drops the network while the assistant streams: the
// chat says so, reconnects, and the answer goes on where it was, each line
// shown once.
func TestChatReconnect(t *testing.T) {
	clock := clockwork.NewFakeClock()
	slow := agentsastools.Offline(time.Hour, clock)
	fast := agentsastools.Offline(0, nil)
	env := startServer(t, &agentsastools.Models{Assistant: slow.Assistant, Researcher: fast.Researcher, Planner: fast.Planner})
	p := testenv.StartProxy(t, env.Host)
	c := startChat(t, env, true, "--addr", p.Addr())
	c.out.waitFor(t, `^connected to Assistant`)
	c.say(t, "hello")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// The model has streamed its first chunk and waits.
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	c.out.waitFor(t, `^connection lost \(.*\); reconnecting…$`)
	c.out.waitFor(t, `^reconnected$`)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			bctx, bcancel := context.WithCancel(ctx)
			go func() {
				select {
				case <-stop:
				case <-bctx.Done():
				}
				bcancel()
			}()
			err := clock.BlockUntilContext(bctx, 1)
			bcancel()
			if err != nil {
				return
			}
			clock.Advance(time.Hour)
		}
	}()
	lines := strings.Split(agentsastools.HelpText, "\n")
	c.out.waitFor(t, `^assistant> `+regexp.QuoteMeta(lines[0])+`$`)
	for _, l := range lines[1:] {
		c.out.waitFor(t, `^`+regexp.QuoteMeta(l)+`$`)
	}
	close(stop)
	<-done
	all := c.exit(t)
	if n := strings.Count(all, lines[len(lines)-1]); n != 1 {
		t.Errorf("the last line shown %d times:\n%s", n, all)
	}
}
