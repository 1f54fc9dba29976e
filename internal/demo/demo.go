// Package demo wires Agentry's demo server: the runtime with the chat and
// agent-tool layers, the example agents (Counter, EchoChat and the
// agents-as-tools Assistant, Researcher and Planner), and one HTTP handler
// that serves the agent routes under /agents/ and the web playground
// everywhere else. `agentry serve` and the browser tests both use it, so
// the tests run exactly what the command serves.
package demo

import (
	"context"
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
	classes := append([]agent.Class{counter.Class(), echochat.Class(echochat.Options{Delay: o.Delay})},
		agentsastools.Classes(agentsastools.Options{Models: models, SearchTime: search})...)
	for _, c := range classes {
		if err := rt.Register(c); err != nil {
			rt.Close()
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
	return &Demo{Runtime: rt, Agents: srv, MCP: mcpH, Provider: provider, handler: mux}, nil
}

// Handler serves the agent routes (/agents/…), the MCP endpoint (/mcp)
// and the playground (/).
func (d *Demo) Handler() http.Handler { return d.handler }

// Close closes the sockets and MCP sessions, then the runtime. The caller
// closes the DB.
func (d *Demo) Close() error {
	d.Agents.Close()
	d.MCP.Close()
	return d.Runtime.Close()
}
