package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is the demo served on 127.0.0.1 with its MCP endpoint.
type env struct {
	d    *demo.Demo
	url  string // the server's base URL
	stop func() // closes the server, the runtime and the database
}

func start(t *testing.T, o demo.Options) *env {
	t.Helper()
	return startAt(t, filepath.Join(t.TempDir(), "agentry.db"), o)
}

// startAt is start on the database file at dbPath.
func startAt(t *testing.T, dbPath string, o demo.Options) *env {
	t.Helper()
	ctx := context.Background()
	db, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	o.DB = db
	o.IdleTimeout = -1
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.Models == nil {
		o.Models = agentsastools.Offline(time.Millisecond, nil)
	}
	d, err := demo.Start(ctx, o)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	hs := httptest.NewServer(d.Handler())
	e := &env{d: d, url: hs.URL}
	e.stop = sync.OnceFunc(func() {
		d.Agents.Close()
		d.MCP.Close()
		hs.CloseClientConnections()
		hs.Close()
		d.Close()
		db.Close()
	})
	t.Cleanup(e.stop)
	return e
}

// connect opens an MCP client session on the endpoint; progress receives
// the progress notifications.
func (e *env) connect(t *testing.T, query string, header http.Header, progress func(*mcp.ProgressNotificationParams)) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{}
	if progress != nil {
		opts.ProgressNotificationHandler = func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress(req.Params)
		}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts)
	hc := &http.Client{Transport: headerTransport{h: header}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.url + "/mcp" + query, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

type headerTransport struct{ h http.Header }

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	for k, v := range t.h {
		r.Header[k] = v
	}
	return http.DefaultTransport.RoundTrip(r)
}

