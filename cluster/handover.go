package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/agentry/agentry/agent"
)

// The hand-over of shards by a node that leaves or sheds its surplus is
// driven by events, not by the lease rounds: once the shards' rows are
// cleared, the node offers them to every other live node (a take-shards
// call), which runs its acquisition at once and answers when it holds its
// share; the hand-over ends after those answers. A request for one of the
// shards that reaches the node while it hands them over waits for that end
// (Moving) and is then forwarded to the new owner, instead of being
// refused. So an instance is unavailable for its drain (Config.MaxDrain at
// most), the release of the rows and the offer (Config.MaxOffer at most),
// and never for
// a renewal round of the next owner.

// DefaultMaxDrain is Config.MaxDrain's zero value: how long a hand-over
// waits for the work in flight on the shards' instances to end (a quarter
// lease, if that is shorter). Work still running then goes on without
// writing (the fence refuses it once the shards are released) and the new
// owner recovers it, as after a lost lease.
const DefaultMaxDrain = 500 * time.Millisecond

// DefaultMaxOffer is Config.MaxOffer's zero value: how long a hand-over
// waits for the other nodes to take the shards it offered (a quarter
// lease, if that is shorter). A node that did not answer by then takes
// them at its next round.
const DefaultMaxOffer = 250 * time.Millisecond

// drainLimit and offerLimit are the hand-over's bounds (Config.MaxDrain,
// Config.MaxOffer).
func (n *Node) drainLimit() time.Duration { return n.cfg.MaxDrain }
func (n *Node) offerLimit() time.Duration { return n.cfg.MaxOffer }

// takeCall is the request of a take-shards call, and takeAnswer its answer.
type takeCall struct {
	From string `json:"from"`
}

type takeAnswer struct {
	// Took is how many shards the node acquired on this call.
	Took int `json:"took"`
}

// offer asks each other live node that takes shards to acquire free ones
// now, and waits for their answers, at most offerLimit. It returns
// how many shards they took. Without a peer (UsePeer) it does nothing:
// the others take the shards at their next round.
func (n *Node) offer(ctx context.Context) int {
	n.mu.Lock()
	p := n.peer
	takers := slices.Clone(n.takers)
	n.mu.Unlock()
	if p == nil || len(takers) == 0 {
		return 0
	}
	body, err := json.Marshal(takeCall{From: n.cfg.NodeID})
	if err != nil {
		return 0
	}
	octx, cancel := context.WithTimeout(ctx, n.offerLimit())
	defer cancel()
	var mu sync.Mutex
	took := 0
	var wg sync.WaitGroup
	for _, addr := range takers {
		wg.Go(func() {
			var out takeAnswer
			if err := p.post(octx, addr, "take-shards", body, &out); err != nil {
				// That node takes them at its next round.
				n.log.Info("cluster: offer shards", "to", addr, "err", err)
				return
			}
			mu.Lock()
			took += out.Took
			mu.Unlock()
		})
	}
	wg.Wait()
	return took
}

// Take runs the acquisition part of a lease round now: it reads the
// cluster and acquires free or expired shards up to this node's share. It
// serves another node's offer (a take-shards call) and returns how many
// shards it acquired.
//
// A round in progress that hands shards over (a node above its share,
// which would take nothing) may drain for a quarter lease: Take does not
// wait for it, asks Run for one more round right after it, and returns 0.
// Another round in progress is short, and Take runs after it.
func (n *Node) Take(ctx context.Context) (int, error) {
	if !n.stepMu.TryLock() {
		n.mu.Lock()
		shedding := len(n.moving) > 0
		n.mu.Unlock()
		if shedding {
			select {
			case n.kick <- struct{}{}:
			default:
			}
			return 0, nil
		}
		n.stepMu.Lock()
	}
	defer n.stepMu.Unlock()
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return 0, nil
	}
	live, err := n.read(ctx)
	if err != nil {
		return 0, err
	}
	target := (n.cfg.Shards + live - 1) / max(live, 1)
	n.mu.Lock()
	have := len(n.owned)
	n.mu.Unlock()
	if have >= target {
		return 0, nil
	}
	before := have
	if err := n.acquire(ctx, target-have); err != nil {
		return 0, err
	}
	n.mu.Lock()
	have = len(n.owned)
	n.mu.Unlock()
	return have - before, nil
}

// Moving returns a channel closed when this node's hand-over of the
// instance's shard ends (the shard released and offered to the other
// nodes), or nil when this node is not handing it over.
func (n *Node) Moving(path agent.Path) <-chan struct{} {
	s := n.ShardOf(path)
	n.mu.Lock()
	defer n.mu.Unlock()
	if ch, ok := n.moving[s]; ok {
		return ch
	}
	return nil
}

// serveTake serves a take-shards call.
func (p *Peer) serveTake(ctx context.Context, data []byte) (any, error) {
	var in takeCall
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, badRequest(err)
	}
	// The acquisition is not cut when the offering node stops waiting.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.Node.Lease()/4)
	defer cancel()
	took, err := p.Node.Take(tctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: take shards offered by %s: %w", in.From, err)
	}
	return takeAnswer{Took: took}, nil
}
