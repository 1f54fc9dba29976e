// Package mcpserver serves the public agents of a runtime as a Model
// Context Protocol server: one more front door to the same runtime, beside
// the WebSocket and HTTP routes of package server, with the same
// authentication, origin check and limits (the reference's McpAgent).
//
// The endpoint speaks streamable HTTP through the official Go SDK
// (github.com/modelcontextprotocol/go-sdk). Every public chat class
// contributes its agent tools (those built with agenttool.AgentTool) and
// a "chat" tool. Calling an agent tool starts a real agent-tool run under
// the endpoint's instance: it is in the parent's registry, its clients
// see it live, and it can be inspected, drilled into and cleared like any
// run. A call that carries a progress token gets the child's progress
// snapshots and milestones as notifications/progress; a cancelled call
// aborts the run and its child. A task-augmented call (MCP tasks) starts a
// detached run, which survives a restart of the server; tasks/get,
// tasks/result, tasks/cancel and tasks/list read and steer it. See
// docs/mcp.md.
package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/ids"
	"github.com/agentry/agentry/server"
)

// Options configure a Handler.
type Options struct {
	// Runtime hosts the agents. Required.
	Runtime *agent.Runtime
	// Front is the runtime's HTTP server: its Authenticate and Authorize
	// hooks admit every MCP request (for the instance the request
	// addresses) and every tool call (for the instance the call runs in),
	// and its origin rule refuses browser pages of other origins.
	// Required.
	Front *server.Server
	// Prefix is the URL path the endpoint is mounted at; "" means "/mcp".
	// A request to Prefix runs in the DefaultInstance, one to
	// Prefix/{name} in the instance name (escaped as a path segment).
	Prefix string
	// DefaultInstance is the instance of the endpoint at Prefix itself; ""
	// means "default", the playground's.
	DefaultInstance string
	// MaxBodyBytes bounds one request body; a larger one is refused with
	// 413. Zero means 1 MiB.
	MaxBodyBytes int64
	// MaxSessions bounds the open MCP sessions; an initialize past it is
	// refused with 503 and Retry-After. Zero means 1,000.
	MaxSessions int
	// SessionTimeout closes a session idle this long; zero means 30
	// minutes.
	SessionTimeout time.Duration
	// ReplayBytes bounds the memory that keeps a session's recent
	// messages for a client that resumes a dropped stream (Last-Event-ID);
	// zero means 16 MiB for all sessions together.
	ReplayBytes int
	// Logger receives the endpoint's logs; nil means the runtime's.
	Logger *slog.Logger
}

// The defaults of Options.
const (
	DefaultMaxBodyBytes   = 1 << 20
	DefaultMaxSessions    = 1000
	DefaultSessionTimeout = 30 * time.Minute
	DefaultReplayBytes    = 16 << 20
)

// Handler is the MCP endpoint of a runtime, an http.Handler to mount at
// /mcp.
type Handler struct {
	opts  Options
	rt    *agent.Runtime
	front *server.Server
	log   *slog.Logger

	once    sync.Once
	initErr error
	tools   []entry
	byName  map[string]entry
	// taskClasses are the classes with agent tools (agentToolClasses).
	taskClasses []string
	srv         *mcp.Server
	built       atomic.Pointer[mcp.Server] // srv, for Close, which may race the first request
	stream      *mcp.StreamableHTTPHandler
	tasks       *tasks
}

// New returns the MCP endpoint of opts.Runtime. The tool list is read from
// the registered classes at the first request, so New may be called
// before the classes are registered.
func New(opts Options) *Handler {
	if opts.DefaultInstance == "" {
		opts.DefaultInstance = "default"
	}
	if opts.Prefix == "" {
		opts.Prefix = "/mcp"
	}
	opts.Prefix = "/" + strings.Trim(opts.Prefix, "/")
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.SessionTimeout <= 0 {
		opts.SessionTimeout = DefaultSessionTimeout
	}
	if opts.ReplayBytes <= 0 {
		opts.ReplayBytes = DefaultReplayBytes
	}
	if opts.Logger == nil {
		opts.Logger = opts.Runtime.Logger()
	}
	return &Handler{opts: opts, rt: opts.Runtime, front: opts.Front, log: opts.Logger}
}

