// Package server exposes an agent.Runtime over HTTP and WebSocket with the
// Cloudflare Agents protocol, so the npm clients (AgentClient, useAgent,
// useAgentChat) talk to it unchanged. Server is an http.Handler that mounts in
// any mux; it owns routing (/agents/{class}/{name}[/sub/{class}/{name}…]),
// the WebSocket upgrade, authorization, sub-agent gating, frame size limits
// and per-connection write queues.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// Options configure a Server.
type Options struct {
	// Runtime hosts the agents. Required.
	Runtime *agent.Runtime
	// Prefix is the first path segment of agent routes; "" means "agents".
	Prefix string
	// Authorize runs before every request and WebSocket upgrade to an
	// agent. A nil error admits it. For a WebSocket, a refusal accepts the
	// upgrade and closes at once with the *agent.CloseError's code, or 4001,
	// so the npm client stops retrying; for plain HTTP it answers the
	// *agent.HTTPError's status, or 401.
	Authorize func(r *http.Request, path agent.Path) error
	// Authenticate, when set, runs before Authorize on every request and
	// WebSocket upgrade to an agent and says who the caller is. A non-nil
	// identity is put in the request's context (agent.WithIdentity), so
	// Authorize, the parents' OnBeforeSubAgent and every method the
	// request or its connection runs read it with agent.IdentityFrom. An
	// error refuses the request as Authorize's does. See docs/security.md.
	Authenticate func(r *http.Request) (identity any, err error)
	// MaxFrameBytes limits one client frame; larger frames are discarded
	// and answered with an error frame. Zero means 1 MiB.
	MaxFrameBytes int64
	// SendQueueBytes is how many bytes of frames may wait for one slow
	// client before the server closes its connection (1013; the client
	// reconnects and resumes). Memory is used only while frames wait. Zero
	// means 64 MiB, enough for the connect replay of a parent with
	// thousands of retained agent-tool runs.
	SendQueueBytes int64
	// SendQueue is the number of frames queued for one slow client before
	// the server closes its connection (the client reconnects and resumes).
	// Zero means 1 << 20; SendQueueBytes is normally the bound that acts.
	SendQueue int
	// SendBudgetBytes is the memory budget of all send queues together.
	// Before the total would pass it, the sockets with the largest queues
	// (the slowest readers) are closed with 1013 and their queues freed;
	// the clients reconnect and resume. Zero means 256 MiB.
	SendBudgetBytes int64
	// MaxConnections bounds the open WebSockets. An upgrade beyond it is
	// refused with 503 Service Unavailable and a Retry-After header (the
	// npm clients retry with backoff). Zero means 10,000.
	MaxConnections int
	// WriteTimeout bounds writing one frame; zero means 10 seconds.
	WriteTimeout time.Duration
	// OriginPatterns lists the browser origins, besides the server's own,
	// that may open WebSockets: host patterns such as "app.example.com" or
	// "*.example.com", or "scheme://host" patterns (path.Match syntax, as
	// websocket.AcceptOptions). Empty allows only pages of the same origin
	// (an Origin whose host is the request's Host); "*" allows every
	// origin, which is the explicit opt-in for a server whose clients do
	// not authenticate with cookies. Requests without an Origin header
	// (non-browser clients) are not affected. A refused upgrade is
	// answered 403 before any agent is touched.
	OriginPatterns []string
	// CORS answers preflight requests and adds permissive CORS headers to
	// HTTP responses, for front ends served from another origin.
	CORS bool
	// DatabaseWait is how long a request or WebSocket upgrade waits for a
	// database that cannot be reached (a PostgreSQL restart) while it
	// loads its agent, before it is answered 503 with Retry-After, or
	// closed with 1013 (try again later), which clients retry. Work
	// already accepted (a turn, a run) waits for the database longer (see
	// store.WithRetryLimit). Zero means 2 seconds.
	DatabaseWait time.Duration
	// NotFound answers requests outside the agent routes; nil means 404.
	NotFound http.Handler
	// Logger receives the server's logs; nil means the runtime's.
	Logger *slog.Logger
}

