package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
)

// Config configures a Node.
type Config struct {
	// Pool connects to the cluster's database. Required.
	Pool *pgxpool.Pool
	// NodeID names this node; it must be unique in the cluster. Required.
	NodeID string
	// Addr is the host:port other nodes reach this node's HTTP server at.
	// Required.
	Addr string
	// Shards is the number of shards; zero means DefaultShards. Every
	// node of a cluster must use the same number.
	Shards int
	// Lease is how long a shard lease and a heartbeat last without renewal;
	// zero means DefaultLease. A node renews every quarter of it and stops
	// serving a shard when three quarters have passed without a renewal.
	Lease time.Duration
	// Clock times leases; nil means the real clock. Lease expiry times are
	// written in this clock's milliseconds, so the nodes' clocks must agree
	// to within a quarter of the lease for leases to move on time (safety
	// never depends on clocks: the epoch fences writes).
	Clock clockwork.Clock
	// Logger receives the node's logs; nil means slog.Default().
	Logger *slog.Logger
	// Acquired is told the shards this node just acquired, so it can wake
	// their instances with unfinished work. It runs in its own goroutine.
	Acquired func(ctx context.Context, shards []int)
	// Lost is told the shards whose lease this node lost without handing
	// them over (its local deadline passed, or another node holds them):
	// it must stop serving them at once. Writes are already refused.
	Lost func(shards []int)
	// Drain hands shards over: it stops serving them (closing their
	// clients' sockets with a non-terminal code) and waits, at most until
	// ctx is done, for their work in flight to end. Writes are still
	// accepted while it runs; the owner is cleared after it returns.
	Drain func(ctx context.Context, shards []int)
	// MaxDrain bounds Drain's wait; zero means DefaultMaxDrain. It is
	// never more than a quarter lease (the leases are not renewed
	// meanwhile). The shards' instances are unavailable for that long at
	// most.
	MaxDrain time.Duration
	// MaxOffer bounds how long a hand-over waits for the other nodes to
	// take the shards it released (requests for them wait as long); zero
	// means DefaultMaxOffer, or a quarter lease if that is shorter.
	MaxOffer time.Duration
}

// DefaultLease is the shard lease of Config.Lease's zero value. A node
// that dies (kill -9) keeps its shards until their leases expire, at most
// one lease after its last renewal, and the others take them at their next
// round, a quarter lease later: 3.75 s, within the 5 s a client waits. A
// live node stops writing under a lease it could not renew for three
// quarters of it (2.25 s), so a database or network blip shorter than that
// moves nothing.
const DefaultLease = 3 * time.Second

// lease is a shard lease this node holds.
type lease struct {
	epoch    int64
	deadline time.Time // local: serve and write only before it
	draining bool      // being handed over: no new inputs, writes still fenced in
}

