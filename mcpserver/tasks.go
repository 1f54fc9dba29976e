package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/ids"
)

// MCP tasks (task-augmented tools/call, tasks/get, tasks/result,
// tasks/cancel, tasks/list; protocol revision 2025-11-25) are detached
// agent-tool runs. The official Go SDK does not implement them yet, so the
// endpoint answers those requests itself, in front of the SDK's transport,
// and adds what announces them to the SDK's answers: the tasks capability
// to initialize, and execution.taskSupport "optional" to the agent tools of
// tools/list. Everything else about a session (its id, its streams,
// resumption) stays the SDK's.

// taskRunPrefix starts the run id of every run an MCP task started.
const taskRunPrefix = "mcp-task-"

// taskPollMillis is the poll interval suggested to clients.
const taskPollMillis = 1000

// taskPageSize is the page size of tasks/list.
const taskPageSize = 50

// JSON-RPC error codes.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeMethodNotFound = -32601
	codeInvalidParams  = -32602
	codeInternal       = -32603
)

// tasks answers the MCP task methods.
type tasks struct {
	h *Handler
}

// rpcRequest is a JSON-RPC request as the endpoint reads it.
type rpcRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Message }

// serve answers r if it is a task request, and hands it to next otherwise.
func (t *tasks) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if r.Method != http.MethodPost {
		next.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, t.h.opts.MaxBodyBytes+1))
	if err != nil {
		writeRPCError(w, http.StatusBadRequest, &rpcError{Code: codeParseError, Message: "read body: " + err.Error()})
		return
	}
	if int64(len(body)) > t.h.opts.MaxBodyBytes {
		writeRPCError(w, http.StatusRequestEntityTooLarge, &rpcError{Code: codeInvalidRequest,
			Message: fmt.Sprintf("request body over %d bytes", t.h.opts.MaxBodyBytes)})
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if !json.Valid(body) {
		writeRPCError(w, http.StatusBadRequest, &rpcError{Code: codeParseError, Message: "parse error: the body is not JSON"})
		return
	}
	var req rpcRequest
	if json.Unmarshal(body, &req) != nil || req.JSONRPC != "2.0" || len(req.ID) == 0 {
		// Not one request (a notification, a response, a batch, or JSON
		// that is no JSON-RPC): the SDK answers it, and a refusal it
		// answers in plain text becomes a JSON-RPC error.
		asRPCErrors(w, r, next)
		return
	}
	if c := req.ID[0]; c != '"' && c != '-' && (c < '0' || c > '9') {
		writeRPCError(w, http.StatusBadRequest, &rpcError{Code: codeInvalidRequest, Message: "a request id is a string or a number"})
		return
	}
	switch req.Method {
	case "initialize":
		rewrite(w, r, next, req.ID, addTasksCapability)
		return
	case "tools/list":
		rewrite(w, r, next, req.ID, t.addTaskSupport)
		return
	case "tools/call":
		var p struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
			Task      json.RawMessage `json:"task"`
		}
		if json.Unmarshal(req.Params, &p) != nil || len(p.Task) == 0 || string(p.Task) == "null" {
			next.ServeHTTP(w, r)
			return
		}
		t.answer(w, r, req, func(ctx context.Context, c call) (any, error) { return t.create(ctx, c, p.Name, p.Arguments) })
	case "tasks/get":
		t.answer(w, r, req, func(ctx context.Context, c call) (any, error) { return t.onTask(t.get)(ctx, c, req.Params) })
	case "tasks/result":
		t.answer(w, r, req, func(ctx context.Context, c call) (any, error) { return t.onTask(t.result)(ctx, c, req.Params) })
	case "tasks/cancel":
		t.answer(w, r, req, func(ctx context.Context, c call) (any, error) { return t.onTask(t.cancel)(ctx, c, req.Params) })
	case "tasks/list":
		t.answer(w, r, req, func(ctx context.Context, c call) (any, error) { return t.list(ctx, c, req.Params) })
	default:
		next.ServeHTTP(w, r)
	}
}