// Server is the HTTP and WebSocket front of a runtime.
type Server struct {
	opts Options
	rt   *agent.Runtime
	log  *slog.Logger

	// batchBufs are the buffers of the sockets' write batches
	// (batchConn), shared: only the sockets writing a burst hold one.
	batchBufs sync.Pool

	budget *sendBudget

	mu      sync.Mutex
	sockets map[*socket]struct{}
	conns   int // WebSockets open or opening (Options.MaxConnections)
	closing bool
	wg      sync.WaitGroup
}

// The defaults of Options.
const (
	DefaultMaxFrameBytes   = 1 << 20
	DefaultSendQueue       = 1 << 20
	DefaultSendQueueBytes  = 64 << 20
	DefaultSendBudgetBytes = 256 << 20
	DefaultMaxConnections  = 10_000
	DefaultWriteTimeout    = 10 * time.Second
	DefaultDatabaseWait    = 2 * time.Second
)

// New returns a Server for opts.Runtime.
func New(opts Options) *Server {
	if opts.Prefix == "" {
		opts.Prefix = "agents"
	}
	if opts.MaxFrameBytes <= 0 {
		opts.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if opts.SendQueue <= 0 {
		opts.SendQueue = DefaultSendQueue
	}
	if opts.SendQueueBytes <= 0 {
		opts.SendQueueBytes = DefaultSendQueueBytes
	}
	if opts.SendBudgetBytes <= 0 {
		opts.SendBudgetBytes = DefaultSendBudgetBytes
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = DefaultMaxConnections
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.DatabaseWait <= 0 {
		opts.DatabaseWait = DefaultDatabaseWait
	}
	if opts.Logger == nil {
		opts.Logger = opts.Runtime.Logger()
	}
	s := &Server{opts: opts, rt: opts.Runtime, log: opts.Logger, sockets: map[*socket]struct{}{}}
	s.batchBufs.New = func() any { b := make([]byte, 0, maxBatchBytes); return &b }
	s.budget = &sendBudget{limit: opts.SendBudgetBytes, sockets: s.socketList, onShed: func(sk *socket, queued int64) {
		s.log.Warn("send budget full: closed the slowest connection", "path", sk.path, "queued", queued, "budget", opts.SendBudgetBytes)
		s.rt.Diag().Publish(s.rt.Context(), diag.ChannelServer, "shed", sk.path, map[string]any{"queued": queued})
	}}
	return s
}

func (s *Server) socketList() []*socket {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*socket, 0, len(s.sockets))
	for sk := range s.sockets {
		out = append(out, sk)
	}
	return out
}

// QueuedBytes returns what the send queues of all WebSockets hold now
// (at most Options.SendBudgetBytes), for metrics.
func (s *Server) QueuedBytes() int64 { return s.budget.used.Load() }

// Connections returns how many WebSockets are open, for metrics.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// Route is a parsed agent request path.
type Route struct {
	// Path is the addressed instance.
	Path agent.Path
	// Rest is what follows the instance in the URL path, "" or "/…".
	Rest string
}

// ParseRoute parses an escaped URL path of the form
// /{prefix}/{class-route}/{name}[/sub/{class-route}/{name}…][/rest].
// ok is false when the path is not an agent route at all; err is set when it
// is one but is malformed or names an unknown class.
func (s *Server) ParseRoute(escapedPath string) (rt Route, ok bool, err error) {
	segs := strings.Split(strings.TrimPrefix(escapedPath, "/"), "/")
	if len(segs) < 2 || segs[0] != s.opts.Prefix {
		return Route{}, false, nil
	}
	if len(segs) < 3 || segs[2] == "" {
		return Route{}, true, errors.New("missing instance name")
	}
	hop := func(route, rawName string) (agent.Hop, error) {
		class, known := s.rt.ClassByRoute(route)
		if !known {
			return agent.Hop{}, fmt.Errorf("unknown agent class %q", route)
		}
		name, err := url.PathUnescape(rawName)
		if err != nil {
			return agent.Hop{}, fmt.Errorf("malformed instance name %q", rawName)
		}
		if name == "" || name == "sub" || strings.ContainsRune(name, 0) {
			return agent.Hop{}, fmt.Errorf("invalid instance name %q", name)
		}
		return agent.Hop{Class: class, Name: name}, nil
	}
	h, err := hop(segs[1], segs[2])
	if err != nil {
		return Route{}, true, err
	}
	p := agent.Path{h}
	rest := segs[3:]
	for len(rest) >= 3 && rest[0] == "sub" {
		h, err := hop(rest[1], rest[2])
		if err != nil {
			return Route{}, true, err
		}
		p = append(p, h)
		rest = rest[3:]
	}
	if len(rest) > 0 && rest[0] == "sub" {
		return Route{}, true, errors.New("incomplete sub-agent path")
	}
	r := Route{Path: p}
	if len(rest) > 0 {
		r.Rest = "/" + strings.Join(rest, "/")
	}
	return r, true, nil
}

// ServeHTTP routes a request to an agent instance.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	route, ok, err := s.ParseRoute(r.URL.EscapedPath())
	if !ok {
		if s.opts.NotFound != nil {
			s.opts.NotFound.ServeHTTP(w, r)
		} else {
			http.NotFound(w, r)
		}
		return
	}
	if s.opts.CORS {
		setCORS(w.Header())
		if r.Method == http.MethodOptions {
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// Only public classes have client-reachable root instances; the others
	// are reached as sub-agents, through their parent's gate.
	if !s.rt.IsPublic(route.Path[0].Class) {
		http.NotFound(w, r)
		return
	}
	isWS := strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
	if isWS && !s.originAllowed(r) {
		http.Error(w, "origin not allowed", http.StatusForbidden)
		return
	}
	r, err = s.admit(r, route.Path)
	if err != nil {
		if isWS {
			s.refuseSocket(w, r, err)
		} else {
			writeHTTPError(w, err, http.StatusUnauthorized)
		}
		return
	}
	// Loading the agents the request needs waits for an unreachable
	// database only so long (DatabaseWait).
	entry := store.WithRetryLimit(r.Context(), s.opts.DatabaseWait)
	// Each parent on the way decides whether its child may be reached.
	for i := 2; i <= len(route.Path); i++ {
		if err := s.rt.CheckSubAgent(entry, r, route.Path[:i]); err != nil {
			switch {
			case errors.Is(err, store.ErrUnavailable):
				s.databaseUnavailable(w, r, isWS, err)
			case errors.Is(err, agent.ErrTooManyInstances):
				unavailable(w, "server busy: too many agents in memory, try again later")
			default:
				writeHTTPError(w, err, http.StatusNotFound)
			}
			return
		}
	}
	if isWS {
		s.serveSocket(w, r, route)
		return
	}
	if release, ok := s.load(w, r, route.Path, false); !ok {
		return
	} else if release != nil {
		defer release()
	}
	// route.Rest is still escaped: URL.Path gets the decoded form (as
	// net/http gives handlers), RawPath the escaped one.
	rest := route.Rest
	if rest == "" {
		rest = "/"
	}
	unescaped, err := url.PathUnescape(rest)
	if err != nil {
		http.Error(w, "malformed path", http.StatusBadRequest)
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = unescaped
	r2.URL.RawPath = rest
	s.rt.ServeInstance(w, r2, route.Path)
}

// load loads the agent at path, when this node serves it, under the
// DatabaseWait limit, so that a request whose agent cannot be loaded for
// want of the database is refused (databaseUnavailable; ok false) rather
// than left waiting. The handler that follows finds the agent loaded;
// release ends the hold. Other errors are left to the handler.
func (s *Server) load(w http.ResponseWriter, r *http.Request, path agent.Path, isWS bool) (release func(), ok bool) {
	if !s.rt.Owns(path) {
		return nil, true
	}
	_, release, err := s.rt.Acquire(store.WithRetryLimit(r.Context(), s.opts.DatabaseWait), path)
	if errors.Is(err, store.ErrUnavailable) {
		s.databaseUnavailable(w, r, isWS, err)
		return nil, false
	}
	return release, true
}

// databaseUnavailable refuses a request whose agent could not be loaded
// because the database could not be reached: 503 with Retry-After, or a
// WebSocket closed with 1013 (try again later).
func (s *Server) databaseUnavailable(w http.ResponseWriter, r *http.Request, isWS bool, err error) {
	s.log.Warn("database unavailable: request refused", "path", r.URL.Path, "err", err)
	if isWS {
		s.refuseSocket(w, r, &agent.CloseError{Code: int(websocket.StatusTryAgainLater), Reason: "database unavailable, try again later"})
		return
	}
	unavailable(w, "database unavailable, try again shortly")
}

// unavailable answers 503 with a Retry-After, for a temporary limit.
func unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, msg, http.StatusServiceUnavailable)
}

func setCORS(h http.Header) {
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Methods", "GET, POST, HEAD, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "*")
	h.Set("Access-Control-Max-Age", "86400")
}