// init builds the tool catalog and the SDK's server once.
func (h *Handler) init() error {
	h.once.Do(func() {
		tools, err := catalog(h.rt)
		if err != nil {
			h.initErr = err
			return
		}
		h.tools = tools
		h.taskClasses = agentToolClasses(tools)
		h.byName = make(map[string]entry, len(tools))
		sdkLog := slog.New(quiet{h.log.Handler()})
		srv := mcp.NewServer(&mcp.Implementation{Name: "agentry", Title: "Agentry", Version: "0.1"}, &mcp.ServerOptions{
			Logger:       sdkLog,
			Instructions: "Agentry agents. Agent tools run a helper agent and report its progress; chat tools talk to an agent instance.",
		})
		for _, e := range tools {
			schema, err := e.inputSchema()
			if err != nil {
				h.initErr = err
				return
			}
			h.byName[e.name] = e
			t := &mcp.Tool{Name: e.name, Description: e.description(), InputSchema: schema, Title: e.tool.Title}
			srv.AddTool(t, h.toolHandler(e))
		}
		h.srv = srv
		h.built.Store(srv)
		store := mcp.NewMemoryEventStore(nil)
		store.SetMaxBytes(h.opts.ReplayBytes)
		h.stream = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
			Logger:              sdkLog,
			EventStore:          store,
			SessionTimeout:      h.opts.SessionTimeout,
			MaxRequestBodyBytes: h.opts.MaxBodyBytes,
		})
		h.tasks = &tasks{h: h}
	})
	return h.initErr
}

// urlHeader carries the endpoint URL of the request to its tool calls.
const urlHeader = "X-Agentry-Mcp-Url"

// ServeHTTP serves one MCP request: it checks the origin, admits the caller
// for the endpoint's instance, then hands the request to the SDK's
// streamable HTTP transport (or, for MCP tasks, which the SDK does not
// implement, answers it here).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.init(); err != nil {
		h.log.Error("mcpserver: tools", "err", err)
		writeRPCError(w, http.StatusInternalServerError, &rpcError{Code: codeInternal, Message: "MCP endpoint misconfigured"})
		return
	}
	if !h.front.OriginAllowed(r) {
		writeRPCError(w, http.StatusForbidden, &rpcError{Code: codeInvalidRequest, Message: "origin not allowed"})
		return
	}
	instance, ok := h.instanceOf(r.URL.EscapedPath())
	if !ok {
		writeRPCError(w, http.StatusBadRequest, &rpcError{Code: codeInvalidRequest, Message: "malformed instance name"})
		return
	}
	r, err := h.front.Admit(r, h.endpointPath(instance))
	if err != nil {
		status, msg := server.RefusalStatus(err)
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentry"`)
		}
		writeRPCError(w, status, &rpcError{Code: codeInvalidRequest, Message: msg})
		return
	}
	// The SDK hands a tool call the headers of the request that carried
	// it, not the request: the endpoint's URL travels in a header of ours
	// (any value the client sent under that name is replaced), so that a
	// call is admitted again for the instance it runs in with what
	// admitted the request.
	r.Header.Set(urlHeader, r.URL.RequestURI())
	if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" && h.sessions() >= h.opts.MaxSessions {
		w.Header().Set("Retry-After", "5")
		writeRPCError(w, http.StatusServiceUnavailable, &rpcError{Code: codeInvalidRequest, Message: "too many MCP sessions, try again later"})
		return
	}
	h.tasks.serve(w, r, h.stream)
}

// instanceOf returns the instance an escaped URL path addresses: the
// default one at Prefix, name at Prefix/{name}.
func (h *Handler) instanceOf(escapedPath string) (string, bool) {
	rest, ok := strings.CutPrefix(escapedPath, h.opts.Prefix)
	if !ok {
		return "", false
	}
	rest = strings.TrimPrefix(rest, "/")
	if rest == "" {
		return h.opts.DefaultInstance, true
	}
	name, err := url.PathUnescape(rest)
	if err != nil || !validInstance(name) {
		return "", false
	}
	return name, true
}

// Route returns the instance a request to the endpoint runs in (for a
// cluster's router, which sends the request to that instance's owner, so
// that an MCP session lives where its instance does); ok is false for a
// path outside the endpoint.
func (h *Handler) Route(escapedPath string) (path agent.Path, ok bool) {
	if escapedPath != h.opts.Prefix && !strings.HasPrefix(escapedPath, h.opts.Prefix+"/") {
		return nil, false
	}
	if h.init() != nil {
		return nil, false
	}
	instance, ok := h.instanceOf(escapedPath)
	if !ok {
		return nil, false
	}
	return h.endpointPath(instance), true
}

// sessions counts the open sessions.
func (h *Handler) sessions() int {
	n := 0
	for range h.srv.Sessions() {
		n++
	}
	return n
}