// Node is one member of a cluster: it heartbeats, acquires and renews shard
// leases, hands shards over when the cluster grows or it leaves, and
// answers which node owns an instance. Create one with Join.
type Node struct {
	cfg   Config
	clock clockwork.Clock
	log   *slog.Logger

	mu     sync.Mutex
	owned  map[int]*lease
	owners []string              // shard → owner node id ("" unknown), as last read
	addrs  map[string]string     // live node id → address
	takers []string              // addresses of the other live nodes that take shards, as last read
	moving map[int]chan struct{} // shard being handed over → closed when its next owner was offered it
	closed bool
	peer   *Peer // asks other nodes' gates (gate.go)

	stepMu sync.Mutex    // one Step at a time
	kick   chan struct{} // a Step is wanted now (Take found one running)
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Errors of ownership.
var (
	// ErrNotOwner is returned for an instance whose shard this node does not
	// serve now.
	ErrNotOwner = errors.New("cluster: this node does not own the instance's shard")
	// ErrFenced is returned by a write transaction whose shard lease moved
	// to a new epoch: the node lost it.
	ErrFenced = errors.New("cluster: shard lease lost (fenced)")
)

// Join creates the cluster's tables if needed, records this node in the
// membership and returns it. Call Run (or Step) to take part in the
// lease protocol, and Leave to hand its shards over.
func Join(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Pool == nil || cfg.NodeID == "" || cfg.Addr == "" {
		return nil, errors.New("cluster: Config.Pool, NodeID and Addr are required")
	}
	if cfg.Shards <= 0 {
		cfg.Shards = DefaultShards
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.MaxDrain <= 0 {
		cfg.MaxDrain = DefaultMaxDrain
	}
	cfg.MaxDrain = min(cfg.MaxDrain, cfg.Lease/4)
	if cfg.MaxOffer <= 0 {
		cfg.MaxOffer = min(DefaultMaxOffer, cfg.Lease/4)
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := migrate(ctx, cfg.Pool, cfg.Shards); err != nil {
		return nil, err
	}
	nctx, cancel := context.WithCancel(context.Background())
	n := &Node{cfg: cfg, clock: cfg.Clock, log: cfg.Logger.With("node", cfg.NodeID),
		owned: map[int]*lease{}, owners: make([]string, cfg.Shards), addrs: map[string]string{},
		moving: map[int]chan struct{}{}, kick: make(chan struct{}, 1), ctx: nctx, cancel: cancel}
	if err := n.heartbeat(ctx); err != nil {
		cancel()
		return nil, err
	}
	return n, nil
}

// migrate creates the cluster tables and the shard rows, once.
func migrate(ctx context.Context, pool *pgxpool.Pool, shards int) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(7809842150)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS cluster_nodes (
			node_id TEXT PRIMARY KEY,
			addr TEXT NOT NULL,
			heartbeat_at BIGINT NOT NULL,
			expires_at BIGINT NOT NULL,
			leaving BOOLEAN NOT NULL DEFAULT false)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS cluster_shards (
			shard INTEGER PRIMARY KEY,
			owner TEXT,
			epoch BIGINT NOT NULL DEFAULT 0,
			expires_at BIGINT NOT NULL DEFAULT 0)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS cluster_config (key TEXT PRIMARY KEY, value TEXT NOT NULL)`); err != nil {
			return err
		}
		var have int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM cluster_shards`).Scan(&have); err != nil {
			return err
		}
		if have != 0 && have != shards {
			return fmt.Errorf("the database has %d shards, this node is configured for %d", have, shards)
		}
		_, err := tx.Exec(ctx, `INSERT INTO cluster_shards (shard) SELECT generate_series(0, $1::int - 1) ON CONFLICT DO NOTHING`, shards)
		return err
	})
	if err != nil {
		return fmt.Errorf("cluster: create tables: %w", err)
	}
	return nil
}

// ID returns the node's id.
func (n *Node) ID() string { return n.cfg.NodeID }

// Shards returns the number of shards.
func (n *Node) Shards() int { return n.cfg.Shards }

// Lease returns the lease duration.
func (n *Node) Lease() time.Duration { return n.cfg.Lease }

// ShardOf returns the shard of the instance at path.
func (n *Node) ShardOf(path agent.Path) int { return ShardOf(path, n.cfg.Shards) }

// Owns reports whether this node serves the instance at path now: it holds
// the shard's lease, its local deadline has not passed, and the shard is
// not being handed over.
func (n *Node) Owns(path agent.Path) bool {
	s := n.ShardOf(path)
	now := n.clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	l, ok := n.owned[s]
	return ok && !l.draining && now.Before(l.deadline)
}

// Owned returns the shards this node holds, in order.
func (n *Node) Owned() []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]int, 0, len(n.owned))
	for s := range n.owned {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Owner returns the node that owned the instance's shard when this node
// last read the leases, with its address; ok is false when none did.
func (n *Node) Owner(path agent.Path) (nodeID, addr string, ok bool) {
	s := n.ShardOf(path)
	n.mu.Lock()
	defer n.mu.Unlock()
	id := n.owners[s]
	if id == "" {
		return "", "", false
	}
	addr, ok = n.addrs[id]
	return id, addr, ok
}

// Addr returns the address of a live node.
func (n *Node) Addr(nodeID string) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	a, ok := n.addrs[nodeID]
	return a, ok
}

