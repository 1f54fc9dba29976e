// Package demo wires Agentry's demo server: the runtime with the chat and
// agent-tool layers, the example agents (Counter, EchoChat and the
// agents-as-tools Assistant, Researcher and Planner), and one HTTP handler
// that serves the agent routes under /agents/ and the web playground
// everywhere else. `agentry serve` and the browser tests both use it, so
// the tests run exactly what the command serves.
package demo

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/examples/echochat"
	"github.com/agentry/agentry/mcpclient"
	"github.com/agentry/agentry/mcpserver"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/web"
)

// Options configure Start.
type Options struct {
	// DB stores the agents. Required.
	DB store.DB
	// Placement makes the runtime a cluster node (agent.Options.Placement);
	// nil serves every instance here.
	Placement agent.Placement
	// Remote reaches children on other nodes (agenttool.Options.Remote).
	Remote agenttool.Remote
	// Logger receives the runtime's and the server's logs; nil means
	// slog.Default().
	Logger *slog.Logger
	// IdleTimeout evicts instances idle this long (see agent.Options).
	IdleTimeout time.Duration
	// Delay is the scripted models' delay between streamed chunks.
	Delay time.Duration
	// SearchTime is how long the Researcher's simulated web search takes;
	// zero means 40 × Delay (2 s at the serve command's default 50 ms).
	SearchTime time.Duration
	// OriginPatterns are the other browser origins whose pages may open
	// WebSockets (server.Options.OriginPatterns); nil allows only the
	// playground's own origin, "*" every origin.
	OriginPatterns []string
	// Models are the agents-as-tools models; nil means
	// agentsastools.FromEnv(Delay): a real model when the environment
	// names one, the offline scripted models otherwise.
	Models *agentsastools.Models
	// AuthToken, when set, is required on every agent route (HTTP and
	// WebSocket; see server.RequireToken). The playground's static files
	// stay public: they hold no data, and the page asks for the token (or
	// reads it from the URL fragment, #token=…) before it calls the API.
	AuthToken string
	// MaxTurnsInFlight bounds the chat turns in flight on this node
	// (chat.Config.MaxTurnsInFlight); zero means the default.
	MaxTurnsInFlight int
	// TracerProvider and MeterProvider receive the runtime's spans and
	// metrics (agent.Options); nil means the global ones.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// MCPServers are MCP servers whose tools the Assistant uses beside
	// its helpers (agentry serve --mcp). A server that cannot be reached
	// at start is logged and retried in the background.
	MCPServers []mcpclient.Server
	// MCPStderr receives the stderr of stdio MCP servers; nil discards
	// it.
	MCPStderr io.Writer
}

// Demo is a started demo runtime and its HTTP handler.
type Demo struct {
	// Runtime hosts the agents.
	Runtime *agent.Runtime
	// Agents serves the agent routes; requests outside them go to the
	// playground.
	Agents *server.Server
	// MCP serves the public agents over the Model Context Protocol at
	// /mcp (see mcpserver).
	MCP *mcpserver.Handler
	// Provider names the agents-as-tools model: "scripted", "openai", …
	Provider string
	// MCPClient holds the connections to Options.MCPServers (nil
	// without them).
	MCPClient *mcpclient.Client

	handler http.Handler
}

// Start is New, then the runtime's start-up (recovering interrupted work).
func Start(ctx context.Context, o Options) (*Demo, error) {
	d, err := New(ctx, o)
	if err != nil {
		return nil, err
	}
	if err := d.Runtime.Start(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// New creates the runtime, registers the demo classes and builds the
// handler. The runtime is not started: the caller starts it (Start, or
// serve.Run once the port is open).
func New(ctx context.Context, o Options) (*Demo, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	rt, err := agent.New(ctx, agent.Options{DB: o.DB, Logger: logger, IdleTimeout: o.IdleTimeout,
		TracerProvider: o.TracerProvider, MeterProvider: o.MeterProvider, Placement: o.Placement})
	if err != nil {
		return nil, err
	}
	chat.Configure(rt, chat.Config{MaxTurnsInFlight: o.MaxTurnsInFlight})
	agenttool.Install(rt, agenttool.Options{Remote: o.Remote})
	models, provider := o.Models, "custom"
	if models == nil {
		models, provider = agentsastools.FromEnv(o.Delay)
	}
	search := o.SearchTime
	if search == 0 {
		search = 40 * o.Delay
	}
	mc, err := connectMCP(ctx, logger, o)
	if err != nil {
		rt.Close()
		return nil, err
	}
	aopts := agentsastools.Options{Models: models, SearchTime: search}
	if mc != nil {
		aopts.ExtraTools = mc.Tools
	}
	classes := append([]agent.Class{counter.Class(), echochat.Class(echochat.Options{Delay: o.Delay})},
		agentsastools.Classes(aopts)...)
	for _, c := range classes {
		if err := rt.Register(c); err != nil {
			rt.Close()
			closeMCP(mc)
			return nil, err
		}
	}
	sopts := server.Options{Runtime: rt, NotFound: web.Handler(), OriginPatterns: o.OriginPatterns}
	if o.AuthToken != "" {
		sopts.Authorize = server.RequireToken(o.AuthToken)
	}
	srv := server.New(sopts)
	mcpH := mcpserver.New(mcpserver.Options{Runtime: rt, Front: srv})
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpH)
	mux.Handle("/mcp/", mcpH)
	mux.Handle("/", srv)
	return &Demo{Runtime: rt, Agents: srv, MCP: mcpH, MCPClient: mc, Provider: provider, handler: mux}, nil
}

// connectMCP declares o.MCPServers on a new MCP client (nil without
// servers). A wrong declaration fails; a server that does not answer is
// logged and retried in the background.
func connectMCP(ctx context.Context, logger *slog.Logger, o Options) (*mcpclient.Client, error) {
	if len(o.MCPServers) == 0 {
		return nil, nil
	}
	for _, s := range o.MCPServers {
		if err := s.Check(); err != nil {
			return nil, err
		}
	}
	mc := mcpclient.New(mcpclient.Options{Logger: logger, Stderr: o.MCPStderr})
	for _, s := range o.MCPServers {
		if err := mc.AddServer(ctx, s); err != nil {
			if ctx.Err() != nil {
				mc.Close()
				return nil, err
			}
			logger.Warn("mcp: server not reachable yet; retrying in the background", "mcp_server", s.Name, "err", err)
			continue
		}
		st := mc.Status()
		logger.Info("mcp: server connected", "mcp_server", s.Name, "tools", st[len(st)-1].Tools)
	}
	return mc, nil
}

func closeMCP(mc *mcpclient.Client) {
	if mc != nil {
		mc.Close()
	}
}

// Handler serves the agent routes (/agents/…), the MCP endpoint (/mcp)
// and the playground (/).
func (d *Demo) Handler() http.Handler { return d.handler }

// Close closes the sockets and MCP sessions, then the runtime. The caller
// closes the DB.
func (d *Demo) Close() error {
	d.Agents.Close()
	d.MCP.Close()
	err := d.Runtime.Close()
	closeMCP(d.MCPClient) // after the runtime: no tool call is left to make
	return err
}