func writeHTTPError(w http.ResponseWriter, err error, status int) {
	msg := http.StatusText(status)
	var he *agent.HTTPError
	if errors.As(err, &he) {
		status, msg = he.Status, he.Message
		if msg == "" {
			msg = http.StatusText(status)
		}
	}
	if status == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
		w.Header().Set("WWW-Authenticate", "Bearer") // RFC 9110: a 401 names a scheme
	}
	http.Error(w, msg, status)
}

// refuseSocket accepts an upgrade only to close it with a code that makes
// the npm client stop reconnecting.
func (s *Server) refuseSocket(w http.ResponseWriter, r *http.Request, err error) {
	code, reason := 4001, "unauthorized"
	var ce *agent.CloseError
	if errors.As(err, &ce) {
		code, reason = ce.Code, ce.Reason
	}
	c, aerr := websocket.Accept(w, r, s.acceptOptions())
	if aerr != nil {
		return
	}
	c.Close(websocket.StatusCode(code), reason)
}

func (s *Server) acceptOptions() *websocket.AcceptOptions {
	return &websocket.AcceptOptions{
		OriginPatterns:  s.opts.OriginPatterns,
		CompressionMode: websocket.CompressionDisabled,
	}
}

// originAllowed applies websocket.Accept's origin rule (no Origin header,
// the request's own Host, or a match of OriginPatterns) before the request
// reaches Authorize and the agents, so a refused page hydrates nothing.
// Accept checks it again with the same patterns.
// OriginAllowed reports whether a request's Origin may reach the agents:
// no Origin (a client that is not a browser), the server's own origin, or
// one of Options.OriginPatterns. Another front door to the same runtime
// (the MCP endpoint) applies the same rule.
func (s *Server) OriginAllowed(r *http.Request) bool { return s.originAllowed(r) }

