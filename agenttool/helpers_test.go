package agenttool_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/internal/testkit/testctx"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

var pg pgtest.Cluster

func TestMain(m *testing.M) { goleak.VerifyTestMain(pg.Wrap(m)) }

// waitLimit bounds every wait: a deadline for a broken test, never a way
// to let time pass.
const waitLimit = 20 * time.Second

func testCtx(t *testing.T) context.Context { return testctx.Within(t, waitLimit) }

// ---------------------------------------------------------------------------
// Test agents. One kit per test configures every class of its runtime.

type kit struct {
	logs testenv.Logs // the runtime's log
	// Parent ("Assistant").
	parentModel model.Model
	parentTools []chat.Tool
	cap         int
	rec         *recorder
	onStart     func(run agenttool.Run) // called by OnAgentToolStart

	// Children.
	researcher model.Model // "Researcher", declarative
	extractor  model.Model // "Extractor", declarative workflow child
	summarizer model.Model // "Summarizer", custom handler
	middle     func(ctx context.Context, self agent.Agent, t *chat.Turn) error
	middleCap  int
	middleRec  *recorder
}

func newKit() *kit {
	return &kit{
		rec:        newRecorder(),
		middleRec:  newRecorder(),
		researcher: echoResearcher(),
	}
}

// echoResearcher answers "Findings for <query>" to {"query":…} input.
func echoResearcher(opts ...scripted.Option) model.Model {
	return scripted.New(append([]scripted.Option{scripted.WithDefault(func(req *model.Request) scripted.Reply {
		var in researchInput
		_ = json.Unmarshal([]byte(scripted.LastUserText(req)), &in)
		return scripted.Reply{scripted.Text("Findings for " + in.Query)}
	})}, opts...)...)
}

type researchInput struct {
	Query string `json:"query"`
}

// assistant is the parent: a chat agent with the agent-tool hooks.
type assistant struct {
	chat.Base
	k *kit
}

func (a *assistant) ChatModel() model.Model       { return a.k.parentModel }
func (a *assistant) Tools() []chat.Tool           { return a.k.parentTools }
func (a *assistant) MaxConcurrentAgentTools() int { return a.k.cap }
func (a *assistant) OnAgentToolStart(ctx context.Context, run agenttool.Run) {
	a.k.rec.start(run)
	if a.k.onStart != nil {
		a.k.onStart(run)
	}
}
func (a *assistant) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	a.k.rec.finish(run, res)
}

// researcher is a declarative chat child.
type researcher struct {
	chat.Base
	k *kit
}

func (r *researcher) ChatModel() model.Model { return r.k.researcher }
func (r *researcher) SystemPrompt() string {
	return "Research the user's topic and end with a concise summary."
}

// extractor is the seed's workflow child: its tool stores the result in the
// instance's own table, the turn ends without text, and the output and
// summary hooks read the table.
type extractor struct {
	chat.Base
	k *kit
}

type extraction struct {
	Entities []string `json:"entities"`
	Count    int      `json:"count"`
}

func (e *extractor) OnStart(ctx context.Context) error {
	return e.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`CREATE TABLE IF NOT EXISTS {extraction_runs} (id TEXT PRIMARY KEY, result_json TEXT NOT NULL)`)
		return err
	})
}

func (e *extractor) ChatModel() model.Model { return e.k.extractor }

type saveInput struct {
	Entities []string `json:"entities"`
}

func (e *extractor) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("save_extraction", "Store the extraction result.",
		func(ctx context.Context, in saveInput) (string, error) {
			data, _ := json.Marshal(extraction{Entities: in.Entities, Count: len(in.Entities)})
			// The child instance is named by the run id.
			err := e.Storage().Update(ctx, func(s *agent.SQL) error {
				_, err := s.Exec(`INSERT INTO {extraction_runs} (id, result_json) VALUES (?, ?)`, e.Name(), string(data))
				return err
			})
			return "saved", err
		})}
}

func (e *extractor) AgentToolOutput(ctx context.Context, runID string) (any, error) {
	var raw string
	err := e.Storage().View(ctx, func(s *agent.SQL) error {
		return s.QueryRow(`SELECT result_json FROM {extraction_runs} WHERE id = ?`, runID).Scan(&raw)
	})
	if err != nil {
		if strings.Contains(err.Error(), "no rows") {
			return nil, nil
		}
		return nil, err
	}
	return json.RawMessage(raw), nil
}

func (e *extractor) AgentToolSummary(ctx context.Context, runID string, output json.RawMessage) string {
	if len(output) > 0 {
		return "Extraction complete"
	}
	return ""
}

