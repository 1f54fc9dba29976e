package chat_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model/scripted"
)

// budgetKit drives the agents of the recovery budget tests: a handler that
// writes parts text parts per life (each one work unit for its start, the
// first delta of a life one more) and then waits until the runtime is
// closed (the crash), or returns once finish is set.
type budgetKit struct {
	budgets chat.RecoveryBudgets
	parts   int
	finish  atomic.Bool
	started chan struct{}                    // one send per run of the handler
	keep    func(chat.RecoveryProgress) bool // the guard's answer (guardedAgent)

	mu        sync.Mutex
	asked     []chat.RecoveryProgress
	exhausted []chat.RecoveryExhausted
}

func newBudgetKit(parts int, budgets chat.RecoveryBudgets) *budgetKit {
	return &budgetKit{parts: parts, budgets: budgets, started: make(chan struct{}, 64)}
}

type budgetHooks struct{ k *budgetKit }

func (h *budgetHooks) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	for i := range h.k.parts {
		if err := t.WriteText(fmt.Sprintf("part %d. ", i)); err != nil {
			return err
		}
	}
	h.k.started <- struct{}{}
	if h.k.finish.Load() {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (h *budgetHooks) RecoveryBudgets() chat.RecoveryBudgets { return h.k.budgets }

func (h *budgetHooks) OnRecoveryExhausted(ctx context.Context, e chat.RecoveryExhausted) {
	h.k.mu.Lock()
	defer h.k.mu.Unlock()
	h.k.exhausted = append(h.k.exhausted, e)
}

func (k *budgetKit) seen() ([]chat.RecoveryProgress, []chat.RecoveryExhausted) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]chat.RecoveryProgress(nil), k.asked...), append([]chat.RecoveryExhausted(nil), k.exhausted...)
}

// budgetAgent has budgets and an exhaustion observer, no guard.
type budgetAgent struct {
	chat.Base
	budgetHooks
}

// guardedAgent also has ShouldKeepRecovering.
type guardedAgent struct {
	chat.Base
	budgetHooks
}

func (a *guardedAgent) ShouldKeepRecovering(ctx context.Context, p chat.RecoveryProgress) bool {
	a.k.mu.Lock()
	a.k.asked = append(a.k.asked, p)
	a.k.mu.Unlock()
	return a.k.keep(p)
}

// lives runs one interrupted turn through crash after crash on the fake
// runtime clock.
type lives struct {
	t     *testing.T
	dir   string
	clk   *clockwork.FakeClock
	k     *budgetKit
	class agent.Class
	cfg   chat.Config
	id    string
	n     int // lives so far
	r     *rig
}

func newLives(t *testing.T, k *budgetKit, guarded bool, cfg chat.Config) *lives {
	class := agent.Class{Name: "Looper", New: func() agent.Agent { return &budgetAgent{budgetHooks: budgetHooks{k}} }}
	if guarded {
		class = agent.Class{Name: "Looper", New: func() agent.Agent { return &guardedAgent{budgetHooks: budgetHooks{k}} }}
	}
	return &lives{t: t, dir: t.TempDir(), clk: clockwork.NewFakeClock(), k: k, class: class, cfg: cfg}
}

func (l *lives) deltas() int {
	return count(l.t, l.r.sq, `SELECT COUNT(*) FROM chat_chunks WHERE stream_id = ? AND body LIKE '%"text-delta"%'`, l.id)
}

