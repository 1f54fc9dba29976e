package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/agentry/agentry/agent"
)

// Drill-in across nodes. A client's request for a sub-agent reaches the
// sub-agent's owner, whose server asks each parent on the way whether it
// may be reached (agent.Runtime.CheckSubAgent). A parent on another node is
// asked there, by a node-to-node call that carries the client's request
// line and headers: the parent's node authenticates the request again
// (Peer.Gate, the application's server) and runs the parent's gates.

var (
	_ agent.RemoteGate      = (*Node)(nil)
	_ agent.RemoteForgetter = (*Node)(nil)
)

// ForgetRemote tells the other nodes to drop the destroyed instances at
// paths they hold in memory (agent.RemoteForgetter), through the peer.
func (n *Node) ForgetRemote(ctx context.Context, paths []agent.Path) error {
	n.mu.Lock()
	p := n.peer
	n.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.ForgetDestroyed(ctx, paths)
}

// UsePeer makes p the way this node asks other nodes' gates
// (CheckRemoteSubAgent). clusterserve calls it.
func (n *Node) UsePeer(p *Peer) {
	n.mu.Lock()
	n.peer = p
	n.mu.Unlock()
}

// peerCallKey marks the context of a node-to-node call being served: its
// gate never asks another node in turn.
type peerCallKey struct{}

// CheckRemoteSubAgent asks the owner of path's parent whether a client
// may reach the sub-agent at path (agent.RemoteGate).
func (n *Node) CheckRemoteSubAgent(ctx context.Context, r *http.Request, path agent.Path) error {
	n.mu.Lock()
	p := n.peer
	n.mu.Unlock()
	if p == nil || ctx.Value(peerCallKey{}) != nil {
		return fmt.Errorf("%w: %s", agent.ErrNotOwner, path.Parent())
	}
	return p.CheckSubAgent(ctx, r, path)
}

// gateCall is the request of a check-sub-agent call: the sub-agent's path
// and the client's request as it reached the sub-agent's node.
type gateCall struct {
	Path       string      `json:"path"`
	Method     string      `json:"method"`
	URI        string      `json:"uri"`
	Host       string      `json:"host"`
	Header     http.Header `json:"header"`
	RemoteAddr string      `json:"remoteAddr"`
}

// gateAnswer is its answer: Status 0 admits, else the refusal's status
// and message.
type gateAnswer struct {
	Status  int    `json:"status"`
	Message string `json:"message,omitempty"`
}

// answerOf turns a gate's error into its answer, as the server would
// write it.
func answerOf(err error) gateAnswer {
	var he *agent.HTTPError
	switch {
	case err == nil:
		return gateAnswer{}
	case errors.As(err, &he):
		msg := he.Message
		if msg == "" {
			msg = http.StatusText(he.Status)
		}
		return gateAnswer{Status: he.Status, Message: msg}
	case errors.Is(err, agent.ErrTooManyInstances):
		return gateAnswer{Status: http.StatusServiceUnavailable, Message: "server busy: too many agents in memory, try again later"}
	default:
		return gateAnswer{Status: http.StatusNotFound, Message: http.StatusText(http.StatusNotFound)}
	}
}

func (a gateAnswer) err() error {
	if a.Status == 0 {
		return nil
	}
	return &agent.HTTPError{Status: a.Status, Message: a.Message}
}

// CheckSubAgent asks the owner of path's parent whether the client's
// request r may reach the sub-agent at path. A refusal is an
// *agent.HTTPError with the parent's answer.
func (p *Peer) CheckSubAgent(ctx context.Context, r *http.Request, path agent.Path) error {
	if len(path) < 2 {
		return nil
	}
	in := gateCall{Path: path.String(), Method: r.Method, URI: r.URL.RequestURI(), Host: r.Host, Header: r.Header, RemoteAddr: r.RemoteAddr}
	var out gateAnswer
	err := p.call(ctx, path.Parent(), "check-sub-agent", in, &out, func(ctx context.Context) error {
		var err error
		out, err = p.gate(ctx, r, path)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.Node.log.Warn("cluster: remote sub-agent gate", "path", path, "err", err)
		return &agent.HTTPError{Status: http.StatusServiceUnavailable, Message: "parent agent unreachable, try again shortly"}
	}
	return out.err()
}

// gate runs, on the parent's owner, the gate of the sub-agent at path.
// An error is a failure to decide (this node no longer owns the parent),
// never the refusal, which is the answer.
func (p *Peer) gate(ctx context.Context, r *http.Request, path agent.Path) (gateAnswer, error) {
	if !p.Node.Owns(path.Parent()) {
		return gateAnswer{}, fmt.Errorf("%w: %s", ErrNotOwner, path.Parent())
	}
	ctx = context.WithValue(ctx, peerCallKey{}, true)
	r = r.WithContext(ctx)
	var err error
	if p.Gate != nil {
		err = p.Gate(r, path)
	} else {
		err = p.Runtime.CheckSubAgent(ctx, r, path)
	}
	if errors.Is(err, agent.ErrNotOwner) {
		return gateAnswer{}, err
	}
	return answerOf(err), nil
}

// serveGate serves a check-sub-agent call.
func (p *Peer) serveGate(ctx context.Context, data []byte) (any, error) {
	var in gateCall
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, badRequest(err)
	}
	path, err := agent.ParsePath(in.Path)
	if err != nil || len(path) < 2 {
		return nil, badRequest(fmt.Errorf("not a sub-agent path: %q", in.Path))
	}
	if in.Method == "" {
		in.Method = http.MethodGet
	}
	r, err := http.NewRequestWithContext(ctx, in.Method, "http://"+in.Host+in.URI, nil)
	if err != nil {
		return nil, badRequest(fmt.Errorf("client request: %w", err))
	}
	r.Host, r.RemoteAddr = in.Host, in.RemoteAddr
	if in.Header != nil {
		r.Header = in.Header
	}
	return p.gate(ctx, r, path)
}
