// Command app is a complete Agentry program, the one the README shows: a
// SQLite store, a runtime with a chat Assistant that hands research to a
// Researcher child as a tool, the agent routes mounted in the
// application's own mux behind its own middleware, and a graceful
// shutdown. Run it with `go run ./examples/app` and chat with
// `go run ./cmd/agentry chat --addr 127.0.0.1:8080`. It answers with a
// scripted model unless OPENAI_API_KEY is set.
package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/openai"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/server"
	"github.com/agentry/agentry/store/sqlite"
)

// Researcher is a declarative child: the framework runs its model loop.
type Researcher struct{ chat.Base }

func (r *Researcher) SystemPrompt() string {
	return "Research the user's topic and end with a concise summary."
}

// ResearchInput is what the Assistant's model passes to the research tool.
type ResearchInput struct {
	Query string `json:"query"`
}

// Assistant is the parent: its model may call the Researcher as a tool.
type Assistant struct{ chat.Base }

func (a *Assistant) Tools() []chat.Tool {
	return []chat.Tool{
		agenttool.AgentTool[ResearchInput](ResearcherClass, agenttool.ToolOptions{
			Name: "research", Description: "Research one topic in depth.", DisplayName: "Researcher",
		}),
	}
}

// Typed class handles: a misspelt class does not compile.
var (
	AssistantClass  = agent.NewClass[*Assistant]("Assistant")
	ResearcherClass = agent.NewClass[*Researcher]("Researcher")
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, logger, "127.0.0.1:8080", "./data", nil); err != nil {
		logger.Error("app", "err", err)
		os.Exit(1)
	}
}

// run serves until ctx is done, then shuts down in order. listening, when
// set, is told the address once the port is open.
func run(ctx context.Context, logger *slog.Logger, addr, dataDir string, listening func(net.Addr)) error {
	// 1. The store: one SQLite file (WAL, pure Go).
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return err
	}
	db, err := sqlite.Open(ctx, filepath.Join(dataDir, "app.db"))
	if err != nil {
		return err
	}
	defer db.Close() // last: after the runtime

	// 2. The runtime, its classes, then its layers: all before Start.
	rt, err := agent.New(ctx, agent.Options{DB: db, Logger: logger})
	if err != nil {
		return err
	}
	defer rt.Close() // idempotent; the shutdown below closes it in order
	if err := rt.Register(AssistantClass.Class(agent.Class{Public: true})); err != nil {
		return err
	}
	if err := rt.Register(ResearcherClass.Class(agent.Class{})); err != nil { // a child: not Public
		return err
	}
	if err := chat.Configure(rt, chat.Config{Model: defaultModel()}); err != nil {
		return err
	}
	if err := agenttool.Install(rt, agenttool.Options{}); err != nil {
		return err
	}

	// 3. Start: checks the set-up and recovers work a previous process
	// left unfinished.
	if err := rt.Start(ctx); err != nil {
		return err
	}

	// 4. The agent routes in the application's own mux, behind its own
	// middleware.
	agents := server.New(server.Options{Runtime: rt, Logger: logger})
	mux := http.NewServeMux()
	mux.Handle("/agents/", agents)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	hs := &http.Server{Handler: logRequests(logger, mux), ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	logger.Info("listening", "addr", ln.Addr().String())
	if listening != nil {
		listening(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()

	// 5. Graceful shutdown: stop taking requests, close the WebSockets
	// (clients reconnect to the next process), close the runtime (it
	// waits for its background work), then the store (deferred).
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if serr := hs.Shutdown(sctx); serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		logger.Warn("http shutdown", "err", serr)
	}
	agents.Close()
	if cerr := rt.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// logRequests is the application's own middleware.
func logRequests(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logger.Debug("request", "method", r.Method, "path", r.URL.Path)
		next.ServeHTTP(w, r)
	})
}

// defaultModel is an OpenAI-compatible model when OPENAI_API_KEY is set, a
// scripted offline one otherwise.
func defaultModel() model.Model {
	if os.Getenv("OPENAI_API_KEY") != "" {
		return openai.FromEnv()
	}
	return scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
		if scripted.LastIsToolResult(req) {
			return scripted.Reply{scripted.Text("Here is what the researcher found.")}
		}
		if len(req.Tools) > 0 {
			return scripted.Reply{scripted.ToolCall("research", ResearchInput{Query: scripted.LastUserText(req)})}
		}
		return scripted.Reply{scripted.Text("Findings: " + scripted.LastUserText(req))}
	}))
}
