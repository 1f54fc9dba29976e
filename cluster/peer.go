package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/store"
)

// PeerPrefix is the URL path prefix of the node-to-node calls.
const PeerPrefix = "/_agentry/cluster/"

// secretHeader carries the cluster's shared secret on node-to-node calls.
const secretHeader = "X-Agentry-Cluster-Secret"

// maxPeerBody bounds the body of a node-to-node call (a run's input).
const maxPeerBody = 16 << 20

// Peer is the node-to-node calls of a cluster over HTTP: it implements
// agenttool.Remote for this node's parents (calling the owner of a child)
// and serves those calls for this node's children (Handler). Calls carry
// the cluster's shared secret (Secret, kept in the database), and the
// handler refuses any request without it.
type Peer struct {
	// Node answers who owns a child. Required.
	Node *Node
	// Runtime hosts this node's children; set it before the node serves.
	Runtime *agent.Runtime
	// Secret is the cluster's shared secret (Secret).
	Secret string
	// Client makes the calls; nil means a client with a 30-second timeout.
	Client *http.Client
	// Gate decides, on this node (the owner of path's parent), whether a
	// client's request may reach the sub-agent at path: the application
	// server's authentication and the parents' gates
	// (server.Server.CheckSubAgent). Nil means Runtime.CheckSubAgent, which
	// does not authenticate.
	Gate func(r *http.Request, path agent.Path) error
	// Hints is the LISTEN/NOTIFY wake-up of followers; nil means none
	// (followers poll).
	Hints *Hints
}

var (
	_ agenttool.Remote = (*Peer)(nil)
	_ agenttool.Hints  = (*Peer)(nil)
)

// Hint sends a wake-up hint for child (agenttool.Hints).
func (p *Peer) Hint(child agent.Path) {
	if p.Hints != nil {
		p.Hints.Hint(child)
	}
}

// Watch watches the hints for child (agenttool.Hints); without Hints it
// returns no channel. While the listening connection is down no hint
// arrives, and its reconnection wakes every watcher.
func (p *Peer) Watch(child agent.Path) (<-chan struct{}, func()) {
	if p.Hints == nil {
		return nil, func() {}
	}
	return p.Hints.Watch(child)
}

// errBadRequest marks a node-to-node call whose request is malformed.
var errBadRequest = errors.New("bad request")

func badRequest(err error) error { return fmt.Errorf("%w: %w", errBadRequest, err) }

// Secret returns the cluster's shared secret for node-to-node calls,
// creating it on first use. It lives in the database, which every node
// can read and nothing else needs to.
func Secret(ctx context.Context, n *Node) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	var s string
	err := pgx.BeginFunc(ctx, n.cfg.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO cluster_config (key, value) VALUES ('peer_secret', $1) ON CONFLICT DO NOTHING`, hex.EncodeToString(b[:])); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT value FROM cluster_config WHERE key = 'peer_secret'`).Scan(&s)
	})
	if err != nil {
		return "", fmt.Errorf("cluster: peer secret: %w", err)
	}
	return s, nil
}

// StartChild asks the child's owner to start the run.
func (p *Peer) StartChild(ctx context.Context, req agenttool.RemoteStart) (string, error) {
	var out struct {
		StreamID string `json:"streamId"`
	}
	err := p.call(ctx, req.Child(), "start-child", req, &out, func(ctx context.Context) error {
		id, err := agenttool.StartRemoteChild(ctx, p.Runtime, req)
		out.StreamID = id
		return err
	})
	return out.StreamID, err
}

// CancelChild asks the child's owner to abort the run.
func (p *Peer) CancelChild(ctx context.Context, req agenttool.RemoteCancel) error {
	return p.call(ctx, req.Child, "cancel-child", req, nil, func(ctx context.Context) error {
		return agenttool.CancelRemoteChild(ctx, p.Runtime, req)
	})
}

// destroyCall is the request of a destroy-child call.
type destroyCall struct {
	Child agent.Path `json:"child"`
}

// DestroyChild asks the child's owner to destroy the child.
func (p *Peer) DestroyChild(ctx context.Context, child agent.Path) error {
	return p.call(ctx, child, "destroy-child", destroyCall{Child: child}, nil, func(ctx context.Context) error {
		return agenttool.DestroyRemoteChild(ctx, p.Runtime, child)
	})
}