// answer checks the request's session, runs fn and writes its JSON-RPC
// response.
func (t *tasks) answer(w http.ResponseWriter, r *http.Request, req rpcRequest, fn func(context.Context, call) (any, error)) {
	sid := r.Header.Get("Mcp-Session-Id")
	if sid == "" {
		writeRPCError(w, http.StatusBadRequest, &rpcError{Code: codeInvalidRequest, Message: "missing session id (Mcp-Session-Id)"})
		return
	}
	known := false
	for ss := range t.h.srv.Sessions() {
		known = known || ss.ID() == sid
	}
	if !known {
		writeRPCError(w, http.StatusNotFound, &rpcError{Code: codeInvalidRequest, Message: "session not found"})
		return
	}
	inst, _ := t.h.instanceOf(r.URL.EscapedPath()) // checked by ServeHTTP
	c := call{req: r, instance: inst}
	res, err := fn(r.Context(), c)
	out := map[string]any{"jsonrpc": "2.0", "id": req.ID}
	if err != nil {
		var re *rpcError
		if !errors.As(err, &re) {
			re = &rpcError{Code: codeInternal, Message: err.Error()}
		}
		out["error"] = re
	} else {
		out["result"] = res
	}
	data, err := json.Marshal(out)
	if err != nil {
		writeRPCError(w, http.StatusInternalServerError, &rpcError{Code: codeInternal, Message: "encode response"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Mcp-Session-Id", sid)
	_, _ = w.Write(data)
}

// asRPCErrors serves r with next and turns an error answered in plain
// text into a JSON-RPC error with the same status. Only messages that are
// not requests go through it; their answers are short.
func asRPCErrors(w http.ResponseWriter, r *http.Request, next http.Handler) {
	buf := &bufferedWriter{header: http.Header{}}
	next.ServeHTTP(buf, r)
	if buf.status >= 400 && !strings.HasPrefix(buf.header.Get("Content-Type"), "application/json") {
		writeRPCError(w, buf.status, &rpcError{Code: codeInvalidRequest, Message: strings.TrimSpace(buf.body.String())})
		return
	}
	for k, v := range buf.header {
		w.Header()[k] = v
	}
	if buf.status == 0 {
		buf.status = http.StatusOK
	}
	w.WriteHeader(buf.status)
	_, _ = w.Write(buf.body.Bytes())
}

// writeRPCError answers a request that was not read as JSON-RPC with a
// JSON-RPC error (id null) and an HTTP status.
func writeRPCError(w http.ResponseWriter, status int, e *rpcError) {
	data, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil, "error": e})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// taskRef names a task's run: the class and instance of the parent, and
// the run id. A task id is its opaque encoding.
type taskRef struct {
	Class    string `json:"c"`
	Instance string `json:"i"`
	RunID    string `json:"r"`
}

func (ref taskRef) id() string {
	data, _ := json.Marshal(ref)
	return base64.RawURLEncoding.EncodeToString(data)
}

// parseTask decodes a task id; a malformed or guessed id is an
// invalid-params error that names no run.
func (t *tasks) parseTask(raw json.RawMessage) (taskRef, error) {
	var p struct {
		TaskID string `json:"taskId"`
	}
	bad := &rpcError{Code: codeInvalidParams, Message: "unknown task"}
	if json.Unmarshal(raw, &p) != nil || p.TaskID == "" || len(p.TaskID) > 1024 {
		return taskRef{}, bad
	}
	data, err := base64.RawURLEncoding.DecodeString(p.TaskID)
	if err != nil {
		return taskRef{}, bad
	}
	var ref taskRef
	if json.Unmarshal(data, &ref) != nil || !strings.HasPrefix(ref.RunID, taskRunPrefix) || !validInstance(ref.Instance) {
		return taskRef{}, bad
	}
	if !slices.Contains(t.h.taskClasses, ref.Class) {
		return taskRef{}, bad
	}
	return ref, nil
}

// create starts the detached run of a task-augmented tools/call.
func (t *tasks) create(ctx context.Context, c call, name string, args json.RawMessage) (any, error) {
	e, ok := t.h.byName[name]
	if !ok {
		return nil, &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("unknown tool %q", name)}
	}
	if e.isChat {
		return nil, &rpcError{Code: codeMethodNotFound, Message: fmt.Sprintf("tool %q does not support tasks", name)}
	}
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	if err := e.tool.Validate(args); err != nil {
		return nil, &rpcError{Code: codeInvalidParams, Message: err.Error()}
	}
	path, ctx, err := t.h.target(ctx, c, e.class, "")
	if err != nil {
		return nil, &rpcError{Code: codeInvalidRequest, Message: err.Error()}
	}
	ref := taskRef{Class: e.class, Instance: path[0].Name, RunID: taskRunPrefix + ids.Random()}
	// The run outlives the request that starts it.
	res, err := t.h.runAgentTool(context.WithoutCancel(ctx), path, e, args, ref.RunID, nil, &agenttool.DetachedOptions{})
	if err != nil {
		return nil, err
	}
	run, err := t.run(ctx, path, ref.RunID)
	if err != nil {
		var re *rpcError
		if errors.As(err, &re) && res.Error != "" {
			// Refused before it was recorded (the parent's concurrency
			// cap): there is no task.
			return nil, &rpcError{Code: codeInternal, Message: res.Error}
		}
		return nil, err
	}
	return map[string]any{"task": taskOf(ref, run)}, nil
}

// parent returns the instance a task runs under, admitted for the
// caller.
func (t *tasks) parent(ctx context.Context, c call, ref taskRef) (agent.Agent, func(), context.Context, error) {
	if ref.Instance != c.instance {
		// A task is read through the endpoint of its instance.
		return nil, nil, ctx, &rpcError{Code: codeInvalidParams, Message: "unknown task"}
	}
	path, ctx, err := t.h.target(ctx, c, ref.Class, ref.Instance)
	if err != nil {
		return nil, nil, ctx, &rpcError{Code: codeInvalidRequest, Message: err.Error()}
	}
	a, release, err := t.h.rt.Acquire(ctx, path)
	if err != nil {
		return nil, nil, ctx, t.h.instanceError(path, err)
	}
	return a, release, ctx, nil
}

// run reads a task's registry row.
func (t *tasks) run(ctx context.Context, path agent.Path, runID string) (agenttool.Run, error) {
	a, release, err := t.h.rt.Acquire(ctx, path)
	if err != nil {
		return agenttool.Run{}, t.h.instanceError(path, err)
	}
	defer release()
	return t.row(ctx, a, runID)
}

func (t *tasks) row(ctx context.Context, a agent.Agent, runID string) (agenttool.Run, error) {
	run, ok, err := agenttool.GetAgentToolRun(ctx, a, runID)
	if err != nil {
		return agenttool.Run{}, fmt.Errorf("mcpserver: read task: %w", err)
	}
	if !ok {
		return agenttool.Run{}, &rpcError{Code: codeInvalidParams, Message: "unknown task"}
	}
	return run, nil
}

// taskOp is a task method past its preamble: it gets the task's parent
// (admitted for the caller, pinned while the method runs), the task's
// reference and its registry row.
type taskOp func(ctx context.Context, a agent.Agent, ref taskRef, run agenttool.Run) (any, error)

// onTask returns the method that parses a request's task id, reaches the
// task's parent and reads its row, then runs op.
func (t *tasks) onTask(op taskOp) func(context.Context, call, json.RawMessage) (any, error) {
	return func(ctx context.Context, c call, params json.RawMessage) (any, error) {
		ref, err := t.parseTask(params)
		if err != nil {
			return nil, err
		}
		a, release, ctx, err := t.parent(ctx, c, ref)
		if err != nil {
			return nil, err
		}
		defer release()
		run, err := t.row(ctx, a, ref.RunID)
		if err != nil {
			return nil, err
		}
		return op(ctx, a, ref, run)
	}
}

// get answers tasks/get.
func (t *tasks) get(_ context.Context, _ agent.Agent, ref taskRef, run agenttool.Run) (any, error) {
	return taskOf(ref, run), nil
}

// result answers tasks/result: it waits for the task's run to end and
// returns its tool result.
func (t *tasks) result(ctx context.Context, a agent.Agent, ref taskRef, run agenttool.Run) (any, error) {
	ended := make(chan struct{}, 1)
	stop, err := agenttool.WatchRun(a, ref.RunID, func(ev agenttool.Event) {
		if ev.Kind != "chunk" && ev.Kind != "started" {
			select {
			case ended <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	// Read again now that the end is watched: an end between the first
	// read and the watch would otherwise wait for the poll.
	if run, err = t.row(ctx, a, ref.RunID); err != nil {
		return nil, err
	}
	clock := t.h.rt.Clock()
	for {
		if run.Status.Hard() || run.Status == agenttool.StatusInterrupted {
			res := resultOf(run.Result())
			res.Meta = map[string]any{"io.modelcontextprotocol/related-task": map[string]any{"taskId": ref.id()}}
			return res, nil
		}
		// The end is watched here when this process follows the run, and
		// polled otherwise (a run followed by another node).
		timer := clock.NewTimer(taskPollMillis * time.Millisecond)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-ended:
			timer.Stop()
		case <-timer.Chan():
		}
		if run, err = t.row(ctx, a, ref.RunID); err != nil {
			return nil, err
		}
	}
}

// cancel answers tasks/cancel: it aborts the task's run.
func (t *tasks) cancel(ctx context.Context, a agent.Agent, ref taskRef, run agenttool.Run) (any, error) {
	if !run.Status.Active() {
		return nil, &rpcError{Code: codeInvalidParams, Message: "task is already " + taskStatus(run.Status)}
	}
	err := agent.Enter(ctx, a, func(ctx context.Context) error {
		return agenttool.CancelAgentTool(ctx, a, ref.RunID, "cancelled by the MCP client")
	})
	if err != nil {
		return nil, fmt.Errorf("mcpserver: cancel task: %w", err)
	}
	if run, err = t.row(ctx, a, ref.RunID); err != nil {
		return nil, err
	}
	return taskOf(ref, run), nil
}

// list returns the tasks of the endpoint's instance, newest last, a page
// at a time.
func (t *tasks) list(ctx context.Context, c call, params json.RawMessage) (any, error) {
	var p struct {
		Cursor string `json:"cursor"`
	}
	if len(params) > 0 && json.Unmarshal(params, &p) != nil {
		return nil, &rpcError{Code: codeInvalidParams, Message: "malformed params"}
	}
	from := 0
	if p.Cursor != "" {
		n, err := strconv.Atoi(p.Cursor)
		if err != nil || n < 0 {
			return nil, &rpcError{Code: codeInvalidParams, Message: "invalid cursor"}
		}
		from = n
	}
	out := map[string]any{"tasks": []any{}}
	var all []any
	for _, class := range t.h.taskClasses {
		ref := taskRef{Class: class, Instance: c.instance}
		a, release, ctx, err := t.parent(ctx, c, ref)
		if err != nil {
			return nil, err
		}
		runs, err := agenttool.ListAgentToolRuns(ctx, a)
		release()
		if err != nil {
			return nil, fmt.Errorf("mcpserver: list tasks: %w", err)
		}
		for _, run := range runs {
			if strings.HasPrefix(run.RunID, taskRunPrefix) {
				ref.RunID = run.RunID
				all = append(all, taskOf(ref, run))
			}
		}
	}
	if from < len(all) {
		end := min(from+taskPageSize, len(all))
		out["tasks"] = all[from:end]
		if end < len(all) {
			out["nextCursor"] = strconv.Itoa(end)
		}
	}
	return out, nil
}

// taskOf maps a registry row to an MCP task.
func taskOf(ref taskRef, run agenttool.Run) map[string]any {
	updated := run.StartedAt
	if run.CompletedAt != nil {
		updated = *run.CompletedAt
	}
	task := map[string]any{
		"taskId":        ref.id(),
		"status":        taskStatus(run.Status),
		"ttl":           nil, // kept until the run is cleared
		"createdAt":     run.StartedAt.UTC().Format(time.RFC3339Nano),
		"lastUpdatedAt": updated.UTC().Format(time.RFC3339Nano),
		"pollInterval":  taskPollMillis,
	}
	switch {
	case run.Error != "":
		task["statusMessage"] = run.Error
	case run.Status.Active():
		task["statusMessage"] = "running " + run.AgentType
	}
	return task
}

// taskStatus maps a run status to a task status.
func taskStatus(s agenttool.Status) string {
	switch s {
	case agenttool.StatusCompleted:
		return "completed"
	case agenttool.StatusAborted:
		return "cancelled"
	case agenttool.StatusError, agenttool.StatusInterrupted:
		return "failed"
	default:
		return "working"
	}
}

// addTasksCapability announces tasks in an initialize result.
func addTasksCapability(result map[string]any) {
	caps, _ := result["capabilities"].(map[string]any)
	if caps == nil {
		caps = map[string]any{}
		result["capabilities"] = caps
	}
	caps["tasks"] = map[string]any{
		"list":     map[string]any{},
		"cancel":   map[string]any{},
		"requests": map[string]any{"tools": map[string]any{"call": map[string]any{}}},
	}
}

// addTaskSupport marks the agent tools of a tools/list result as taskable.
func (t *tasks) addTaskSupport(result map[string]any) {
	list, _ := result["tools"].([]any)
	for _, x := range list {
		tool, _ := x.(map[string]any)
		name, _ := tool["name"].(string)
		if e, ok := t.h.byName[name]; ok && !e.isChat {
			tool["execution"] = map[string]any{"taskSupport": "optional"}
		}
	}
}

// rewrite serves r with next and edits the result of the response to
// request id with edit, whether the SDK answered with JSON or with an
// event stream. Only short answers (initialize, tools/list) go through it.
func rewrite(w http.ResponseWriter, r *http.Request, next http.Handler, id json.RawMessage, edit func(map[string]any)) {
	buf := &bufferedWriter{header: http.Header{}}
	next.ServeHTTP(buf, r)
	for k, v := range buf.header {
		w.Header()[k] = v
	}
	body := buf.body.Bytes()
	if buf.status == 0 {
		buf.status = http.StatusOK
	}
	if buf.status == http.StatusOK {
		if strings.HasPrefix(buf.header.Get("Content-Type"), "text/event-stream") {
			body = rewriteEvents(body, id, edit)
		} else {
			body = rewriteMessage(body, id, edit)
		}
		w.Header().Del("Content-Length")
	}
	w.WriteHeader(buf.status)
	_, _ = w.Write(body)
}

// rewriteMessage edits the result of a JSON-RPC response to id.
func rewriteMessage(data []byte, id json.RawMessage, edit func(map[string]any)) []byte {
	var msg map[string]any
	if json.Unmarshal(data, &msg) != nil {
		return data
	}
	got, _ := json.Marshal(msg["id"])
	result, ok := msg["result"].(map[string]any)
	if !ok || !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(id)) {
		return data
	}
	edit(result)
	out, err := json.Marshal(msg)
	if err != nil {
		return data
	}
	return out
}

// rewriteEvents edits the response to id in an event stream.
func rewriteEvents(data []byte, id json.RawMessage, edit func(map[string]any)) []byte {
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), len(data)+1)
	for sc.Scan() {
		line := sc.Bytes()
		if rest, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			out.WriteString("data: ")
			out.Write(rewriteMessage(rest, id, edit))
			out.WriteByte('\n')
			continue
		}
		out.Write(line)
		out.WriteByte('\n')
	}
	return out.Bytes()
}

// bufferedWriter collects a response.
type bufferedWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// Flush is a no-op: the answer is sent whole.
func (b *bufferedWriter) Flush() {}