// assistant returns the demo Assistant instance name.
func (e *env) assistant(t *testing.T, name string) agent.Agent {
	t.Helper()
	a, err := e.d.Runtime.Get(context.Background(), agent.Path{{Class: "Assistant", Name: name}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestListTools(t *testing.T) {
	e := start(t, demo.Options{})
	cs := e.connect(t, "", nil, nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	// research and plan are the Assistant's agent tools; its plain tools
	// (compare, research_background, …) are not exposed; both chat classes
	// have a chat tool, so each is prefixed with its route.
	want := []string{"assistant_chat", "echo-chat_chat", "plan", "research"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	for _, tl := range res.Tools {
		if tl.Name != "research" {
			continue
		}
		schema, _ := json.Marshal(tl.InputSchema)
		if !strings.Contains(string(schema), `"query"`) || !strings.Contains(string(schema), `"minLength":3`) {
			t.Fatalf("research schema %s: the tool's own schema (query, minLength 3) expected", schema)
		}
	}
}

func TestCallResearchReportsProgress(t *testing.T) {
	e := start(t, demo.Options{SearchTime: 300 * time.Millisecond})
	var mu sync.Mutex
	var notes []*mcp.ProgressNotificationParams
	cs := e.connect(t, "", nil, func(p *mcp.ProgressNotificationParams) {
		mu.Lock()
		notes = append(notes, p)
		mu.Unlock()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	params := &mcp.CallToolParams{Name: "research", Arguments: map[string]any{"query": "solar panels"}}
	params.SetProgressToken("tok-1")
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("research failed: %+v", res.Content)
	}
	mu.Lock()
	got := slices.Clone(notes)
	mu.Unlock()
	// The progress notifications all arrive before the result.
	if len(got) < 3 {
		t.Fatalf("%d progress notifications, want at least 3", len(got))
	}
	var milestone bool
	for i, n := range got {
		if n.ProgressToken != "tok-1" {
			t.Fatalf("notification %d has token %v", i, n.ProgressToken)
		}
		if i > 0 && n.Progress <= got[i-1].Progress {
			t.Fatalf("progress went from %v to %v", got[i-1].Progress, n.Progress)
		}
		milestone = milestone || strings.Contains(n.Message, "sources-gathered")
	}
	if !milestone {
		t.Fatalf("no milestone among %d notifications", len(got))
	}
	sc, _ := json.Marshal(res.StructuredContent)
	var out struct {
		RunID   string `json:"runId"`
		Status  string `json:"status"`
		Summary string `json:"summary"`
	}
	if err := json.Unmarshal(sc, &out); err != nil {
		t.Fatal(err)
	}
	if out.Status != "completed" || out.Summary == "" || !strings.HasPrefix(out.RunID, "mcp-") {
		t.Fatalf("structured content %s", sc)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; text != out.Summary {
		t.Fatalf("text %q, want the summary %q", text, out.Summary)
	}
	// The run is a real one: in the default Assistant's registry, unbound
	// (the playground shows it among the background runs).
	run, ok, err := agenttool.GetAgentToolRun(ctx, e.assistant(t, "default"), out.RunID)
	if err != nil || !ok {
		t.Fatalf("run %s in the registry: %v %v", out.RunID, ok, err)
	}
	if run.Status != agenttool.StatusCompleted || run.ParentToolCallID != "" || run.AgentType != "Researcher" {
		t.Fatalf("registry row %+v", run)
	}
}

func TestInvalidInputIsAToolError(t *testing.T) {
	e := start(t, demo.Options{})
	cs := e.connect(t, "", nil, nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "research", Arguments: map[string]any{"query": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "invalid tool input") {
		t.Fatalf("result %+v, want an input error", res)
	}
	runs, err := agenttool.ListAgentToolRuns(context.Background(), e.assistant(t, "default"))
	if err != nil || len(runs) != 0 {
		t.Fatalf("runs %v (%v): an invalid call must start none", runs, err)
	}
}

func TestCancelAbortsTheRunAndItsChild(t *testing.T) {
	e := start(t, demo.Options{SearchTime: time.Hour})
	finished := make(chan diag.Event, 4)
	unsub := e.d.Runtime.Diag().Subscribe(diag.ChannelAgentTool, func(ev diag.Event) {
		if ev.Type == "finish" {
			finished <- ev
		}
	})
	defer unsub()
	first := make(chan struct{})
	var once sync.Once
	cs := e.connect(t, "", nil, func(*mcp.ProgressNotificationParams) { once.Do(func() { close(first) }) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	params := &mcp.CallToolParams{Name: "research", Arguments: map[string]any{"query": "quantum computing"}}
	params.SetProgressToken(7)
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, params)
		errc <- err
	}()
	select {
	case <-first:
	case <-time.After(20 * time.Second):
		t.Fatal("no progress notification")
	}
	cancel() // the client sends notifications/cancelled
	if err := <-errc; err == nil {
		t.Fatal("a cancelled call returned a result")
	}
	var ev diag.Event
	select {
	case ev = <-finished:
	case <-time.After(20 * time.Second):
		t.Fatal("the run did not end")
	}
	if ev.Attrs["status"] != string(agenttool.StatusAborted) {
		t.Fatalf("run ended %v, want aborted", ev.Attrs["status"])
	}
	runID, _ := ev.Attrs["runId"].(string)
	ins, err := agenttool.InspectAgentToolRun(context.Background(), e.assistant(t, "default"), runID)
	if err != nil || ins == nil {
		t.Fatalf("inspect %s: %v", runID, err)
	}
	if ins.Status != agenttool.StatusAborted {
		t.Fatalf("child's own record %s, want aborted", ins.Status)
	}
}

func TestChatTool(t *testing.T) {
	e := start(t, demo.Options{})
	cs := e.connect(t, "/alice", nil, nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo-chat_chat", Arguments: map[string]any{"message": "hello there"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("chat failed: %+v", res.Content[0])
	}
	text := res.Content[0].(*mcp.TextContent).Text
	if !strings.Contains(text, "hello there") {
		t.Fatalf("answer %q does not echo the message", text)
	}
	a, err := e.d.Runtime.Get(context.Background(), agent.Path{{Class: "EchoChat", Name: "alice"}})
	if err != nil {
		t.Fatal(err)
	}
	// The turn ran in alice's own chat: the question and the answer are
	// in her transcript.
	msgs := a.(interface{ Messages() []message.Message }).Messages()
	if len(msgs) != 2 || msgs[0].Parts[0].Text != "hello there" {
		t.Fatalf("alice's transcript %+v", msgs)
	}
}

// rawSession is a JSON-RPC session on the endpoint spoken by hand, for
// what the Go SDK's client does not speak (MCP tasks).
type rawSession struct {
	t   *testing.T
	url string
	sid string
	n   int
}

type rpcErr struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *env) raw(t *testing.T) *rawSession {
	t.Helper()
	s := &rawSession{t: t, url: e.url + "/mcp"}
	res, rerr := s.call("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}})
	if rerr != nil {
		t.Fatalf("initialize: %+v", rerr)
	}
	var init struct {
		Capabilities struct {
			Tasks struct {
				Requests struct {
					Tools struct {
						Call *struct{} `json:"call"`
					} `json:"tools"`
				} `json:"requests"`
			} `json:"tasks"`
		} `json:"capabilities"`
	}
	if err := json.Unmarshal(res, &init); err != nil || init.Capabilities.Tasks.Requests.Tools.Call == nil {
		t.Fatalf("initialize result %s does not announce task-augmented tools/call", res)
	}
	s.post(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	return s
}

// call sends one request and returns its result or error.
func (s *rawSession) call(method string, params any) (json.RawMessage, *rpcErr) {
	s.t.Helper()
	s.n++
	body := s.post(map[string]any{"jsonrpc": "2.0", "id": s.n, "method": method, "params": params})
	var msg struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcErr         `json:"error"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		s.t.Fatalf("%s: response %q: %v", method, body, err)
	}
	return msg.Result, msg.Error
}

// post sends a message and returns the JSON of the response (the data of
// the last event, when the answer is an event stream).
func (s *rawSession) post(msg any) []byte {
	s.t.Helper()
	data, _ := json.Marshal(msg)
	req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(string(data)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	if s.sid != "" {
		req.Header.Set("Mcp-Session-Id", s.sid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
		s.sid = id
	}
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusAccepted {
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("POST %s: %d %s", data, resp.StatusCode, out)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var last []byte
		for _, line := range strings.Split(string(out), "\n") {
			if rest, ok := strings.CutPrefix(line, "data: "); ok {
				last = []byte(rest)
			}
		}
		return last
	}
	return out
}

type task struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage"`
}

func (s *rawSession) task(method string, params any) task {
	s.t.Helper()
	res, rerr := s.call(method, params)
	if rerr != nil {
		s.t.Fatalf("%s: %+v", method, rerr)
	}
	var out struct {
		task
		Task *task `json:"task"`
	}
	if err := json.Unmarshal(res, &out); err != nil {
		s.t.Fatal(err)
	}
	if out.Task != nil {
		return *out.Task
	}
	return out.task
}

func TestTaskLifecycle(t *testing.T) {
	e := start(t, demo.Options{SearchTime: 300 * time.Millisecond})
	s := e.raw(t)
	res, rerr := s.call("tools/list", map[string]any{})
	if rerr != nil || !strings.Contains(string(res), `"taskSupport":"optional"`) {
		t.Fatalf("tools/list %s %+v: the agent tools must be taskable", res, rerr)
	}
	created := s.task("tools/call", map[string]any{"name": "research", "arguments": map[string]any{"query": "tidal power"}, "task": map[string]any{"ttl": 60000}})
	if created.Status != "working" || created.TaskID == "" {
		t.Fatalf("created %+v", created)
	}
	out, rerr := s.call("tasks/result", map[string]any{"taskId": created.TaskID})
	if rerr != nil {
		t.Fatalf("tasks/result: %+v", rerr)
	}
	var result struct {
		IsError           bool `json:"isError"`
		StructuredContent struct {
			RunID  string `json:"runId"`
			Status string `json:"status"`
		} `json:"structuredContent"`
		Meta map[string]map[string]string `json:"_meta"`
	}
	if err := json.Unmarshal(out, &result); err != nil {
		t.Fatal(err)
	}
	if result.IsError || result.StructuredContent.Status != "completed" || result.Meta["io.modelcontextprotocol/related-task"]["taskId"] != created.TaskID {
		t.Fatalf("tasks/result %s", out)
	}
	if got := s.task("tasks/get", map[string]any{"taskId": created.TaskID}); got.Status != "completed" {
		t.Fatalf("tasks/get %+v", got)
	}
	list, rerr := s.call("tasks/list", map[string]any{})
	if rerr != nil || !strings.Contains(string(list), created.TaskID) {
		t.Fatalf("tasks/list %s %+v", list, rerr)
	}
	// The task is a detached run of the default Assistant, like any other.
	run, ok, err := agenttool.GetAgentToolRun(context.Background(), e.assistant(t, "default"), result.StructuredContent.RunID)
	if err != nil || !ok || run.Status != agenttool.StatusCompleted {
		t.Fatalf("registry row %+v %v %v", run, ok, err)
	}
	if _, rerr := s.call("tasks/cancel", map[string]any{"taskId": created.TaskID}); rerr == nil || rerr.Code != -32602 {
		t.Fatalf("cancel of a completed task: %+v, want -32602", rerr)
	}
}

func TestTaskCancelAndGuessedIDs(t *testing.T) {
	e := start(t, demo.Options{SearchTime: time.Hour})
	s := e.raw(t)
	created := s.task("tools/call", map[string]any{"name": "research", "arguments": map[string]any{"query": "fusion"}, "task": map[string]any{}})
	got := s.task("tasks/cancel", map[string]any{"taskId": created.TaskID})
	if got.Status != "cancelled" {
		t.Fatalf("cancelled task %+v", got)
	}
	out, rerr := s.call("tasks/result", map[string]any{"taskId": created.TaskID})
	if rerr != nil || !strings.Contains(string(out), `"isError":true`) || !strings.Contains(string(out), `"status":"aborted"`) {
		t.Fatalf("result of a cancelled task %s %+v", out, rerr)
	}
	for _, id := range []string{"", "nope", "eyJjIjoiQXNzaXN0YW50IiwiaSI6ImRlZmF1bHQiLCJyIjoibWNwLXRhc2stZ3Vlc3NlZCJ9", strings.Repeat("A", 5000)} {
		if _, rerr := s.call("tasks/get", map[string]any{"taskId": id}); rerr == nil || rerr.Code != -32602 {
			t.Fatalf("tasks/get %q: %+v, want -32602", id, rerr)
		}
	}
	// A task is not a chat tool's.
	if _, rerr := s.call("tools/call", map[string]any{"name": "assistant_chat", "arguments": map[string]any{"message": "hi"}, "task": map[string]any{}}); rerr == nil {
		t.Fatal("a task-augmented chat call was accepted")
	}
}

func TestTaskOutlivesARestart(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "agentry.db")
	e := startAt(t, dbPath, demo.Options{SearchTime: time.Hour})
	s := e.raw(t)
	created := s.task("tools/call", map[string]any{"name": "research", "arguments": map[string]any{"query": "wind farms"}, "task": map[string]any{}})
	e.stop() // the run is in flight: its child waits in its search
	e = startAt(t, dbPath, demo.Options{SearchTime: time.Millisecond})
	s = e.raw(t) // a new session: the task id is all the client kept
	out, rerr := s.call("tasks/result", map[string]any{"taskId": created.TaskID})
	if rerr != nil || !strings.Contains(string(out), `"status":"completed"`) {
		t.Fatalf("tasks/result after a restart: %s %+v", out, rerr)
	}
}

// sseEvent is one event of a response stream.
type sseEvent struct {
	id   string
	data string
}

// readEvents reads events from an event stream until stop returns true or
// the stream ends.
func readEvents(t *testing.T, body io.Reader, stop func(sseEvent) bool) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.id != "" || cur.data != "" {
				out = append(out, cur)
				if stop(cur) {
					return out
				}
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			cur.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			cur.data += strings.TrimPrefix(line, "data: ")
		}
	}
	return out
}

// TestResumeAfterADroppedStream: a client whose response stream drops
// mid-call reconnects with Last-Event-ID and gets every progress
// notification it missed and the result, each once.
func TestResumeAfterADroppedStream(t *testing.T) {
	e := start(t, demo.Options{SearchTime: 600 * time.Millisecond})
	s := e.raw(t)
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": map[string]any{
		"name": "research", "arguments": map[string]any{"query": "heat pumps"}, "_meta": map[string]any{"progressToken": "p"}}})
	req, _ := http.NewRequest(http.MethodPost, s.url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	req.Header.Set("Mcp-Session-Id", s.sid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Read up to the first progress notification, then drop the stream.
	first := readEvents(t, resp.Body, func(ev sseEvent) bool { return strings.Contains(ev.data, "notifications/progress") })
	resp.Body.Close()
	last := first[len(first)-1]
	if last.id == "" || !strings.Contains(last.data, "notifications/progress") {
		t.Fatalf("first events %+v: want a progress notification with an id", first)
	}
	// Resume. Until the server has seen the dropped connection, the
	// stream is still its POST's and the resume is answered 409 Conflict;
	// a client asks again, as this one does (with backoff, for up to 30 s).
	wait := 10 * time.Millisecond
	for deadline := time.Now().Add(30 * time.Second); ; {
		get, _ := http.NewRequest(http.MethodGet, s.url, nil)
		get.Header.Set("Accept", "text/event-stream")
		get.Header.Set("MCP-Protocol-Version", "2025-11-25")
		get.Header.Set("Mcp-Session-Id", s.sid)
		get.Header.Set("Last-Event-ID", last.id)
		resp, err = http.DefaultClient.Do(get)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		resp.Body.Close()
		time.Sleep(wait)
		wait = min(2*wait, time.Second)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume: %d", resp.StatusCode)
	}
	rest := readEvents(t, resp.Body, func(ev sseEvent) bool { return strings.Contains(ev.data, `"id":99`) })
	all := append(first, rest...)
	progress, results := 0, 0
	seen := map[string]bool{}
	for _, ev := range all {
		if ev.id != "" && seen[ev.id] {
			t.Fatalf("event %s delivered twice", ev.id)
		}
		seen[ev.id] = true
		if strings.Contains(ev.data, "notifications/progress") {
			progress++
		}
		if strings.Contains(ev.data, `"id":99`) {
			results++
			if !strings.Contains(ev.data, `"status":"completed"`) {
				t.Fatalf("result %s", ev.data)
			}
		}
	}
	if progress < 3 || results != 1 {
		t.Fatalf("%d progress notifications and %d results across the drop; want ≥ 3 and 1", progress, results)
	}
}

// TestConcurrencyCapRefusesClearly: past the parent's cap (the demo
// Assistant's 4 runs in flight), a task is a JSON-RPC error and an awaited
// call a tool error, each naming the cap; neither leaves a run behind.
func TestConcurrencyCapRefusesClearly(t *testing.T) {
	e := start(t, demo.Options{SearchTime: time.Hour})
	s := e.raw(t)
	for i := range 4 {
		s.task("tools/call", map[string]any{"name": "research", "arguments": map[string]any{"query": fmt.Sprint("topic ", i)}, "task": map[string]any{}})
	}
	_, rerr := s.call("tools/call", map[string]any{"name": "research", "arguments": map[string]any{"query": "one more"}, "task": map[string]any{}})
	if rerr == nil || !strings.Contains(rerr.Message, "maxConcurrentAgentTools") {
		t.Fatalf("fifth task: %+v; want the cap's refusal", rerr)
	}
	res, rerr := s.call("tools/call", map[string]any{"name": "research", "arguments": map[string]any{"query": "one more"}})
	if rerr != nil || !strings.Contains(string(res), `"isError":true`) || !strings.Contains(string(res), "maxConcurrentAgentTools") {
		t.Fatalf("awaited call past the cap: %s %+v", res, rerr)
	}
	runs, err := agenttool.ListAgentToolRuns(context.Background(), e.assistant(t, "default"))
	if err != nil || len(runs) != 4 {
		t.Fatalf("%d runs (%v); want the 4 tasks only", len(runs), err)
	}
}
