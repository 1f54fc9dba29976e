package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/agentry/agentry/agent"
)

// ForwardedHeader marks a request that a node forwarded to the owner it
// read for the instance (one value per node on its way). A node that
// receives one for an instance it does not serve answers 503 (the client
// retries) rather than forwarding it again, so two nodes that disagree for
// a moment never pass a request back and forth; the one exception is a
// node that was handing the instance's shard over: the request waited for
// the hand-over, and it forwards it once more, to the new owner.
const ForwardedHeader = "X-Agentry-Forwarded-By"

// Router is the HTTP front of a cluster node. A request to an instance this
// node serves goes to Local (the node's server.Server); a request to an
// instance another node owns is forwarded to that node: plain HTTP through
// a reverse proxy, a WebSocket by bridging its frames both ways. When the
// owner's side of a bridged socket ends without a close frame (the owner
// died), the client's socket is closed with 1012 (service restart): the npm
// clients reconnect, reach the shard's new owner, and resume from the
// stored chunks. A close frame of the owner (1012 when it hands the shard
// over, 4001 for a refusal) is passed on as it is.
type Router struct {
	// Node answers who owns an instance. Required.
	Node *Node
	// Local serves the requests of this node's instances and every
	// request that is not addressed to an instance. Required.
	Local http.Handler
	// Route parses an escaped URL path into the instance it addresses
	// (server.Server.ParseRoute); ok false means not an agent route.
	// Required.
	Route func(escapedPath string) (path agent.Path, ok bool)
	// Peer serves the node-to-node calls (Peer.Handler) under PeerPrefix;
	// nil answers them 404.
	Peer http.Handler
	// MaxSockets bounds the WebSockets bridged at once; zero means 10,000.
	MaxSockets int
	// Logger receives the router's logs; nil means slog.Default().
	Logger *slog.Logger

	once    sync.Once
	proxies sync.Map // addr → *httputil.ReverseProxy
	mu      sync.Mutex
	bridges map[*bridge]struct{}
	closing bool
	wg      sync.WaitGroup
	onWait  func() // tests: a request starts waiting for a hand-over
}

func (rt *Router) init() {
	rt.once.Do(func() {
		if rt.MaxSockets <= 0 {
			rt.MaxSockets = 10_000
		}
		if rt.Logger == nil {
			rt.Logger = slog.Default()
		}
		rt.bridges = map[*bridge]struct{}{}
	})
}

// ServeHTTP routes a request to the instance's owner. A request for an
// instance whose shard this node is handing over waits for the hand-over
// to end (Node.Moving), then goes to the new owner.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt.init()
	if strings.HasPrefix(r.URL.Path, PeerPrefix) {
		if rt.Peer == nil {
			http.NotFound(w, r)
			return
		}
		rt.Peer.ServeHTTP(w, r)
		return
	}
	path, ok := rt.Route(r.URL.EscapedPath())
	if !ok || rt.Node.Owns(path) {
		rt.Local.ServeHTTP(w, r)
		return
	}
	waited := false
	if ch := rt.Node.Moving(path); ch != nil {
		// This node is handing the shard over: wait for the hand-over to
		// end (the drain and the offer to the other nodes, each bounded:
		// Config.MaxDrain, Config.MaxOffer), then route to the new owner. A hand-over
		// slower than that (its database writes are slow) is not waited
		// for.
		if rt.onWait != nil {
			rt.onWait()
		}
		t := rt.Node.clock.NewTimer(rt.Node.drainLimit() + rt.Node.offerLimit())
		select {
		case <-ch:
			waited = true
		case <-t.Chan():
		case <-r.Context().Done():
			t.Stop()
			return
		}
		t.Stop()
		if rt.Node.Owns(path) {
			rt.Local.ServeHTTP(w, r)
			return
		}
	}
	owner, addr, known := rt.Node.Owner(path)
	if !known || owner == rt.Node.ID() {
		owner, addr, known = rt.Node.Lookup(r.Context(), path)
	}
	// A forwarded request is forwarded again only when it reached the
	// node that was handing the shard over and waited for the hand-over:
	// once, to the new owner, which serves it or refuses it.
	hops := r.Header.Values(ForwardedHeader)
	if !known || owner == rt.Node.ID() || len(hops) > 0 && (!waited || len(hops) > 1) {
		// No owner yet (its lease expired, or it is being handed over), or
		// a forward that reached a node that no longer serves it.
		w.Header().Set("Retry-After", "1")
		http.Error(w, "agent moving between nodes, try again shortly", http.StatusServiceUnavailable)
		return
	}
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		rt.bridge(w, r, addr)
		return
	}
	rt.proxy(addr).ServeHTTP(w, r)
}

// proxy returns the reverse proxy to a node.
func (rt *Router) proxy(addr string) *httputil.ReverseProxy {
	if p, ok := rt.proxies.Load(addr); ok {
		return p.(*httputil.ReverseProxy)
	}
	target := &url.URL{Scheme: "http", Host: addr}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host // the owner checks the same Host as we would
			pr.SetXForwarded()
			pr.Out.Header.Add(ForwardedHeader, rt.Node.ID())
		},
		FlushInterval: -1, // stream responses as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			rt.Logger.Warn("cluster: forward", "to", addr, "err", err)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "owner node unreachable, try again shortly", http.StatusServiceUnavailable)
		},
	}
	v, _ := rt.proxies.LoadOrStore(addr, p)
	return v.(*httputil.ReverseProxy)
}