// endpointPath is the path of the instance a request addresses: the first
// public chat class's instance of that name (the authorization hooks see a
// real instance path).
func (h *Handler) endpointPath(instance string) agent.Path {
	class := ""
	if len(h.taskClasses) > 0 {
		class = h.taskClasses[0]
	} else if len(h.tools) > 0 {
		class = h.tools[0].class
	}
	return agent.Path{{Class: class, Name: instance}}
}

// Close ends every MCP session. Runs they started go on (a detached run
// to its end; an awaited one is aborted by its call's end).
func (h *Handler) Close() error {
	srv := h.built.Load()
	if srv == nil {
		return nil
	}
	for ss := range srv.Sessions() {
		_ = ss.Close()
	}
	return nil
}

// call is what a tool call needs to know about the request that carried
// it.
type call struct {
	req      *http.Request // the request, rebuilt from its headers
	instance string        // the endpoint's instance
}

func (h *Handler) callOf(req *mcp.CallToolRequest) (call, error) {
	if req.Extra == nil || req.Extra.Header == nil {
		return call{}, errors.New("mcpserver: call without its request")
	}
	u, err := url.ParseRequestURI(req.Extra.Header.Get(urlHeader))
	if err != nil {
		return call{}, fmt.Errorf("mcpserver: call without its request: %w", err)
	}
	inst, ok := h.instanceOf(u.EscapedPath())
	if !ok {
		return call{}, errors.New("mcpserver: call without its instance")
	}
	r := &http.Request{Method: http.MethodPost, URL: u, RequestURI: u.RequestURI(), Header: req.Extra.Header.Clone(), Host: u.Host}
	return call{req: r.WithContext(context.Background()), instance: inst}, nil
}

// target admits a call for the instance it runs in and returns the
// instance's path and a context carrying the caller's identity.
func (h *Handler) target(ctx context.Context, c call, class, instance string) (agent.Path, context.Context, error) {
	if instance == "" {
		instance = c.instance
	}
	if !validInstance(instance) {
		return nil, ctx, fmt.Errorf("malformed instance name %q", instance)
	}
	path := agent.Path{{Class: class, Name: instance}}
	r, err := h.front.Admit(c.req, path)
	if err != nil {
		_, msg := server.RefusalStatus(err)
		return nil, ctx, fmt.Errorf("not allowed: %s", msg)
	}
	if id, ok := agent.IdentityFrom(r.Context()); ok {
		ctx = agent.WithIdentity(ctx, id)
	}
	return path, ctx, nil
}

// toolHandler returns the SDK handler of a catalog entry.
func (h *Handler) toolHandler(e entry) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		c, err := h.callOf(req)
		if err != nil {
			return nil, err
		}
		raw := req.Params.Arguments
		if len(raw) == 0 || string(raw) == "null" {
			raw = json.RawMessage(`{}`)
		}
		if err := e.tool.Validate(raw); err != nil {
			return toolError(err.Error()), nil
		}
		if e.isChat {
			return h.callChat(ctx, req, c, e, raw)
		}
		path, ctx, err := h.target(ctx, c, e.class, "")
		if err != nil {
			return toolError(err.Error()), nil
		}
		var relay *progressRelay
		if tok := req.Params.GetProgressToken(); tok != nil {
			relay = newProgressRelay(ctx, h.rt, req.Session, tok)
			defer relay.close()
		}
		res, err := h.runAgentTool(ctx, path, e, raw, "mcp-"+ids.Random(), relay, nil)
		if err != nil {
			return nil, err
		}
		relay.close() // every notification goes before the result
		return resultOf(res), nil
	}
}

// runAgentTool dispatches an agent-tool run of e under the instance at
// path and, unless detached is set, waits for its end. relay, when set,
// gets the run's progress signals.
func (h *Handler) runAgentTool(ctx context.Context, path agent.Path, e entry, input json.RawMessage, runID string,
	relay *progressRelay, detached *agenttool.DetachedOptions) (agenttool.Result, error) {
	parent, release, err := h.rt.Acquire(ctx, path)
	if err != nil {
		return agenttool.Result{}, h.instanceError(path, err)
	}
	defer release()
	if relay != nil {
		stop, err := agenttool.WatchRun(parent, runID, relay.offer)
		if err != nil {
			return agenttool.Result{}, err
		}
		defer stop()
	}
	var res agenttool.Result
	err = agent.Enter(ctx, parent, func(ctx context.Context) error {
		var err error
		res, err = agenttool.RunAgentTool(ctx, parent, e.info.Class, agenttool.RunOptions{
			Input: input, RunID: runID, Display: e.info.Display, Tokens: e.info.Tokens, Detached: detached,
		})
		return err
	})
	if err != nil {
		var ce *agenttool.CapError
		if errors.As(err, &ce) {
			return agenttool.Result{RunID: runID, AgentType: e.info.Class, Status: agenttool.StatusError, Error: ce.Error()}, nil
		}
		return agenttool.Result{}, fmt.Errorf("mcpserver: run %s: %w", e.name, err)
	}
	return res, nil
}