// Run takes part in the lease protocol until ctx is done or Leave is
// called: a Step every quarter of the lease, and one more at once when
// another node offered shards while a Step was running (Take).
func (n *Node) Run(ctx context.Context) {
	n.wg.Add(1)
	defer n.wg.Done()
	tick := n.clock.NewTicker(n.cfg.Lease / 4)
	defer tick.Stop()
	for {
		if err := n.Step(ctx); err != nil && ctx.Err() == nil && n.ctx.Err() == nil {
			n.log.Warn("cluster step", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-n.ctx.Done():
			return
		case <-tick.Chan():
		case <-n.kick:
		}
	}
}

// Step runs one round of the lease protocol: heartbeat, renew the held
// leases (dropping those that moved), read the cluster, hand over shards
// beyond this node's share and acquire free or expired ones up to it.
func (n *Node) Step(ctx context.Context) error {
	n.stepMu.Lock()
	defer n.stepMu.Unlock()
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return nil
	}
	if err := n.heartbeat(ctx); err != nil {
		n.expire()
		return err
	}
	if err := n.renew(ctx); err != nil {
		n.expire()
		return err
	}
	live, err := n.read(ctx)
	if err != nil {
		return err
	}
	target := (n.cfg.Shards + live - 1) / max(live, 1)
	n.mu.Lock()
	have := len(n.owned)
	n.mu.Unlock()
	switch {
	case have > target:
		return n.handOver(ctx, n.surplus(have-target))
	case have < target:
		return n.acquire(ctx, target-have)
	}
	return nil
}

// heartbeat records this node as alive for one lease.
func (n *Node) heartbeat(ctx context.Context) error {
	now := n.clock.Now().UnixMilli()
	_, err := n.cfg.Pool.Exec(ctx, `INSERT INTO cluster_nodes (node_id, addr, heartbeat_at, expires_at, leaving)
		VALUES ($1, $2, $3, $4, false)
		ON CONFLICT (node_id) DO UPDATE SET addr = excluded.addr, heartbeat_at = excluded.heartbeat_at,
			expires_at = excluded.expires_at, leaving = false`,
		n.cfg.NodeID, n.cfg.Addr, now, now+n.cfg.Lease.Milliseconds())
	if err != nil {
		return fmt.Errorf("cluster: heartbeat: %w", err)
	}
	return nil
}

// expire drops the leases whose local deadline passed (a renewal failed
// for too long).
func (n *Node) expire() {
	now := n.clock.Now()
	var lost []int
	n.mu.Lock()
	for s, l := range n.owned {
		if !now.Before(l.deadline) {
			delete(n.owned, s)
			lost = append(lost, s)
		}
	}
	n.mu.Unlock()
	n.lost(lost)
}

func (n *Node) lost(shards []int) {
	if len(shards) == 0 {
		return
	}
	slices.Sort(shards)
	n.log.Warn("cluster: shard leases lost", "shards", len(shards))
	if n.cfg.Lost != nil {
		n.cfg.Lost(shards)
	}
}

// deadline is the local deadline of a lease renewed (or acquired) by a
// statement sent at t0: a quarter of the lease before it can expire.
func (n *Node) deadline(t0 time.Time) time.Time { return t0.Add(n.cfg.Lease - n.cfg.Lease/4) }

// renew extends every held lease whose epoch is still this node's; the
// others are lost.
func (n *Node) renew(ctx context.Context) error {
	n.mu.Lock()
	shards := make([]int32, 0, len(n.owned))
	epochs := make([]int64, 0, len(n.owned))
	for s, l := range n.owned {
		shards = append(shards, int32(s))
		epochs = append(epochs, l.epoch)
	}
	n.mu.Unlock()
	if len(shards) == 0 {
		return nil
	}
	t0 := n.clock.Now()
	rows, err := n.cfg.Pool.Query(ctx, `UPDATE cluster_shards s SET expires_at = $1
		FROM unnest($2::int[], $3::bigint[]) AS o(shard, epoch)
		WHERE s.shard = o.shard AND s.epoch = o.epoch AND s.owner = $4
		RETURNING s.shard`, t0.Add(n.cfg.Lease).UnixMilli(), shards, epochs, n.cfg.NodeID)
	if err != nil {
		return fmt.Errorf("cluster: renew leases: %w", err)
	}
	renewed, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("cluster: renew leases: %w", err)
	}
	kept := make(map[int]bool, len(renewed))
	for _, s := range renewed {
		kept[int(s)] = true
	}
	var lost []int
	dl := n.deadline(t0)
	n.mu.Lock()
	for i, s := range shards {
		l := n.owned[int(s)]
		if l == nil || l.epoch != epochs[i] {
			continue
		}
		if kept[int(s)] {
			l.deadline = dl
		} else {
			delete(n.owned, int(s))
			lost = append(lost, int(s))
		}
	}
	n.mu.Unlock()
	n.lost(lost)
	return nil
}