// extractorModel calls save_extraction with entities, then ends without
// text.
func extractorModel(entities ...string) model.Model {
	return scripted.New(
		scripted.WithRules(scripted.Rule{Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{})}),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.ToolCall("save_extraction", saveInput{Entities: entities})})))
}

// summarizer is a custom-handler child that formats its input itself.
type summarizer struct {
	chat.Base
	k *kit
}

type summarizeInput struct {
	Text string `json:"text"`
}

func (s *summarizer) FormatAgentToolInput(input json.RawMessage, req agenttool.ChildRequest) message.Message {
	var in summarizeInput
	_ = json.Unmarshal(input, &in)
	return message.Message{ID: "agent-tool-" + req.RunID + "-input", Role: message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: "Summarize:\n\n" + in.Text}}}
}

func (s *summarizer) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	return t.RunLoop(ctx, chat.LoopOptions{Model: s.k.summarizer})
}

// middle is a child that runs agent tools itself (nesting).
type middle struct {
	chat.Base
	k *kit
}

func (m *middle) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	return m.k.middle(ctx, m, t)
}
func (m *middle) MaxConcurrentAgentTools() int { return m.k.middleCap }
func (m *middle) OnAgentToolStart(ctx context.Context, run agenttool.Run) {
	m.k.middleRec.start(run)
}
func (m *middle) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	m.k.middleRec.finish(run, res)
}

// plain is an agent that is not a chat agent.
type plain struct{ agent.Base }

func startKit(t *testing.T, k *kit, opts agenttool.Options) *testenv.Env {
	t.Helper()
	return startEnv(t, testenv.Options{
		Postgres: &pg,
		Classes: []agent.Class{
			{Name: "Assistant", New: func() agent.Agent { return &assistant{k: k} }, Public: true},
			{Name: "Researcher", New: func() agent.Agent { return &researcher{k: k} }},
			{Name: "Extractor", New: func() agent.Agent { return &extractor{k: k} }},
			{Name: "Summarizer", New: func() agent.Agent { return &summarizer{k: k} }},
			{Name: "Middle", New: func() agent.Agent { return &middle{k: k} }},
			{Name: "Plain", New: func() agent.Agent { return &plain{} }, Public: true},
		},
		Logger: k.logs.Logger(),
	}, chat.Config{}, opts, nil)
}

func getAssistant(t *testing.T, env *testenv.Env, name string) *assistant {
	t.Helper()
	a, err := env.RT.Get(testCtx(t), agent.Root("Assistant", name))
	if err != nil {
		t.Fatal(err)
	}
	return a.(*assistant)
}

// childOf returns the child instance of a run.
func childOf[T agent.Agent](t *testing.T, env *testenv.Env, parent agent.Agent, class, runID string) T {
	t.Helper()
	c, err := env.RT.Get(testCtx(t), agent.BaseOf(parent).Path().Child(class, runID))
	if err != nil {
		t.Fatal(err)
	}
	return c.(T)
}

func userMsg(text string) message.Message {
	return message.Message{Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: text}}}
}

func getRun(t *testing.T, parent agent.Agent, runID string) agenttool.Run {
	t.Helper()
	r, ok, err := agenttool.GetAgentToolRun(testCtx(t), parent, runID)
	if err != nil || !ok {
		t.Fatalf("run %s: ok=%v err=%v", runID, ok, err)
	}
	return r
}

// ---------------------------------------------------------------------------
// Hook recorder.

type finishCall struct {
	Run    agenttool.Run
	Result agenttool.Result
}

type recorder struct {
	mu       sync.Mutex
	starts   []agenttool.Run
	finishes []finishCall
	started  chan agenttool.Run // every start, buffered
	finished chan finishCall    // every finish, buffered
}

func newRecorder() *recorder {
	return &recorder{started: make(chan agenttool.Run, 100), finished: make(chan finishCall, 100)}
}

func (r *recorder) start(run agenttool.Run) {
	r.mu.Lock()
	r.starts = append(r.starts, run)
	r.mu.Unlock()
	r.started <- run
}

func (r *recorder) finish(run agenttool.Run, res agenttool.Result) {
	r.mu.Lock()
	r.finishes = append(r.finishes, finishCall{run, res})
	r.mu.Unlock()
	r.finished <- finishCall{run, res}
}

func (r *recorder) finishesOf(runID string) []finishCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []finishCall
	for _, f := range r.finishes {
		if f.Run.RunID == runID {
			out = append(out, f)
		}
	}
	return out
}

func (r *recorder) startCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.starts)
}

// ---------------------------------------------------------------------------
// Holding models mid-stream on a fake clock.

const tick = time.Millisecond

// heldModel streams reply with a delay of one tick between events on the
// fake clock: it sends its first event, then waits until the clock moves.
func heldModel(fake *clockwork.FakeClock, def func(*model.Request) scripted.Reply) *scripted.Model {
	return scripted.New(scripted.WithDefault(def), scripted.WithDelay(tick), scripted.WithClock(fake))
}

