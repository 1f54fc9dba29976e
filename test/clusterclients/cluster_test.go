// Package clusterclients runs the clients people use, the web playground
// in a real browser and the `agentry chat` command, against a cluster of
// `agentry serve --postgres` node processes on loopback over one scratch
// PostgreSQL. They talk to a node that does not own their chat while other
// nodes are killed (SIGKILL): one that plays no part in the chat, and the
// chat's owner, whose death closes the client's socket with 1012 and sends
// the client to the new owner through the same node.
package clusterclients

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

var (
	pg      pgtest.Cluster
	agentry = &testenv.Binary{Pkg: "github.com/agentry/agentry/cmd/agentry", Race: testenv.Race}
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pg.Wrap(m), goleak.Cleanup(func(code int) {
		agentry.Remove()
		os.Exit(code)
	}))
}

// lease is the nodes' shard lease: 2s, or 5s for race-built nodes on a
// loaded two-core machine.
func lease() string {
	if testenv.Race {
		return "5s"
	}
	return "2s"
}

// demoCluster is a cluster of demo nodes (agentry serve --postgres).
type demoCluster struct {
	t     *testing.T
	url   string
	pool  *pgxpool.Pool
	nodes map[string]*testenv.Process
}

// startCluster starts a node for each id, with the demo's scripted models
// streaming a chunk every delay, and waits until each owns its share of
// the shards.
func startCluster(t *testing.T, delay time.Duration, ids ...string) *demoCluster {
	t.Helper()
	url := pg.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c := &demoCluster{t: t, url: url, pool: pool, nodes: map[string]*testenv.Process{}}
	for _, id := range ids {
		c.nodes[id] = testenv.StartProcess(t, 60*time.Second, agentry.Path(t), "serve", "--addr", "127.0.0.1:0",
			"--postgres", url, "--node-id", id, "--lease", lease(), "--delay", delay.String(), "--idle-timeout", "1h")
	}
	c.until(60*time.Second, "balanced shards", func() bool {
		count := map[string]int{}
		for _, o := range c.owners() {
			count[o]++
		}
		total := 0
		for _, id := range ids {
			if count[id] < cluster.DefaultShards/len(ids)-8 {
				return false
			}
			total += count[id]
		}
		return total == cluster.DefaultShards
	})
	return c
}

// until polls cond (a read of the shared database) until it holds, for at
// most limit: the nodes are other processes, with no event to wait for
// in this one.
func (c *demoCluster) until(limit time.Duration, what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// owners returns the live owner of each shard.
func (c *demoCluster) owners() map[int]string {
	rows, err := c.pool.Query(context.Background(), `SELECT shard, owner FROM cluster_shards WHERE owner IS NOT NULL`)
	if err != nil {
		return nil // the nodes have not created the table yet
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var s int
		var o string
		if err := rows.Scan(&s, &o); err != nil {
			c.t.Fatal(err)
		}
		out[s] = o
	}
	return out
}

// assistantName returns a name for an Assistant whose shard owner is id.
func (c *demoCluster) assistantName(id, prefix string) string {
	c.t.Helper()
	own := c.owners()
	for i := range 100000 {
		name := fmt.Sprint(prefix, i)
		if own[cluster.ShardOf(agent.Path{{Class: "Assistant", Name: name}}, cluster.DefaultShards)] == id {
			return name
		}
	}
	c.t.Fatal("no name")
	return ""
}

// kill kills node id (SIGKILL), after checking that the Assistant name's
// latest turn is still streaming: a kill after the turn ended would test
// nothing.
func (c *demoCluster) kill(id, name string) {
	c.t.Helper()
	var status string
	err := c.pool.QueryRow(context.Background(), `SELECT s.status FROM chat_streams s JOIN instances i ON i.id = s.instance_id
		WHERE i.class = 'Assistant' AND i.name = $1 ORDER BY s.created_at DESC LIMIT 1`, name).Scan(&status)
	if err != nil {
		c.t.Fatalf("the turn of %s: %v", name, err)
	}
	if status != "streaming" {
		c.t.Fatalf("the turn of %s is %s before the kill of %s, not streaming", name, status, id)
	}
	_ = c.nodes[id].Kill() // its exit status is "killed"
	c.t.Logf("killed %s mid-turn", id)
}