// read loads the owners of all shards and the live nodes, and returns how
// many live nodes take shards (this one included).
func (n *Node) read(ctx context.Context) (int, error) {
	now := n.clock.Now().UnixMilli()
	addrs := map[string]string{}
	live := 0
	rows, err := n.cfg.Pool.Query(ctx, `SELECT node_id, addr, leaving FROM cluster_nodes WHERE expires_at > $1`, now)
	if err != nil {
		return 0, fmt.Errorf("cluster: read nodes: %w", err)
	}
	self := false
	var takers []string
	for rows.Next() {
		var id, addr string
		var leaving bool
		if err := rows.Scan(&id, &addr, &leaving); err != nil {
			rows.Close()
			return 0, fmt.Errorf("cluster: read nodes: %w", err)
		}
		addrs[id] = addr
		if !leaving {
			live++
			if id != n.cfg.NodeID {
				takers = append(takers, addr)
			}
		}
		self = self || id == n.cfg.NodeID
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("cluster: read nodes: %w", err)
	}
	if !self {
		live++ // our heartbeat may be timed by a clock behind the others'
	}
	owners := make([]string, n.cfg.Shards)
	rows, err = n.cfg.Pool.Query(ctx, `SELECT shard, COALESCE(owner, '') FROM cluster_shards WHERE owner IS NOT NULL AND expires_at > $1`, now)
	if err != nil {
		return 0, fmt.Errorf("cluster: read shards: %w", err)
	}
	for rows.Next() {
		var s int
		var owner string
		if err := rows.Scan(&s, &owner); err != nil {
			rows.Close()
			return 0, fmt.Errorf("cluster: read shards: %w", err)
		}
		if s >= 0 && s < len(owners) {
			owners[s] = owner
		}
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("cluster: read shards: %w", err)
	}
	n.mu.Lock()
	n.owners, n.addrs, n.takers = owners, addrs, takers
	n.addrs[n.cfg.NodeID] = n.cfg.Addr
	n.mu.Unlock()
	return live, nil
}

// surplus picks k held shards to hand over: the highest numbered.
func (n *Node) surplus(k int) []int {
	own := n.Owned()
	return own[len(own)-k:]
}

// acquire takes up to k shards that have no owner or whose lease expired.
// Rows locked by a write transaction of their (late) owner are skipped:
// they are taken in a later round, after that transaction ended.
func (n *Node) acquire(ctx context.Context, k int) error {
	t0 := n.clock.Now()
	rows, err := n.cfg.Pool.Query(ctx, `UPDATE cluster_shards s SET owner = $1, epoch = s.epoch + 1, expires_at = $2
		WHERE s.shard IN (SELECT shard FROM cluster_shards WHERE owner IS NULL OR expires_at <= $3
			ORDER BY owner IS NOT NULL, shard LIMIT $4 FOR UPDATE SKIP LOCKED)
		RETURNING s.shard, s.epoch`, n.cfg.NodeID, t0.Add(n.cfg.Lease).UnixMilli(), t0.UnixMilli(), k)
	if err != nil {
		return fmt.Errorf("cluster: acquire leases: %w", err)
	}
	type got struct {
		Shard int32
		Epoch int64
	}
	acquired, err := pgx.CollectRows(rows, pgx.RowToStructByPos[got])
	if err != nil {
		return fmt.Errorf("cluster: acquire leases: %w", err)
	}
	if len(acquired) == 0 {
		return nil
	}
	dl := n.deadline(t0)
	shards := make([]int, 0, len(acquired))
	n.mu.Lock()
	for _, a := range acquired {
		n.owned[int(a.Shard)] = &lease{epoch: a.Epoch, deadline: dl}
		n.owners[a.Shard] = n.cfg.NodeID
		shards = append(shards, int(a.Shard))
	}
	n.mu.Unlock()
	slices.Sort(shards)
	n.log.Info("cluster: shards acquired", "shards", len(shards))
	if n.cfg.Acquired != nil {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.cfg.Acquired(n.ctx, shards)
		}()
	}
	return nil
}