// AnswerChild gives the child's owner the answer to a call its run waits
// for. The owner's refusals come back as the errors agenttool.Remote
// names: agenttool.ErrRunNotWaiting and chat.ErrNotWaiting.
func (p *Peer) AnswerChild(ctx context.Context, req agenttool.RemoteAnswer) error {
	err := p.call(ctx, req.Child, "answer-child", req, nil, func(ctx context.Context) error {
		return agenttool.AnswerRemoteChild(ctx, p.Runtime, req)
	})
	var se *statusError
	if errors.As(err, &se) {
		switch se.status {
		case http.StatusNotFound:
			return fmt.Errorf("%w (%s)", agenttool.ErrRunNotWaiting, se.text)
		case http.StatusConflict:
			return fmt.Errorf("%w (%s)", chat.ErrNotWaiting, se.text)
		}
	}
	return err
}

// statusError is a node-to-node call the owner answered with an error.
type statusError struct {
	op, addr string
	status   int
	text     string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("cluster: %s on %s: %d %s", e.op, e.addr, e.status, e.text)
}

// forgetCall is the request of a forget-destroyed call.
type forgetCall struct {
	Paths []agent.Path `json:"paths"`
}

// forgetBatch bounds the paths of one forget-destroyed call.
const forgetBatch = 500

// ForgetDestroyed tells the nodes that own the instances at paths
// (descendants of an instance this node destroyed, whose rows are gone)
// to drop those they hold in memory: one call per owner and batch, each
// sent once (a node not reached drops them when it loses them).
func (p *Peer) ForgetDestroyed(ctx context.Context, paths []agent.Path) error {
	byOwner := map[string][]agent.Path{}
	for _, path := range paths {
		if _, addr, ok := p.Node.Owner(path); ok {
			byOwner[addr] = append(byOwner[addr], path)
		}
	}
	var errs []error
	for addr, list := range byOwner {
		for batch := range slices.Chunk(list, forgetBatch) {
			body, err := json.Marshal(forgetCall{Paths: batch})
			if err == nil {
				actx, cancel := context.WithTimeout(ctx, p.Node.Lease()/2)
				err = p.post(actx, addr, "forget-destroyed", body, nil)
				cancel()
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("cluster: forget-destroyed on %s: %w", addr, err))
			}
		}
	}
	return errors.Join(errs...)
}

// errMoving is a call that reached no owner: the shard is changing hands.
var errMoving = errors.New("cluster: no owner reachable")

// call sends a node-to-node call to the owner of path, or runs local when
// this node owns it. While the shard changes hands (no owner, a refused
// or failed call) it retries, for up to two leases.
func (p *Peer) call(ctx context.Context, path agent.Path, op string, in, out any, local func(context.Context) error) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	clock := p.Node.clock
	// Long enough for a dead owner's lease to expire and a new owner to
	// take the shard.
	deadline := clock.Now().Add(4 * p.Node.Lease())
	wait := 20 * time.Millisecond
	for {
		if p.Node.Owns(path) {
			err = local(ctx)
			// A fence that refused the write (the lease lapsed, during
			// a database outage or a pause) is a shard changing hands
			// too.
			if !errors.Is(err, agent.ErrNotOwner) && !errors.Is(err, ErrNotOwner) && !errors.Is(err, ErrFenced) {
				return err
			}
		} else if _, addr, ok := p.Node.Owner(path); ok {
			// One attempt lasts at most half a lease: an owner that does
			// not answer (paused, or dying) loses the shard soon, and the
			// call goes to the next owner (both calls are idempotent).
			actx, cancel := context.WithTimeout(ctx, p.Node.Lease()/2)
			err = p.post(actx, addr, op, body, out)
			cancel()
			if err != nil && ctx.Err() == nil && actx.Err() != nil {
				err = fmt.Errorf("%w: %w", errMoving, err)
			}
			if err == nil || !errors.Is(err, errMoving) {
				return err
			}
		} else {
			err = errMoving
		}
		if !clock.Now().Before(deadline) {
			if errors.Is(err, errMoving) {
				// No owner answered in the whole window: unavailable,
				// as a database that cannot be reached (the caller
				// neither decides nor records anything on it).
				return fmt.Errorf("cluster: %s %s: %w (%w)", op, path, err, store.ErrUnavailable)
			}
			return fmt.Errorf("cluster: %s %s: %w", op, path, err)
		}
		t := clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.Chan():
		}
		wait = min(wait*2, p.Node.Lease()/4)
	}
}