// handshakeHeaders are the WebSocket handshake's own headers, which the
// dial to the owner makes anew.
var handshakeHeaders = []string{"Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version",
	"Sec-Websocket-Extensions", "Sec-Websocket-Accept", "Sec-Websocket-Protocol"}

// bridge is one client WebSocket forwarded to its owner.
type bridge struct {
	client, owner *websocket.Conn
}

// bridge dials the owner with the client's handshake, relays a refusal
// as it is, and otherwise accepts the client and copies frames both ways
// until either side ends.
func (rt *Router) bridge(w http.ResponseWriter, r *http.Request, addr string) {
	rt.mu.Lock()
	if rt.closing || len(rt.bridges) >= rt.MaxSockets {
		rt.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many forwarded connections, try again later", http.StatusServiceUnavailable)
		return
	}
	b := &bridge{}
	rt.bridges[b] = struct{}{}
	rt.wg.Add(1)
	rt.mu.Unlock()
	defer func() {
		rt.mu.Lock()
		delete(rt.bridges, b)
		rt.mu.Unlock()
		rt.wg.Done()
	}()

	h := r.Header.Clone()
	for _, k := range handshakeHeaders {
		h.Del(k)
	}
	h.Add(ForwardedHeader, rt.Node.ID())
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		h.Set("X-Forwarded-For", ip)
	}
	u := url.URL{Scheme: "ws", Host: addr, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	dctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	owner, resp, err := websocket.Dial(dctx, u.String(), &websocket.DialOptions{HTTPHeader: h, Host: r.Host})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			// The owner refused the upgrade (403, 404, 503, …): pass it on.
			for k, vs := range resp.Header {
				for _, v := range vs {
					w.Header().Add(k, v)
				}
			}
			w.WriteHeader(resp.StatusCode)
			if resp.Body != nil {
				_, _ = io.Copy(w, io.LimitReader(resp.Body, 64<<10))
			}
			return
		}
		rt.Logger.Warn("cluster: forward socket", "to", addr, "err", err)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "owner node unreachable, try again shortly", http.StatusServiceUnavailable)
		return
	}
	// The owner checked Origin and authorization with the client's own
	// headers; accept what it accepted.
	client, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		owner.Close(websocket.StatusGoingAway, "client handshake failed")
		return
	}
	client.SetReadLimit(-1) // frames are streamed, never held whole
	owner.SetReadLimit(-1)
	rt.mu.Lock()
	b.client, b.owner = client, owner
	closing := rt.closing
	rt.mu.Unlock()
	if closing {
		client.Close(websocket.StatusGoingAway, "node shutting down")
		owner.Close(websocket.StatusGoingAway, "node shutting down")
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	errc := make(chan error, 2)
	go func() { errc <- pump(ctx, owner, client, false) }() // client → owner
	go func() { errc <- pump(ctx, client, owner, true) }()  // owner → client
	first := <-errc
	code, reason := closeOf(first)
	if errors.Is(first, errFromOwner) {
		if code == 0 || code == websocket.StatusAbnormalClosure {
			// The owner vanished: a restart code, so the client reconnects
			// and reaches the new owner.
			code, reason = websocket.StatusServiceRestart, "agent moved to another node"
		}
		client.Close(code, reason)
		owner.CloseNow()
	} else {
		if code == 0 || code == websocket.StatusAbnormalClosure || code == websocket.StatusNoStatusRcvd {
			code, reason = websocket.StatusGoingAway, "client went away"
		}
		owner.Close(code, reason)
		client.CloseNow()
	}
	stop()
	<-errc
}

// errFromOwner wraps an error of reading the owner's side.
var errFromOwner = errors.New("owner side")

// pump copies messages from src to dst, one at a time, streaming each.
// Errors of the owner's side (reading from it or writing to it) are
// wrapped with errFromOwner.
func pump(ctx context.Context, dst, src *websocket.Conn, srcIsOwner bool) error {
	side := func(owner bool, err error) error {
		if owner {
			return fmt.Errorf("%w: %w", errFromOwner, err)
		}
		return err
	}
	for {
		typ, rd, err := src.Reader(ctx)
		if err != nil {
			return side(srcIsOwner, err)
		}
		wr, err := dst.Writer(ctx, typ)
		if err != nil {
			return side(!srcIsOwner, err)
		}
		if _, err := io.Copy(wr, rd); err != nil {
			return side(srcIsOwner, err)
		}
		if err := wr.Close(); err != nil {
			return side(!srcIsOwner, err)
		}
	}
}

func closeOf(err error) (websocket.StatusCode, string) {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Code, ce.Reason
	}
	return 0, ""
}

// Close closes every bridged socket with 1001 (the clients reconnect to
// another node) and waits for the bridges to end.
func (rt *Router) Close() error {
	rt.init()
	rt.mu.Lock()
	rt.closing = true
	list := make([]*bridge, 0, len(rt.bridges))
	for b := range rt.bridges {
		list = append(list, b)
	}
	rt.mu.Unlock()
	for _, b := range list {
		if b.client != nil {
			b.client.Close(websocket.StatusGoingAway, "node shutting down")
		}
	}
	rt.wg.Wait()
	return nil
}

// String names the router in logs.
func (rt *Router) String() string { return fmt.Sprintf("cluster.Router(%s)", rt.Node.ID()) }