func (s *Server) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	if strings.EqualFold(r.Host, u.Host) {
		return true
	}
	for _, p := range s.opts.OriginPatterns {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, err := path.Match(strings.ToLower(p), strings.ToLower(target)); err == nil && ok {
			return true
		}
	}
	return false
}

// Close closes every WebSocket with 1001 (the npm client reconnects, which
// is what a restart wants) and waits for their handlers to return.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closing = true
	socks := make([]*socket, 0, len(s.sockets))
	for sk := range s.sockets {
		socks = append(socks, sk)
	}
	s.mu.Unlock()
	for _, sk := range socks {
		sk.Close(int(websocket.StatusGoingAway), "server shutting down")
	}
	s.wg.Wait()
	return nil
}

func (s *Server) serveSocket(w http.ResponseWriter, r *http.Request, route Route) {
	if r.URL.Query().Get("__agents_transport") == "capnweb" {
		s.refuseSocket(w, r, &agent.CloseError{Code: 4400, Reason: "the capnweb transport is not supported"})
		return
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		http.Error(w, "server shutting down", http.StatusServiceUnavailable)
		return
	}
	if s.conns >= s.opts.MaxConnections {
		s.mu.Unlock()
		s.rt.Diag().Publish(r.Context(), diag.ChannelServer, "refuse", route.Path.String(), map[string]any{"reason": "max_connections"})
		unavailable(w, fmt.Sprintf("too many connections (the limit is %d), try again later", s.opts.MaxConnections))
		return
	}
	s.conns++
	s.wg.Add(1)
	s.mu.Unlock()
	if release, ok := s.load(w, r, route.Path, true); !ok {
		s.mu.Lock()
		s.conns--
		s.mu.Unlock()
		s.wg.Done()
		return
	} else if release != nil {
		defer release()
	}
	defer func() {
		s.mu.Lock()
		s.conns--
		n := s.conns
		s.mu.Unlock()
		s.rt.Diag().Publish(r.Context(), diag.ChannelServer, "close", route.Path.String(), map[string]any{"connections": n})
		s.wg.Done()
	}()

	bw := &batchWriter{ResponseWriter: w, timeout: s.opts.WriteTimeout, bufs: &s.batchBufs}
	c, err := websocket.Accept(bw, r, s.acceptOptions())
	if err != nil {
		return
	}
	c.SetReadLimit(-1) // we enforce MaxFrameBytes ourselves and keep the connection
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sk := &socket{c: c, bc: bw.conn, maxFrames: s.opts.SendQueue, maxBytes: s.opts.SendQueueBytes, budget: s.budget,
		path: route.Path.String(), ready: make(chan struct{}, 1), done: make(chan struct{}), writeTimeout: s.opts.WriteTimeout}
	s.mu.Lock()
	s.sockets[sk] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.sockets, sk)
		s.mu.Unlock()
	}()
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		sk.writeLoop(ctx)
	}()

	conn, err := s.rt.Connect(ctx, route.Path, r.URL.Query().Get("_pk"), r, sk)
	if err != nil {
		s.log.Warn("connect failed", "path", route.Path.String(), "err", err)
		if errors.Is(err, agent.ErrTooManyInstances) {
			sk.Close(int(websocket.StatusTryAgainLater), "server busy")
		} else if errors.Is(err, store.ErrUnavailable) {
			sk.Close(int(websocket.StatusTryAgainLater), "database unavailable, try again later")
		} else if errors.Is(err, agent.ErrNotOwner) {
			// Handed over while the socket opened: the client reconnects,
			// to the new owner.
			sk.Close(int(websocket.StatusServiceRestart), "agent moved to another node")
		} else {
			sk.Close(int(websocket.StatusInternalError), "agent unavailable")
		}
		cancel()
		<-writerDone
		c.CloseNow()
		return
	}
	code, reason := s.readLoop(ctx, c, conn)
	if sc, sr, ok := sk.closedWith(); ok {
		// The server closed first (shutdown, destroy, OnConnect refusal, a
		// slow client): report its code. The read side may only have seen
		// the connection torn down (1006), depending on which goroutine
		// read the peer's close frame.
		code, reason = sc, sr
	}
	conn.Disconnect(code, reason)
	sk.Close(code, reason)
	<-writerDone
	c.CloseNow()
}

// readLoop reads frames until the socket closes, and returns the close code
// and reason.
func (s *Server) readLoop(ctx context.Context, c *websocket.Conn, conn *agent.Conn) (int, string) {
	max := s.opts.MaxFrameBytes
	for {
		typ, rd, err := c.Reader(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return int(ce.Code), ce.Reason
			}
			return int(websocket.StatusAbnormalClosure), ""
		}
		data, err := io.ReadAll(io.LimitReader(rd, max+1))
		if err != nil {
			return int(websocket.StatusAbnormalClosure), ""
		}
		if int64(len(data)) > max {
			if _, err := io.Copy(io.Discard, rd); err != nil {
				return int(websocket.StatusAbnormalClosure), ""
			}
			conn.SendError("too_large", fmt.Sprintf("frame larger than %d bytes was discarded", max))
			continue
		}
		if typ != websocket.MessageText {
			conn.SendError("binary", "binary frames are not supported; send JSON text frames")
			continue
		}
		if !utf8.Valid(data) {
			conn.SendError("bad_utf8", "frame is not valid UTF-8")
			continue
		}
		conn.HandleFrame(ctx, data)
	}
}