// instanceError explains a failure to reach an instance.
func (h *Handler) instanceError(path agent.Path, err error) error {
	if errors.Is(err, agent.ErrNotOwner) {
		return fmt.Errorf("mcpserver: %s is served by another node now; try again: %w", path, err)
	}
	return fmt.Errorf("mcpserver: reach %s: %w", path, err)
}

// callChat sends the call's message to a chat instance and returns the
// answer of the turn it starts.
func (h *Handler) callChat(ctx context.Context, req *mcp.CallToolRequest, c call, e entry, raw json.RawMessage) (*mcp.CallToolResult, error) {
	var in chatInput
	if err := json.Unmarshal(raw, &in); err != nil {
		return toolError("invalid input: " + err.Error()), nil
	}
	path, ctx, err := h.target(ctx, c, e.class, in.Instance)
	if err != nil {
		return toolError(err.Error()), nil
	}
	a, release, err := h.rt.Acquire(ctx, path)
	if err != nil {
		return nil, h.instanceError(path, err)
	}
	defer release()
	ch := a.(chatter)
	msg := message.Message{ID: "mcp-" + ids.Random(), Role: message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: in.Message}}}
	var tr chat.TurnResult
	err = agent.Enter(ctx, a, func(ctx context.Context) error {
		id, err := ch.SubmitMessages(ctx, []message.Message{msg}, chat.SubmitOptions{})
		if err != nil {
			return err
		}
		tr, err = ch.WaitTurn(ctx, id)
		if err != nil && ctx.Err() != nil {
			ch.CancelTurn(id)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("mcpserver: chat with %s: %w", path, err)
	}
	text := answerText(tr.Message)
	out := map[string]any{"turnId": tr.ID, "outcome": tr.Outcome, "answer": text, "messageId": tr.Message.ID}
	if tr.Error != "" {
		out["error"] = tr.Error
	}
	if u := tr.TreeUsage; u != (chat.Usage{}) {
		out["usage"] = u
	}
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: out}
	if tr.Outcome != chat.OutcomeCompleted {
		res.IsError = true
		if text == "" {
			res.Content = []mcp.Content{&mcp.TextContent{Text: "the turn ended " + tr.Outcome + ": " + tr.Error}}
		}
	}
	return res, nil
}

// answerText joins the text parts of an assistant message.
func answerText(m message.Message) string {
	var s string
	for _, p := range m.Parts {
		if p.Type == message.PartText && p.Text != "" {
			if s != "" {
				s += "\n\n"
			}
			s += p.Text
		}
	}
	return s
}

// resultOf maps a run's result to the MCP tool result: the summary as
// text, and the run's record as structured content.
func resultOf(r agenttool.Result) *mcp.CallToolResult {
	out := map[string]any{"runId": r.RunID, "agentType": r.AgentType, "status": r.Status, "summary": r.Summary}
	if len(r.Output) > 0 {
		out["output"] = r.Output
	}
	if r.Error != "" {
		out["error"] = r.Error
	}
	if r.Reason != "" {
		out["reason"] = r.Reason
	}
	if r.Usage != nil {
		out["usage"] = r.Usage
	}
	res := &mcp.CallToolResult{StructuredContent: out}
	if r.Status == agenttool.StatusCompleted {
		res.Content = []mcp.Content{&mcp.TextContent{Text: r.Summary}}
		return res
	}
	text := fmt.Sprintf("The %s run %s ended %s", r.AgentType, r.RunID, r.Status)
	if r.Error != "" {
		text += ": " + r.Error
	}
	res.Content = []mcp.Content{&mcp.TextContent{Text: text}}
	res.IsError = true
	return res
}

// toolError is a tool result that reports an error the model can read.
func toolError(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: true}
}

// quiet passes on the SDK's warnings and errors only: it logs every
// session's connection at Info, which a busy endpoint would repeat for
// each client.
type quiet struct{ slog.Handler }

func (q quiet) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && q.Handler.Enabled(ctx, l)
}

func (q quiet) WithAttrs(attrs []slog.Attr) slog.Handler { return quiet{q.Handler.WithAttrs(attrs)} }

func (q quiet) WithGroup(name string) slog.Handler { return quiet{q.Handler.WithGroup(name)} }
