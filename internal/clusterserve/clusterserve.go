// Package clusterserve runs one node of an Agentry cluster on PostgreSQL
// the way `agentry serve --postgres` and the cluster tests' server command
// do: it joins the cluster (package cluster), builds the application's
// runtime on the shared database with the node as its placement, serves
// the node's router (local instances, forwarding to the owners, the
// node-to-node calls) and, on shutdown, hands the node's shards over.
package clusterserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/serve"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/postgres"
)

// App is the application a node serves.
type App struct {
	// Runtime hosts the agents; created with the placement Build got.
	Runtime *agent.Runtime
	// Handler serves this node's own requests (a server.Server).
	Handler http.Handler
	// Route parses an escaped URL path into the instance it addresses
	// (server.Server.ParseRoute).
	Route func(escapedPath string) (agent.Path, bool)
	// Close closes the sockets and the runtime (not the DB).
	Close func() error
	// Gate decides whether a client's request may reach a sub-agent whose
	// parent this node owns, when the request reached another node
	// (server.Server.CheckSubAgent, which authenticates it again); nil
	// means the runtime's gates alone.
	Gate func(r *http.Request, path agent.Path) error
}

// Config is what Run serves.
type Config struct {
	// Listener is the open port.
	Listener net.Listener
	// Postgres is the cluster database's URL.
	Postgres string
	// NodeID names this node. Required.
	NodeID string
	// Advertise is the host:port other nodes reach this node at; "" means
	// the listener's address.
	Advertise string
	// Lease is the shard lease; zero means cluster's default.
	Lease time.Duration
	// Logger receives the logs; nil means slog.Default().
	Logger *slog.Logger
	// NoHints turns the LISTEN/NOTIFY wake-up between nodes off: the
	// followers of runs on other nodes only poll.
	NoHints bool
	// Build creates the application on db, with place as the runtime's
	// agent.Options.Placement and remote as agenttool.Options.Remote.
	Build func(ctx context.Context, db store.DB, place agent.Placement, remote agenttool.Remote) (App, error)
}

// KnownSchemas is the newest schema version of each framework layer this
// build knows (store.CheckSchemas's known).
func KnownSchemas() map[string]int {
	return map[string]int{"agent": agent.SchemaVersion(), "chat": chat.SchemaVersion(), "agenttool": agenttool.SchemaVersion()}
}

// Run serves the node until ctx is done, then hands its shards over and
// closes everything.
func Run(ctx context.Context, c Config) error {
	if c.NodeID == "" {
		return errors.New("cluster node: a node id is required")
	}
	logger := c.Logger
	if logger == nil {
		logger = slog.Default()
	}
	advertise := c.Advertise
	if advertise == "" {
		advertise = c.Listener.Addr().String()
	}
	pool, err := pgxpool.New(ctx, c.Postgres)
	if err != nil {
		return fmt.Errorf("cluster database: %w", err)
	}
	defer pool.Close()
	db, err := postgres.Open(ctx, c.Postgres)
	if err != nil {
		return err
	}
	defer db.Close()
	// A build older than the database's schema refuses to start before it
	// joins: it would take shards, and fail on them.
	if err := store.CheckSchemas(ctx, db, KnownSchemas()); err != nil {
		return err
	}
	node, err := cluster.Join(ctx, cluster.Config{Pool: pool, NodeID: c.NodeID, Addr: advertise, Lease: c.Lease,
		Logger: logger.With("node", c.NodeID)})
	if err != nil {
		return err
	}
	secret, err := cluster.Secret(ctx, node)
	if err != nil {
		node.Close()
		return err
	}
	peer := &cluster.Peer{Node: node, Secret: secret}
	if !c.NoHints {
		peer.Hints = cluster.NewHints(pool, logger, nil)
	}
	app, err := c.Build(ctx, db, node, peer)
	if err != nil {
		node.Close()
		return err
	}
	peer.Runtime, peer.Gate = app.Runtime, app.Gate
	node.UsePeer(peer)
	node.Attach(app.Runtime)
	router := &cluster.Router{Node: node, Local: app.Handler, Peer: peer.Handler(), Route: app.Route, Logger: logger}
	// A first round of leases before the port serves, so the node knows
	// the owners from its first request.
	if err := node.Step(ctx); err != nil {
		logger.Warn("cluster: first step", "err", err)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		var wg sync.WaitGroup
		if peer.Hints != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				peer.Hints.Run(runCtx)
			}()
		}
		node.Run(runCtx)
		wg.Wait()
	}()
	leave := func() {
		logger.Info("shutting down: handing shards over", "node", c.NodeID)
		lctx, cancel := context.WithTimeout(context.Background(), node.Lease())
		if lerr := node.Leave(lctx); lerr != nil {
			logger.Warn("cluster: leave", "err", lerr)
		}
		cancel()
	}
	// On SIGTERM the shards are handed over first, while the port still
	// answers (their instances move at once; a request for one gets 503
	// and is asked again, elsewhere), then the requests in flight are
	// waited for.
	err = serve.Run(ctx, serve.Config{Listener: c.Listener, Handler: router, Runtime: app.Runtime, Logger: logger,
		BeforeShutdown: leave})
	leave() // a no-op after a hand-over; otherwise (the server failed) now
	stopRun()
	<-runDone
	router.Close()
	if cerr := app.Close(); err == nil {
		err = cerr
	}
	return err
}
