package cluster

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
)

// startPeerNodes is startNodes with the node-to-node calls served (a Peer
// on each node), which the hand-over's offer goes through. No node runs
// its lease rounds on its own: the test steps them.
func startPeerNodes(t *testing.T, d *db, clock clockwork.Clock, ids ...string) []*testNode {
	t.Helper()
	var out []*testNode
	for _, id := range ids {
		tn := &testNode{owner: &fakeOwner{id: id}}
		tn.http = httptest.NewUnstartedServer(nil)
		tn.node = join(t, d, id, clock, func(c *Config) {
			c.Addr = tn.http.Listener.Addr().String()
			// The offer's wait is not what these tests time: a slow
			// machine must not turn it into a later round.
			c.MaxOffer = time.Minute
		})
		p := &Peer{Node: tn.node, Secret: "test-secret"}
		tn.node.UsePeer(p)
		tn.route = &Router{Node: tn.node, Local: tn.owner, Route: routeTest, Peer: p.Handler()}
		out = append(out, tn)
	}
	return out
}

// serve starts the nodes' HTTP servers, then settles the leases.
func serve(t *testing.T, ns []*testNode) {
	t.Helper()
	for _, tn := range ns {
		tn.http.Config.Handler = tn.route
		tn.http.Start()
		t.Cleanup(func() { tn.route.Close(); tn.http.Close() })
	}
	for range 3 {
		for _, tn := range ns {
			step(t, tn.node)
		}
	}
}

// getBody GETs url and returns the status and body.
func getBody(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestLeaveOffersShardsToTheNextOwner (issue 24, item 3): a node that
// leaves hands its shards to the others within its hand-over, in no lease
// round of theirs (they are not stepped after it began), and requests for
// its instances that reach it or another node during the hand-over wait
// for it and are answered by the new owner, not refused.
func TestLeaveOffersShardsToTheNextOwner(t *testing.T) {
	d := newDB(t)
	ns := startPeerNodes(t, d, clockwork.NewFakeClock(), "a", "b", "c")
	a, b, c := ns[0], ns[1], ns[2]
	draining := make(chan struct{})
	release := make(chan struct{})
	a.node.cfg.Drain = func(ctx context.Context, shards []int) {
		close(draining)
		<-release
	}
	waiting := make(chan struct{}, 2)
	a.route.onWait = func() { waiting <- struct{}{} }
	serve(t, ns)
	name := nameOwnedBy(t, a.node)
	path := agent.Path{{Class: "X", Name: name}}
	if id, _, _ := c.node.Owner(path); id != "a" {
		t.Fatalf("c reads %q as the owner of a's instance", id)
	}

	left := make(chan error, 1)
	go func() { left <- a.node.Leave(context.Background()) }()
	<-draining
	if a.node.Moving(path) == nil {
		t.Fatal("a is draining the instance's shard but does not report it moving")
	}
	type answer struct {
		via, body string
		status    int
		err       error
	}
	answers := make(chan answer, 2)
	for _, via := range []*testNode{a, c} {
		go func() {
			st, body, err := getBody(via.http.URL + "/agents/x/" + name)
			answers <- answer{via.node.ID(), body, st, err}
		}()
	}
	// Both requests reach a (c forwards to the owner it read) and wait.
	<-waiting
	<-waiting
	close(release)
	if err := <-left; err != nil {
		t.Fatal(err)
	}

	// The next owner holds the shard now, though neither b nor c ran a
	// lease round since a began to leave.
	s := a.node.ShardOf(path)
	own := owners(t, d)
	if len(own["a"]) != 0 || len(own[""]) != 0 {
		t.Fatalf("after a left: owners %v, want every shard taken by b and c", own)
	}
	if len(b.node.Owned())+len(c.node.Owned()) != testShards {
		t.Fatalf("b holds %d shards and c %d, want %d in all", len(b.node.Owned()), len(c.node.Owned()), testShards)
	}
	next := b
	if c.node.Owns(path) {
		next = c
	} else if !b.node.Owns(path) {
		t.Fatalf("no node serves shard %d after a's hand-over", s)
	}
	if err := fence(t, d, a.node, path); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("a writes to a handed-over shard: %v", err)
	}
	if err := fence(t, d, next.node, path); err != nil {
		t.Fatalf("the new owner %s cannot write: %v", next.node.ID(), err)
	}
	for range 2 {
		ans := <-answers
		if ans.err != nil || ans.status != http.StatusOK || !strings.HasPrefix(ans.body, next.node.ID()+" ") {
			t.Errorf("request via %s during the hand-over: %d %q %v, want 200 from %s", ans.via, ans.status, ans.body, ans.err, next.node.ID())
		}
	}
}

// TestSurplusIsOfferedToTheJoiningNode: a node that sheds its surplus to
// a node that joined hands it over within its own round: the joining node
// holds its share without a round of its own after the others'.
func TestSurplusIsOfferedToTheJoiningNode(t *testing.T) {
	d := newDB(t)
	clock := clockwork.NewFakeClock()
	ns := startPeerNodes(t, d, clock, "a")
	serve(t, ns)
	a := ns[0]
	if got := len(a.node.Owned()); got != testShards {
		t.Fatalf("a alone holds %d shards", got)
	}
	ns = startPeerNodes(t, d, clock, "b")
	b := ns[0]
	b.http.Config.Handler = b.route
	b.http.Start()
	t.Cleanup(func() { b.route.Close(); b.http.Close() })
	step(t, b.node) // b is live and reads every shard held
	step(t, a.node) // a sees b, hands half over, and offers it
	if got := len(b.node.Owned()); got != testShards/2 {
		t.Fatalf("b holds %d shards after a's round, want %d", got, testShards/2)
	}
	if own := owners(t, d); len(own["a"]) != testShards/2 || len(own["b"]) != testShards/2 {
		t.Fatalf("database owners: %v", own)
	}
}
