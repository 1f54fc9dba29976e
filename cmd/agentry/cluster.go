package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/clusterserve"
	"github.com/agentry/agentry/internal/demo"
	"github.com/agentry/agentry/mcpclient"
	"github.com/agentry/agentry/store"
)

// postgresEnv names the cluster database when --postgres is not given.
const postgresEnv = "AGENTRY_POSTGRES_URL"

// clusterFlags are serve's cluster-mode flags.
type clusterFlags struct {
	postgres, nodeID, advertise string
	lease                       time.Duration
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.postgres, "postgres", "", "run as a cluster node on this PostgreSQL database (postgres://…) instead of SQLite (default $"+postgresEnv+")")
	fs.StringVar(&c.nodeID, "node-id", "", "this node's id, unique in the cluster (with --postgres)")
	fs.StringVar(&c.advertise, "advertise", "", "host:port the other nodes reach this node at (with --postgres; default --addr)")
	fs.DurationVar(&c.lease, "lease", cluster.DefaultLease, "shard lease duration (with --postgres): a dead node's instances move after at most 1.25 times this long")
}

// clusterServe is what serve's other flags said.
type clusterServe struct {
	addr    string
	idle    time.Duration
	verbose bool
	delay   time.Duration
	origins []string
	mcp     []mcpclient.Server
	token   string
	turns   int
}

// serveCluster is serve as one node of a cluster on PostgreSQL.
func serveCluster(ctx context.Context, cl clusterFlags, o clusterServe, logw io.Writer, listening func(net.Addr)) error {
	if cl.nodeID == "" {
		return errors.New("serve: --postgres needs --node-id")
	}
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: level}))
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	build := func(ctx context.Context, db store.DB, place agent.Placement, remote agenttool.Remote) (clusterserve.App, error) {
		d, err := demo.New(ctx, demo.Options{DB: db, Logger: logger, IdleTimeout: o.idle, Delay: o.delay, MaxTurnsInFlight: o.turns,
			OriginPatterns: o.origins, AuthToken: o.token, Placement: place, Remote: remote, MCPServers: o.mcp, MCPStderr: logw})
		if err != nil {
			return clusterserve.App{}, err
		}
		logger.Info("agents-as-tools demo", "model", d.Provider)
		return clusterserve.App{Runtime: d.Runtime, Handler: d.Handler(), Close: d.Close, Gate: d.Agents.CheckSubAgent,
			Route: func(p string) (agent.Path, bool) {
				if path, ok := d.MCP.Route(p); ok {
					return path, true // an MCP session lives on its instance's owner
				}
				r, ok, err := d.Agents.ParseRoute(p)
				return r.Path, ok && err == nil
			}}, nil
	}
	logger.Info("agentry listening", "addr", "http://"+ln.Addr().String(), "node", cl.nodeID, "advertise", cl.advertise, "lease", cl.lease)
	if listening != nil {
		listening(ln.Addr())
	}
	return clusterserve.Run(ctx, clusterserve.Config{Listener: ln, Postgres: cl.postgres, NodeID: cl.nodeID,
		Advertise: cl.advertise, Lease: cl.lease, Logger: logger, Build: build})
}