func (p *Peer) post(ctx context.Context, addr, op string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+PeerPrefix+op, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set(secretHeader, p.Secret)
	req.Header.Set("Content-Type", "application/json")
	c := p.Client
	if c == nil {
		c = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", errMoving, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxPeerBody))
	switch {
	case resp.StatusCode == http.StatusMisdirectedRequest || resp.StatusCode == http.StatusServiceUnavailable:
		return fmt.Errorf("%w: %s", errMoving, strings.TrimSpace(string(data)))
	case resp.StatusCode != http.StatusOK:
		return &statusError{op: op, addr: addr, status: resp.StatusCode, text: strings.TrimSpace(string(data))}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// Handler serves the node-to-node calls under PeerPrefix.
func (p *Peer) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if p.Secret == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get(secretHeader)), []byte(p.Secret)) != 1 {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		data, err := io.ReadAll(io.LimitReader(r.Body, maxPeerBody+1))
		if err != nil || len(data) > maxPeerBody {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		var out any
		switch strings.TrimPrefix(r.URL.Path, PeerPrefix) {
		case "start-child":
			var req agenttool.RemoteStart
			if err = json.Unmarshal(data, &req); err != nil {
				err = badRequest(err)
				break
			}
			var id string
			// The child's turn outlives the call.
			id, err = agenttool.StartRemoteChild(context.WithoutCancel(ctx), p.Runtime, req)
			out = map[string]string{"streamId": id}
		case "cancel-child":
			var req agenttool.RemoteCancel
			if err = json.Unmarshal(data, &req); err != nil {
				err = badRequest(err)
				break
			}
			err = agenttool.CancelRemoteChild(ctx, p.Runtime, req)
			out = map[string]string{}
		case "destroy-child":
			var req destroyCall
			if err = json.Unmarshal(data, &req); err != nil {
				err = badRequest(err)
				break
			}
			err = agenttool.DestroyRemoteChild(ctx, p.Runtime, req.Child)
			out = map[string]string{}
		case "answer-child":
			var req agenttool.RemoteAnswer
			if err = json.Unmarshal(data, &req); err != nil {
				err = badRequest(err)
				break
			}
			// The continuation turn the answer starts outlives the call.
			err = agenttool.AnswerRemoteChild(context.WithoutCancel(ctx), p.Runtime, req)
			out = map[string]string{}
		case "forget-destroyed":
			var req forgetCall
			if err = json.Unmarshal(data, &req); err != nil {
				err = badRequest(err)
				break
			}
			if slices.ContainsFunc(req.Paths, func(p agent.Path) bool { return len(p) < 2 }) {
				err = badRequest(errors.New("forget-destroyed names descendants: paths of two steps or more"))
				break
			}
			p.Runtime.ForgetDestroyed(req.Paths)
			out = map[string]string{}
		case "check-sub-agent":
			out, err = p.serveGate(ctx, data)
		case "take-shards":
			out, err = p.serveTake(ctx, data)
		default:
			http.NotFound(w, r)
			return
		}
		switch {
		case errors.Is(err, errBadRequest), errors.Is(err, agenttool.ErrBadRemoteCall):
			http.Error(w, err.Error(), http.StatusBadRequest)
		case errors.Is(err, agent.ErrNotOwner), errors.Is(err, ErrNotOwner), errors.Is(err, ErrFenced):
			http.Error(w, err.Error(), http.StatusMisdirectedRequest)
		case errors.Is(err, agenttool.ErrRunNotWaiting):
			http.Error(w, err.Error(), http.StatusNotFound)
		case errors.Is(err, chat.ErrUnknownToolCall), errors.Is(err, chat.ErrNotWaiting), errors.Is(err, chat.ErrTurnRunning):
			http.Error(w, err.Error(), http.StatusConflict)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(out)
		}
	})
}