// waitHeld returns when n model streams wait on the fake clock.
func waitHeld(t *testing.T, ctx context.Context, fake *clockwork.FakeClock, n int) {
	t.Helper()
	if err := fake.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("waiting for %d held streams: %v", n, err)
	}
}

// pump lets held models run: it moves the fake clock whenever a stream
// waits on it, until stop is called.
func pump(fake *clockwork.FakeClock) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for fake.BlockUntilContext(ctx, 1) == nil {
			fake.Advance(tick)
		}
	}()
	return func() { cancel(); <-done }
}

// ---------------------------------------------------------------------------
// WebSocket client that records agent-tool-event frames.

// wsClient is a WebSocket connection (testenv.WSClient) whose tests read
// its agent-tool-event frames, or every frame as text.
type wsClient struct {
	t  *testing.T
	ws *testenv.WSClient[agenttool.Frame]
}

func routePath(class, name string) string { return agent.Kebab(class) + "/" + url.PathEscape(name) }

// dial connects to /agents/<path>, e.g. "assistant/p1" or
// "assistant/p1/sub/researcher/<run>".
func dial(t *testing.T, env *testenv.Env, path string) *wsClient {
	t.Helper()
	ctx := testCtx(t)
	w := &wsClient{t: t, ws: testenv.DialWS[agenttool.Frame](t, waitLimit, env.URL("/agents/"+path))}
	t.Cleanup(w.close)
	// The connect phase (connect frames, replay) is over once the server
	// answers a frame sent after it.
	w.sync(ctx)
	return w
}

// toolFrames returns the agent-tool-event frames of fs.
func toolFrames(fs []testenv.Frame[agenttool.Frame]) []agenttool.Frame {
	var out []agenttool.Frame
	for _, f := range fs {
		if f.Err == nil && f.Value.Type == wire.AgentToolEvent {
			out = append(out, f.Value)
		}
	}
	return out
}

func (w *wsClient) close() { w.ws.CloseNormally() }

func (w *wsClient) send(v any) {
	w.t.Helper()
	w.ws.Send(v)
}

// sync returns once every frame the server queued for this connection
// before an answer to a frame sent now has arrived (the connect frames and
// the replay included).
func (w *wsClient) sync(ctx context.Context) {
	w.t.Helper()
	w.send(map[string]any{"type": "agentry-test-sync"})
	w.waitRaw(ctx, "the sync answer", func(s string) bool { return strings.Contains(s, "agentry-test-sync") })
}

// waitFrames waits until pred holds for the agent-tool frames received so
// far and returns them.
func (w *wsClient) waitFrames(ctx context.Context, what string, pred func([]agenttool.Frame) bool) []agenttool.Frame {
	w.t.Helper()
	fs, err := w.ws.Wait(ctx, func(fs []testenv.Frame[agenttool.Frame]) bool { return pred(toolFrames(fs)) })
	if err != nil {
		w.t.Fatalf("timed out waiting for %s (%v); frames:\n%s", what, err, dumpFrames(toolFrames(fs)))
	}
	return toolFrames(fs)
}

// waitRaw waits until a raw frame satisfies pred and returns it.
func (w *wsClient) waitRaw(ctx context.Context, what string, pred func(string) bool) string {
	w.t.Helper()
	var hit string
	_, err := w.ws.Wait(ctx, func(fs []testenv.Frame[agenttool.Frame]) bool {
		for _, f := range fs {
			if pred(string(f.Raw)) {
				hit = string(f.Raw)
				return true
			}
		}
		return false
	})
	if err != nil {
		w.t.Fatalf("timed out waiting for %s (%v)", what, err)
	}
	return hit
}

func isTerminal(kind string) bool {
	switch kind {
	case "finished", "error", "aborted", "interrupted":
		return true
	}
	return false
}

// terminated reports whether every run in ids has a terminal frame.
func terminated(ids ...string) func([]agenttool.Frame) bool {
	return func(fs []agenttool.Frame) bool {
		for _, id := range ids {
			found := false
			for _, f := range fs {
				if f.Event.RunID == id && isTerminal(f.Event.Kind) {
					found = true
				}
			}
			if !found {
				return false
			}
		}
		return true
	}
}

func framesOf(fs []agenttool.Frame, runID string) []agenttool.Frame {
	var out []agenttool.Frame
	for _, f := range fs {
		if f.Event.RunID == runID {
			out = append(out, f)
		}
	}
	return out
}

