package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/client"
)

// stuckClients are sockets that never read (-stuck): each joins the
// instance of one user and lets the server's frames pile up, so that a run
// with them, against one without, shows whether a client that does not
// read slows the others (the server's per-socket queue limits and write
// timeout should close them, see docs/limits.md).
type stuckClients struct {
	conns []*websocket.Conn
}

// openStuck opens n sockets that never read, one on each of the first n
// instances (in turn if fewer).
func openStuck(ctx context.Context, g *gen, insts []*instance, n int) (*stuckClients, error) {
	s := &stuckClients{}
	for i := range n {
		in := insts[i%len(insts)]
		base := g.cfg.URLs[i%len(g.cfg.URLs)]
		u := strings.Replace(base, "http", "ws", 1) + "/agents/assistant/" + client.EncodeURIComponent(in.name)
		h := http.Header{}
		if g.cfg.Token != "" {
			h.Set("Authorization", "Bearer "+g.cfg.Token)
		}
		c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h, HTTPClient: g.hc})
		if err != nil {
			s.close()
			return nil, fmt.Errorf("stuck socket %d: %w", i, err)
		}
		s.conns = append(s.conns, c)
	}
	return s, nil
}

func (s *stuckClients) close() {
	for _, c := range s.conns {
		c.CloseNow()
	}
}
