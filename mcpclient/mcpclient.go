// Package mcpclient lets chat agents use the tools of MCP servers (the
// Model Context Protocol's client side; Cloudflare Agents' addMcpServer).
//
// A Client holds the node's connections to the MCP servers it was given
// (AddServer): streamable HTTP servers (a URL, with headers or a bearer
// token) and stdio servers (a command the node starts as its child
// process). Each server's tools become chat.Tools, so a chat class offers
// them beside its Go tools by returning Client.Tools from its Tools
// method; they go through the same loop, approvals, recovery and usage as
// any tool.
//
// There is one MCP session per (node, server), shared by the instances of
// the node: a server's tools are configuration of the class, not state of
// an instance, and a stdio server is one child process per node, not one
// per instance. A server that keeps per-session state sees the node as one
// client. The session is reconnected with a bounded exponential backoff
// when it ends; a call made while it is down fails at once with an error
// the model sees.
//
// See docs/mcp.md for the naming of tools, the mapping of results to the
// AI SDK's parts, progress, cancellation, timeouts and what a crash does
// to a call.
package mcpclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentry/agentry/chat"
)

// Server declares one MCP server. Set exactly one of URL (streamable HTTP)
// and Command (stdio).
type Server struct {
	// Name identifies the server and prefixes its tools' names
	// ("{Name}_{tool}"): 1–24 letters, digits or '-' (no '_', so that a
	// prefix cannot end inside another server's name).
	Name string

	// URL is the endpoint of a streamable HTTP server.
	URL string
	// Header is sent with every HTTP request to the server.
	Header http.Header
	// BearerToken, when set, is sent as "Authorization: Bearer …".
	BearerToken string
	// HTTPClient, when set, is used for the HTTP transport (its Transport
	// gets Header and BearerToken added).
	HTTPClient *http.Client
	// OAuthHandler, when set, authorizes the HTTP requests with the Go
	// SDK's OAuth support (auth.NewAuthorizationCodeHandler): on a 401 or
	// 403 it runs its flow and retries. The application supplies how an
	// authorization code is obtained; mcpclient runs no browser.
	OAuthHandler auth.OAuthHandler

	// Command and Args start a stdio server as a child process of the
	// node; Env (KEY=value, added to the node's environment) and Dir
	// configure it.
	Command string
	Args    []string
	Env     []string
	Dir     string

	// NeedsApproval, when set, decides for every call of the server's
	// tools whether the user must approve it (chat.RequireApproval for
	// all). ToolApproval overrides it per tool, keyed by the MCP tool
	// name (not the prefixed one); a nil value there means no approval.
	NeedsApproval chat.ApprovalFunc
	ToolApproval  map[string]chat.ApprovalFunc

	// CallTimeout bounds one tools/call; zero means DefaultCallTimeout.
	// A call that times out is cancelled on the server
	// (notifications/cancelled) and fails.
	CallTimeout time.Duration

	// ProtocolVersion is the MCP revision the client asks for; empty
	// means DefaultProtocolVersion.
	ProtocolVersion string
}

// Defaults.
const (
	// DefaultCallTimeout bounds a tools/call when Server.CallTimeout is
	// zero.
	DefaultCallTimeout = 2 * time.Minute
	// DefaultProtocolVersion is the MCP revision asked for by default: the
	// latest one that servers built with today's SDKs (and the official
	// conformance suite) speak. The Go SDK negotiates down when a server
	// answers with an older one.
	DefaultProtocolVersion = "2025-11-25"
	// DefaultMaxFileBytes bounds the bytes of one image, audio clip or
	// embedded resource written as a file part.
	DefaultMaxFileBytes = 4 << 20
	// MaxTools is the most tools taken from one server; the rest are
	// left out (and logged).
	MaxTools = 256
)

// Options configure a Client. The zero value is usable.
type Options struct {
	// Logger gets connection events; nil discards them.
	Logger *slog.Logger
	// Clock times the reconnect backoff; nil is the real clock.
	Clock clockwork.Clock
	// MinBackoff and MaxBackoff bound the delay between reconnect
	// attempts (doubling from MinBackoff up to MaxBackoff); zero means
	// 500ms and 30s.
	MinBackoff, MaxBackoff time.Duration
	// MaxFileBytes bounds one file part (DefaultMaxFileBytes when zero); a
	// larger image or resource is left out and named in the output text.
	MaxFileBytes int
	// Stderr receives the stderr of stdio servers; nil discards it.
	Stderr io.Writer
	// OnChange, when set, is called after a server connected, refreshed
	// its tool list or lost its session, with its new status. It must not
	// block.
	OnChange func(ServerStatus)
	// ClientName and ClientVersion are sent in initialize; empty means
	// "agentry" and "dev".
	ClientName, ClientVersion string
}