func dumpFrames(fs []agenttool.Frame) string {
	var b strings.Builder
	for _, f := range fs {
		data, _ := json.Marshal(f)
		b.Write(data)
		b.WriteByte('\n')
	}
	return b.String()
}

// checkSequences asserts the frames of one run, in arrival order, have
// strictly increasing sequences 0,1,2,… with no gap but where a replay
// left out a superseded metadata chunk (see replayOf), started first and
// the terminal frame last.
func checkSequences(t *testing.T, fs []agenttool.Frame) {
	t.Helper()
	if len(fs) == 0 {
		t.Fatal("no frames")
	}
	next := int64(0)
	for i, f := range fs {
		gap := f.Replay && i > 0 && f.Sequence == next+1 && fs[i-1].Sequence == next-1
		if f.Sequence != next && !gap {
			t.Fatalf("frame %d has sequence %d (want %d, strictly increasing without gaps but one left out by a replay):\n%s", i, f.Sequence, next, dumpFrames(fs))
		}
		next = f.Sequence + 1
	}
	if fs[0].Event.Kind != "started" {
		t.Fatalf("first frame is %s, want started", fs[0].Event.Kind)
	}
	for _, f := range fs[1 : len(fs)-1] {
		if f.Event.Kind != "chunk" {
			t.Fatalf("middle frame %d is %s, want chunk:\n%s", f.Sequence, f.Event.Kind, dumpFrames(fs))
		}
	}
}

// replayOf returns the frames of live that a connect replay sends: all
// but a run's message-metadata chunks that come before its finish chunk
// when that carries metadata (usage streamed after each step, which the
// finish repeats).
func replayOf(live []agenttool.Frame) []agenttool.Frame {
	finishAt := map[string]int{}
	for i, f := range live {
		if f.Event.Kind == "chunk" && strings.HasPrefix(f.Event.Body, `{"type":"finish","messageMetadata"`) {
			finishAt[f.Event.RunID] = i
		}
	}
	var out []agenttool.Frame
	for i, f := range live {
		if at, ok := finishAt[f.Event.RunID]; ok && i < at && f.Event.Kind == "chunk" &&
			strings.HasPrefix(f.Event.Body, `{"type":"message-metadata"`) {
			continue
		}
		out = append(out, f)
	}
	return out
}

// textOf concatenates the text-delta bodies of chunk frames.
func textOf(fs []agenttool.Frame) string {
	var b strings.Builder
	for _, f := range fs {
		if f.Event.Kind != "chunk" {
			continue
		}
		var ch struct {
			Type  string `json:"type"`
			Delta string `json:"delta"`
		}
		_ = json.Unmarshal([]byte(f.Event.Body), &ch)
		if ch.Type == "text-delta" {
			b.WriteString(ch.Delta)
		}
	}
	return b.String()
}

// ---------------------------------------------------------------------------
// Seeding registry rows (what a crash or an older version leaves behind).

type seedRow struct {
	RunID, ToolCall, AgentType, Status, Summary, Error, Reason string
	Still                                                      *bool
	StartedAt                                                  time.Time
	Marks                                                      string // terminal_marks JSON, "" for none
}

func seed(t *testing.T, env *testenv.Env, parent agent.Agent, r seedRow) {
	t.Helper()
	ctx := testCtx(t)
	nul := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	var still any
	if r.Still != nil {
		still = 0
		if *r.Still {
			still = 1
		}
	}
	var completed any
	if r.Status != "starting" && r.Status != "running" {
		completed = r.StartedAt.UnixMilli()
	}
	err := env.RT.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO agent_tool_runs (instance_id, run_id, parent_tool_call_id, agent_type, input_preview,
			status, summary, error_message, interrupted_reason, child_still_running, display_order, started_at, completed_at, terminal_marks)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)`,
			agent.BaseOf(parent).InstanceID(), r.RunID, nul(r.ToolCall), r.AgentType, `"seeded"`, r.Status,
			nul(r.Summary), nul(r.Error), nul(r.Reason), still, r.StartedAt.UnixMilli(), completed, nul(r.Marks))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// httpStatus GETs /agents/<path> and returns the status code.
func httpStatus(t *testing.T, env *testenv.Env, path string) int {
	t.Helper()
	resp, err := http.Get(env.HTTP.URL + "/agents/" + path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// getMessages reads a chat agent's transcript over HTTP.
func getMessages(t *testing.T, env *testenv.Env, path string) []message.Message {
	t.Helper()
	resp, err := http.Get(env.HTTP.URL + "/agents/" + path + "/get-messages")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("get-messages %s: %s", path, resp.Status)
	}
	var msgs []message.Message
	if err := json.NewDecoder(resp.Body).Decode(&msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func jsonEq(t *testing.T, got, want any) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Fatalf("got %s\nwant %s", g, w)
	}
}