// first starts the turn and crashes once its first life wrote its parts.
func (l *lives) first() {
	l.t.Helper()
	l.r = newRig(l.t, rigOptions{dir: l.dir, clock: l.clk, classes: []agent.Class{l.class}, cfg: l.cfg})
	a := getChat(l.t, l.r.rt, "Looper", "one")
	id, err := a.SubmitMessages(testCtx(l.t), []message.Message{userMsg("go on forever")}, chat.SubmitOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	l.id = id
	l.n = 1
	l.settle()
}

// settle waits until the handler of this life runs and its parts are
// committed, then crashes.
func (l *lives) settle() {
	l.t.Helper()
	select {
	case <-l.k.started:
	case <-time.After(waitLimit):
		l.t.Fatalf("life %d: the handler never ran", l.n)
	}
	want := l.n * l.k.parts
	l.r.db.waitFor(l.t, fmt.Sprintf("life %d's %d text deltas", l.n, want), func() bool { return l.deltas() == want })
	l.r.close()
}

// recover starts the next life and returns its recovery-attempt event's
// attributes. An attempt that was not sealed runs the handler and crashes
// again (unless finish is set: then it completes).
func (l *lives) recover() map[string]any {
	l.t.Helper()
	l.r = newRig(l.t, rigOptions{dir: l.dir, clock: l.clk, classes: []agent.Class{l.class}, cfg: l.cfg})
	l.n++
	ev := l.r.turns.wait(l.t, "recovery-attempt", "stream", l.id)
	if ev.Attrs["reason"] != "" {
		l.r.turns.wait(l.t, "turn", "stream", l.id)
		return ev.Attrs
	}
	if l.k.finish.Load() {
		l.r.turns.wait(l.t, "turn", "stream", l.id)
		return ev.Attrs
	}
	l.settle()
	return ev.Attrs
}

// checkSealed asserts what a sealed turn leaves: the result (live and
// from storage after a restart), the message (partial kept, the terminal
// message last), the observer's single call and the diag event.
func (l *lives) checkSealed(reason chat.ExhaustReason, terminal string) chat.RecoveryExhausted {
	l.t.Helper()
	t := l.t
	if n := len(l.r.turns.matching("turn", "stream", l.id)); n != 1 {
		t.Fatalf("the sealed turn ended %d times in its last life", n)
	}
	ev := l.r.turns.wait(t, "recovery-exhausted", "stream", l.id)
	if ev.Attrs["reason"] != string(reason) {
		t.Fatalf("recovery-exhausted event %v, want reason %s", ev.Attrs, reason)
	}
	check := func(who string, res chat.TurnResult) {
		t.Helper()
		if res.Outcome != chat.OutcomeError || res.Exhausted != reason || res.Error != terminal {
			t.Fatalf("%s: result %+v, want outcome error, exhausted %s, error %q", who, res, reason, terminal)
		}
		parts := res.Message.Parts
		if len(parts) == 0 {
			t.Fatalf("%s: no message", who)
		}
		last := parts[len(parts)-1]
		if last.Type != message.PartText || last.Text != terminal || chat.ExhaustedReasonOf(last) != reason {
			t.Fatalf("%s: last part %+v, want the terminal message marked %s", who, last, reason)
		}
		for _, p := range parts[:len(parts)-1] {
			if chat.ExhaustedReasonOf(p) != "" {
				t.Fatalf("%s: the terminal message is there twice: %+v", who, parts)
			}
		}
	}
	a := getChat(t, l.r.rt, "Looper", "one")
	res, err := a.WaitTurn(testCtx(t), l.id)
	if err != nil {
		t.Fatal(err)
	}
	check("WaitTurn", res)
	if got := onlyAssistant(t, a.Messages()); !strings.HasSuffix(allText(got), terminal) {
		t.Fatalf("transcript answer %q lacks the terminal message", allText(got))
	}
	_, exhausted := l.k.seen()
	if len(exhausted) != 1 || exhausted[0].Reason != reason || exhausted[0].TerminalMessage != terminal || exhausted[0].RequestID != l.id {
		t.Fatalf("OnRecoveryExhausted calls %+v, want one with reason %s", exhausted, reason)
	}
	e := exhausted[0]
	// What recovery wrote itself (the terminal message, what it closed) is
	// not work: the meter stands where the sealing attempt read it.
	if meter, high := count(t, l.r.sq, `SELECT work FROM chat_streams WHERE id = ?`, l.id),
		count(t, l.r.sq, `SELECT progress FROM chat_recovery_incidents WHERE stream_id = ?`, l.id); meter != high {
		t.Fatalf("work meter %d after the seal, %d when the seal was decided", meter, high)
	}
	if n := len(e.Partial.Parts); n != len(res.Message.Parts)-1 {
		t.Fatalf("the exhausted partial has %d parts, the sealed message %d: want it without the terminal message", n, len(res.Message.Parts))
	}
	// After one more restart: nothing recovers, and the stored result is
	// the same.
	l.r.close()
	l.r = newRig(t, rigOptions{dir: l.dir, clock: l.clk, classes: []agent.Class{l.class}, cfg: l.cfg})
	a = getChat(t, l.r.rt, "Looper", "one")
	res, err = a.WaitTurn(testCtx(t), l.id)
	if err != nil {
		t.Fatal(err)
	}
	check("WaitTurn after a restart", res)
	if n := len(l.r.turns.matching("recovery-attempt", "", nil)); n != 0 {
		t.Fatalf("a sealed turn was recovered again (%d attempts)", n)
	}
	if got := streamStatus(t, l.dir, l.id); got != "done" {
		t.Fatalf("sealed stream status %q", got)
	}
	return e
}

// TestRecoveryWorkBudget: a runaway turn, interrupted after every few
// chunks, progresses each time (so its attempt count and no-progress window
// start again) and is sealed with work_budget_exceeded at the first
// recovery that finds its work since the first interruption above the
// budget.
func TestRecoveryWorkBudget(t *testing.T) {
	const budget = 10
	k := newBudgetKit(2, chat.RecoveryBudgets{MaxRecoveryWork: budget, TerminalMessage: "Gave up."})
	l := newLives(t, k, false, chat.Config{Recovery: chat.RecoveryBudgets{MaxRecoveryWork: 1000}})
	l.first()
	// Each life makes 3 units (two text starts and its first delta); the
	// first life's are before the incident began.
	const perLife = 3
	for n := 1; ; n++ {
		attrs := l.recover()
		work := attrs["work"].(int)
		if want := perLife * (n - 1); work != want {
			t.Fatalf("recovery %d: work %d, want %d", n, work, want)
		}
		if attrs["attempt"].(int) != 1 {
			t.Fatalf("recovery %d: attempt %v, want 1 (it progressed)", n, attrs["attempt"])
		}
		if work > budget {
			if attrs["reason"] != string(chat.ExhaustWorkBudget) {
				t.Fatalf("recovery %d: work %d over the budget %d, reason %v", n, work, budget, attrs["reason"])
			}
			break
		}
		if attrs["reason"] != "" {
			t.Fatalf("recovery %d: sealed with %v at work %d, within the budget %d", n, attrs["reason"], work, budget)
		}
		if n > 10 {
			t.Fatal("never sealed")
		}
	}
	e := l.checkSealed(chat.ExhaustWorkBudget, "Gave up.")
	if e.Work != 12 || e.Kind != chat.RecoveryKindContinue || e.Attempt != 1 {
		t.Fatalf("exhausted %+v, want work 12, kind continue, attempt 1", e.RecoveryProgress)
	}
	if got := len(e.Partial.Parts); got != 2*5 {
		t.Fatalf("the kept partial has %d parts, want the 10 the five lives wrote", got)
	}
}

// TestRecoveryNoProgressTimeout: a silent turn (it streams nothing) is not
// sealed while its incident is younger than the no-progress window, and is
// sealed with no_progress_timeout at the first recovery after it.
func TestRecoveryNoProgressTimeout(t *testing.T) {
	k := newBudgetKit(0, chat.RecoveryBudgets{})
	l := newLives(t, k, false, chat.Config{})
	l.first()
	if attrs := l.recover(); attrs["reason"] != "" || attrs["attempt"] != 1 {
		t.Fatalf("first recovery %v", attrs)
	}
	l.clk.Advance(4 * time.Minute)
	if attrs := l.recover(); attrs["reason"] != "" || attrs["attempt"] != 2 || attrs["progressed"] != false {
		t.Fatalf("recovery within the window: %v", attrs)
	}
	l.clk.Advance(time.Minute + time.Second)
	if attrs := l.recover(); attrs["reason"] != string(chat.ExhaustNoProgress) || attrs["attempt"] != 3 {
		t.Fatalf("recovery past the window: %v", attrs)
	}
	e := l.checkSealed(chat.ExhaustNoProgress, chat.DefaultRecoveryTerminalMessage)
	if e.Age != 5*time.Minute+time.Second || e.Work != 0 {
		t.Fatalf("exhausted %+v, want age 5m1s and no work", e.RecoveryProgress)
	}
}

// TestRecoveryMaxAttempts: a silent turn recovered again and again without
// progress is sealed with max_attempts_exceeded at the attempt after its
// budget (here the runtime's Config.Recovery, the class sets none).
func TestRecoveryMaxAttempts(t *testing.T) {
	k := newBudgetKit(0, chat.RecoveryBudgets{})
	l := newLives(t, k, false, chat.Config{Recovery: chat.RecoveryBudgets{MaxAttempts: 3}})
	l.first()
	for n := 1; n <= 3; n++ {
		if attrs := l.recover(); attrs["reason"] != "" || attrs["attempt"] != n || attrs["maxAttempts"] != 3 {
			t.Fatalf("recovery %d: %v", n, attrs)
		}
	}
	if attrs := l.recover(); attrs["reason"] != string(chat.ExhaustMaxAttempts) || attrs["attempt"] != 4 {
		t.Fatalf("recovery 4: %v", attrs)
	}
	l.checkSealed(chat.ExhaustMaxAttempts, chat.DefaultRecoveryTerminalMessage)
}

// TestRecoveryGuardAborts: ShouldKeepRecovering is not asked on the first
// recovery; asked on the second (with the incident's progress), its false
// seals the turn with recovery_aborted.
func TestRecoveryGuardAborts(t *testing.T) {
	k := newBudgetKit(1, chat.RecoveryBudgets{})
	k.keep = func(chat.RecoveryProgress) bool { return false }
	l := newLives(t, k, true, chat.Config{})
	l.first()
	if attrs := l.recover(); attrs["reason"] != "" {
		t.Fatalf("first recovery %v", attrs)
	}
	if asked, _ := k.seen(); len(asked) != 0 {
		t.Fatalf("the guard was asked on the first recovery: %+v", asked)
	}
	l.clk.Advance(time.Minute)
	if attrs := l.recover(); attrs["reason"] != string(chat.ExhaustRecoveryAborted) {
		t.Fatalf("second recovery %v", attrs)
	}
	asked, _ := k.seen()
	want := chat.RecoveryProgress{IncidentID: asked[0].IncidentID, RequestID: l.id, Attempt: 1, MaxAttempts: chat.DefaultRecoveryMaxAttempts,
		Kind: chat.RecoveryKindContinue, Work: 2, Age: time.Minute}
	if len(asked) != 1 || asked[0] != want || !strings.HasPrefix(asked[0].IncidentID, l.id+":") {
		t.Fatalf("the guard was asked %+v, want once with %+v", asked, want)
	}
	l.checkSealed(chat.ExhaustRecoveryAborted, chat.DefaultRecoveryTerminalMessage)
}

// TestRecoveryGuardPanics: a guard that panics counts as "keep
// recovering": the turn is recovered on and completes.
func TestRecoveryGuardPanics(t *testing.T) {
	k := newBudgetKit(1, chat.RecoveryBudgets{})
	k.keep = func(chat.RecoveryProgress) bool { panic("the guard is broken") }
	l := newLives(t, k, true, chat.Config{})
	l.first()
	for n := 1; n <= 3; n++ {
		if attrs := l.recover(); attrs["reason"] != "" {
			t.Fatalf("recovery %d: %v", n, attrs)
		}
	}
	k.finish.Store(true)
	if attrs := l.recover(); attrs["reason"] != "" {
		t.Fatalf("last recovery %v", attrs)
	}
	if asked, _ := k.seen(); len(asked) != 3 {
		t.Fatalf("the guard was asked %d times, want 3 (recoveries 2 to 4)", len(asked))
	}
	checkCompleted(t, l)
}

// TestRecoveryHealthyLongTurn: a turn interrupted many more times than the
// attempt budget, making progress every time, is never sealed and
// completes; every attempt counts as a first one again.
func TestRecoveryHealthyLongTurn(t *testing.T) {
	k := newBudgetKit(1, chat.RecoveryBudgets{})
	k.keep = func(chat.RecoveryProgress) bool { return true }
	l := newLives(t, k, true, chat.Config{})
	l.first()
	const interruptions = 2*chat.DefaultRecoveryMaxAttempts + 1
	for n := 1; n <= interruptions; n++ {
		if n == interruptions {
			k.finish.Store(true)
		}
		l.clk.Advance(time.Minute) // far more than five in all
		attrs := l.recover()
		if attrs["reason"] != "" || attrs["attempt"] != 1 {
			t.Fatalf("recovery %d: %v", n, attrs)
		}
	}
	asked, _ := k.seen()
	if len(asked) != interruptions-1 {
		t.Fatalf("the guard was asked %d times, want %d", len(asked), interruptions-1)
	}
	for i, p := range asked {
		if p.Attempt != 1 || p.Work != 2*(i+1) || p.Age != time.Duration(i+1)*time.Minute {
			t.Fatalf("ask %d: %+v", i, p)
		}
	}
	checkCompleted(t, l)
}

// checkCompleted asserts that the turn completed normally and its
// incident is gone.
func checkCompleted(t *testing.T, l *lives) {
	t.Helper()
	a := getChat(t, l.r.rt, "Looper", "one")
	res, err := a.WaitTurn(testCtx(t), l.id)
	if err != nil || res.Outcome != chat.OutcomeCompleted || res.Exhausted != "" {
		t.Fatalf("result %+v, %v; want completed", res, err)
	}
	for _, p := range res.Message.Parts {
		if chat.ExhaustedReasonOf(p) != "" {
			t.Fatalf("a completed turn has a terminal message: %+v", res.Message.Parts)
		}
	}
	if _, exhausted := l.k.seen(); len(exhausted) != 0 {
		t.Fatalf("OnRecoveryExhausted was called: %+v", exhausted)
	}
	if n := count(t, l.r.sq, `SELECT COUNT(*) FROM chat_recovery_incidents WHERE stream_id = ?`, l.id); n != 0 {
		t.Fatalf("%d incidents left after the turn completed", n)
	}
}

// guardedChat is a declarative chat agent whose guard says stop.
type guardedChat struct {
	chat.Base
	hooks
}

func (a *guardedChat) ShouldKeepRecovering(ctx context.Context, p chat.RecoveryProgress) bool {
	return false
}

// TestRecoverySealsCutStep: a declarative turn cut mid-text twice and then
// sealed keeps what every client saw: the first cut text closed with the
// continued mark (the next life went on from it), the second with the
// interrupted mark and its step marked, and the terminal message after
// them; the answer is the continued text and the terminal message.
func TestRecoverySealsCutStep(t *testing.T) {
	dir := t.TempDir()
	mclk := clockwork.NewFakeClock()
	m := slowModel(mclk)
	k := &kit{model: m}
	class := agent.Class{Name: "Stopper", New: func() agent.Agent { return &guardedChat{hooks: hooks{k}} }}
	classes := []agent.Class{class}
	rclk := clockwork.NewFakeClock()
	r1 := newRig(t, rigOptions{dir: dir, clock: rclk, classes: classes})
	id, _ := crashMidTurn(t, r1, rclk, mclk, m, getChat(t, r1.rt, "Stopper", "s"), "say something long enough to be cut", 1, 2)

	// Life 2: recovered (the guard is not asked on the first recovery), the
	// model streams a little more, and the process dies again.
	r2 := newRig(t, rigOptions{dir: dir, clock: rclk, classes: classes})
	if ev := r2.turns.wait(t, "recovery-attempt", "stream", id); ev.Attrs["reason"] != "" {
		t.Fatalf("first recovery %v", ev.Attrs)
	}
	ctx := testCtx(t)
	for {
		if err := mclk.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if len(m.Calls()) >= 2 {
			break
		}
		mclk.Advance(modelDelay)
	}
	step(t, mclk, modelDelay)
	if err := mclk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	deltas := func() int {
		return count(t, r2.sq, `SELECT COUNT(*) FROM chat_chunks WHERE stream_id = ? AND body LIKE '%"text-delta"%'`, id)
	}
	r2.db.waitFor(t, "the second life's deltas", func() bool { return deltas() == 3+2 })
	r2.close()

	r3 := newRig(t, rigOptions{dir: dir, clock: rclk, classes: classes})
	if ev := r3.turns.wait(t, "recovery-attempt", "stream", id); ev.Attrs["reason"] != string(chat.ExhaustRecoveryAborted) {
		t.Fatalf("second recovery %v", ev.Attrs)
	}
	r3.turns.wait(t, "turn", "stream", id)
	res, err := getChat(t, r3.rt, "Stopper", "s").WaitTurn(ctx, id)
	if err != nil || res.Exhausted != chat.ExhaustRecoveryAborted {
		t.Fatalf("result %+v, %v", res, err)
	}
	if got, want := chat.MessageText(res.Message), "You said: sa"+chat.DefaultRecoveryTerminalMessage; got != want {
		t.Fatalf("visible answer %q, want %q: the continued text and the terminal message", got, want)
	}
	var cutText, continued, marks, steps int
	for _, p := range res.Message.Parts {
		switch {
		case p.Type == message.PartText && string(p.ProviderMetadata) == string(message.ContinuedMetadata):
			continued++
		case p.Type == message.PartText && p.Interrupted():
			cutText++
			if p.State != "done" {
				t.Fatalf("cut text part left %q: %+v", p.State, p)
			}
		case p.Type == message.DataPartPrefix+message.InterruptedStepName:
			marks++
		case p.Type == message.PartStepStart:
			steps++
		}
	}
	if continued != 1 || cutText != 1 || marks != 1 || steps != 2 {
		t.Fatalf("%d continued and %d cut text parts, %d cut-step marks, %d steps; want 1, 1, 1, 2: %+v",
			continued, cutText, marks, steps, res.Message.Parts)
	}
	if n := len(m.Calls()); n != 2 {
		t.Fatalf("%d model calls, want 2 (none after the seal)", n)
	}
	if got := allText(onlyAssistant(t, getChat(t, r3.rt, "Stopper", "s").Messages())); !strings.HasSuffix(got, chat.DefaultRecoveryTerminalMessage) {
		t.Fatalf("transcript text %q", got)
	}
}

// TestCreditProgress: CreditProgress (an agent-tool parent's forwarded
// child chunks) credits the running turn one work unit at most once per
// five seconds of the runtime clock, found from the turn's context or, from
// any other context, as the agent's running turn.
func TestCreditProgress(t *testing.T) {
	rclk := clockwork.NewFakeClock()
	var r *rig
	var id string
	var got []int
	meter := func() int { return count(t, r.sq, `SELECT work FROM chat_streams WHERE id = ?`, id) }
	credit := chat.NewTool("credit", "Credits progress.", func(ctx context.Context, in empty) (string, error) {
		var self agent.Agent
		id, self, _ = chat.CurrentTurn(ctx)
		got = append(got, meter())
		for _, c := range []context.Context{ctx, ctx, nil, context.Background()} {
			if c == nil {
				rclk.Advance(5 * time.Second)
				continue
			}
			if err := chat.CreditProgress(c, self); err != nil {
				return "", err
			}
			got = append(got, meter())
		}
		return "ok", nil
	})
	m := scripted.New(scripted.WithRules(
		scripted.Rule{Name: "done", Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("Done.")})},
		scripted.Rule{Name: "call", Reply: scripted.Always(scripted.Reply{scripted.ToolCall("credit", json.RawMessage(`{}`))})},
	))
	r = newRig(t, rigOptions{clock: rclk, classes: []agent.Class{chatClass("Bot", &kit{model: m, tools: []chat.Tool{credit}})}})
	res, err := getChat(t, r.rt, "Bot", "c").SaveMessages(testCtx(t), []message.Message{userMsg("credit it")})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("%+v %v", res, err)
	}
	w0 := got[0]
	if want := []int{w0, w0 + 1, w0 + 1, w0 + 2}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the meter read %v, want %v", got, want)
	}
}