// Client holds the node's MCP server connections. Its methods are safe
// for concurrent use. Close it when the node stops: that ends the sessions
// and stops the stdio servers' processes.
type Client struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	servers []*conn // in AddServer order
	closed  bool
	wg      sync.WaitGroup
}

// New returns a Client with no servers.
func New(opts Options) *Client {
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 500 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = opts.MinBackoff
	}
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	if opts.ClientName == "" {
		opts.ClientName = "agentry"
	}
	if opts.ClientVersion == "" {
		opts.ClientVersion = "dev"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{opts: opts, log: log}
}

var serverNamePattern = regexp.MustCompile(`^[A-Za-z0-9-]{1,24}$`)

// ErrClosed is returned by AddServer after Close.
var ErrClosed = errors.New("mcpclient: client is closed")

// AddServer declares a server (the Go name of addMcpServer) and makes the
// first connection attempt, waiting for it as long as ctx allows. A
// declaration that is wrong (a bad name, a name already used, neither or
// both of URL and Command) is refused. A server that cannot be reached
// stays declared: the error of the first attempt is returned, and the
// client keeps reconnecting with backoff, its tools appearing once it
// answers.
func (c *Client) AddServer(ctx context.Context, s Server) error {
	if err := s.Check(); err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	for _, o := range c.servers {
		if o.cfg.Name == s.Name {
			c.mu.Unlock()
			return fmt.Errorf("mcpclient: server %q is already declared", s.Name)
		}
	}
	cn := newConn(c, s)
	c.servers = append(c.servers, cn)
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		cn.run()
	}()
	select {
	case <-cn.firstAttempt:
		return cn.firstErr
	case <-ctx.Done():
		return fmt.Errorf("mcpclient: server %s: first connection: %w", s.Name, ctx.Err())
	}
}

// Check reports what is wrong with a declaration (AddServer refuses it
// with this error): a bad name, or neither or both of URL and Command.
func (s *Server) Check() error {
	if !serverNamePattern.MatchString(s.Name) {
		return fmt.Errorf("mcpclient: server name %q: want 1-24 letters, digits or '-'", s.Name)
	}
	if (s.URL == "") == (s.Command == "") {
		return fmt.Errorf("mcpclient: server %s: set exactly one of URL and Command", s.Name)
	}
	if s.CallTimeout < 0 {
		return fmt.Errorf("mcpclient: server %s: negative call timeout", s.Name)
	}
	return nil
}

// Tools returns the tools of every connected server, as chat tools, in the
// order the servers were added and each server listed them. A server that
// is down keeps the tools it last listed (a call then fails with an error
// the model sees); one never reached has none yet.
func (c *Client) Tools() []chat.Tool {
	c.mu.Lock()
	servers := slices.Clone(c.servers)
	c.mu.Unlock()
	var out []chat.Tool
	for _, s := range servers {
		out = append(out, s.currentTools()...)
	}
	return out
}

// ServerStatus describes one declared server.
type ServerStatus struct {
	Name      string
	Connected bool
	// Tools are the prefixed names of the server's tools.
	Tools []string
	// PID is the process id of a stdio server while it runs, else 0.
	PID int
	// LastError is the error that ended the last session or attempt.
	LastError error
	// Sessions counts the sessions established so far (reconnects
	// included).
	Sessions int
}

// Status returns the state of each declared server, in AddServer order.
func (c *Client) Status() []ServerStatus {
	c.mu.Lock()
	servers := slices.Clone(c.servers)
	c.mu.Unlock()
	out := make([]ServerStatus, 0, len(servers))
	for _, s := range servers {
		out = append(out, s.status())
	}
	return out
}

// Close ends every session, stops the stdio servers' processes (closing
// their stdin, then SIGTERM and SIGKILL if they linger) and waits for the
// client's goroutines. Calls in flight fail.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	servers := slices.Clone(c.servers)
	c.mu.Unlock()
	for _, s := range servers {
		s.stop()
	}
	c.wg.Wait()
	return nil
}

// newMCPClient returns the SDK client of one server, with the handlers
// that route its notifications to cn.
func (c *Client) newMCPClient(cn *conn) *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: c.opts.ClientName, Version: c.opts.ClientVersion}, &mcp.ClientOptions{
		Logger: c.log.With("mcp_server", cn.cfg.Name),
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			cn.requestRefresh()
		},
		ProgressNotificationHandler: func(ctx context.Context, req *mcp.ProgressNotificationClientRequest) {
			cn.progress(req.Params)
		},
		// Capabilities: none beyond the protocol's basics (no roots,
		// sampling or elicitation: the agent has no user to ask
		// mid-call; see docs/mcp.md).
		Capabilities: &mcp.ClientCapabilities{},
	})
}