// handOver drains shards, clears their owner and offers them to the other
// nodes (offer), so the next owner takes them at once rather than after
// the lease expires or at its next round. A request for one of them that
// reaches this node meanwhile waits for the hand-over to end (Moving).
func (n *Node) handOver(ctx context.Context, shards []int) error {
	if len(shards) == 0 {
		return nil
	}
	t0 := n.clock.Now()
	done := make(chan struct{})
	n.mu.Lock()
	var epochs []int64
	var keep []int32
	for _, s := range shards {
		if l := n.owned[s]; l != nil {
			l.draining = true
			keep = append(keep, int32(s))
			epochs = append(epochs, l.epoch)
			n.moving[s] = done
		}
	}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		for _, s := range keep {
			if n.moving[int(s)] == done {
				delete(n.moving, int(s))
			}
		}
		n.mu.Unlock()
		close(done)
	}()
	if n.cfg.Drain != nil {
		// Drain within the local deadline (the leases are not renewed
		// meanwhile: this Step holds stepMu) and within Config.MaxDrain (the
		// shards' instances are unavailable meanwhile).
		dctx, cancel := context.WithTimeout(ctx, n.drainLimit())
		n.cfg.Drain(dctx, shards)
		cancel()
	}
	drained := n.clock.Since(t0)
	// Writes stop here: the leases leave owned before their rows are
	// cleared, so no write of this node can follow the handover.
	n.mu.Lock()
	for _, s := range keep {
		delete(n.owned, int(s))
		n.owners[s] = ""
	}
	n.mu.Unlock()
	_, err := n.cfg.Pool.Exec(ctx, `UPDATE cluster_shards s SET owner = NULL, expires_at = 0
		FROM unnest($1::int[], $2::bigint[]) AS o(shard, epoch)
		WHERE s.shard = o.shard AND s.epoch = o.epoch AND s.owner = $3`, keep, epochs, n.cfg.NodeID)
	if err != nil {
		// The leases expire on their own; nothing of ours writes meanwhile.
		return fmt.Errorf("cluster: hand over shards: %w", err)
	}
	released := n.clock.Since(t0)
	taken := n.offer(ctx)
	n.log.Info("cluster: shards handed over", "shards", len(keep), "drained", drained, "released", released,
		"offered", n.clock.Since(t0), "taken", taken)
	return nil
}

// Leave hands every shard over and removes the node from the membership,
// then stops Run. The node cannot rejoin; Join again for that.
func (n *Node) Leave(ctx context.Context) error {
	n.stepMu.Lock()
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		n.stepMu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	_, herr := n.cfg.Pool.Exec(ctx, `UPDATE cluster_nodes SET leaving = true WHERE node_id = $1`, n.cfg.NodeID)
	err := n.handOver(ctx, n.Owned())
	_, derr := n.cfg.Pool.Exec(ctx, `DELETE FROM cluster_nodes WHERE node_id = $1`, n.cfg.NodeID)
	n.stepMu.Unlock()
	n.cancel()
	n.wg.Wait()
	return errors.Join(herr, err, derr)
}

// Close stops Run without handing shards over (their leases expire), for
// tests of a node that disappears.
func (n *Node) Close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
}

// Lookup reads the owner of the instance's shard from the database, for a
// request that arrives before this node's next read of the leases saw it.
func (n *Node) Lookup(ctx context.Context, path agent.Path) (nodeID, addr string, ok bool) {
	s := n.ShardOf(path)
	err := n.cfg.Pool.QueryRow(ctx, `SELECT s.owner, m.addr FROM cluster_shards s JOIN cluster_nodes m ON m.node_id = s.owner
		WHERE s.shard = $1 AND s.expires_at > $2 AND m.expires_at > $2`, s, n.clock.Now().UnixMilli()).Scan(&nodeID, &addr)
	if err != nil {
		return "", "", false
	}
	n.mu.Lock()
	n.owners[s] = nodeID
	n.addrs[nodeID] = addr
	n.mu.Unlock()
	return nodeID, addr, true
}
