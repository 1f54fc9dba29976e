// Package client is a Go client for an Agentry server, or any server that
// speaks the Cloudflare Agents protocol: it connects to an agent instance
// over WebSocket, follows its synced state, calls its callable methods
// (plain and streaming), observes every frame the server sends, and drives
// the chat protocol (see Chat).
//
// By default a Conn is one WebSocket: when the server closes the socket, or
// the network drops it, the Conn ends with a *CloseError and every call in
// flight fails with it. With Options.Reconnect it reconnects like the npm
// clients, with growing delays, and resumes its chat turns in flight from
// the chunks the server stored. Close codes 1008 and 4000–4999 mean the
// server refused the client for good (CloseError's Terminal reports it);
// the npm clients stop retrying on them, and so does a Conn.
//
// The reducer of agent-tool events (the Go twin of useAgentToolEvents) is in
// package client/agenttools.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/wire"
)

// Hop is one sub-agent step of the address of an agent instance, as in the
// sub option of the npm useAgent: the child's class name (kebab-cased on the
// wire) and instance name.
type Hop struct {
	Agent string
	Name  string
}

// Options say which agent instance to connect to and how.
type Options struct {
	// Host is the server's "host:port". Like the npm client, the scheme is
	// ws for hosts that look local ("localhost:…", "127.0.0.1:…", private
	// 10/8, 172.16/12 and 192.168/16 addresses) and wss otherwise; a Host
	// that starts with http://, https://, ws:// or wss:// keeps its scheme.
	Host string
	// BaseURL is used instead of Host when set: an http, https, ws or wss
	// URL whose path, if any, is put before the agent routes.
	BaseURL string
	// Prefix is the first segment of agent routes; "" means "agents".
	Prefix string
	// Agent is the class name, such as "EchoChat"; it is kebab-cased on the
	// wire exactly as the npm client does ("echo-chat").
	Agent string
	// Name is the instance name; "" means "default".
	Name string
	// Sub addresses a sub-agent of the instance, one hop per level. Names
	// are percent-encoded like encodeURIComponent.
	Sub []Hop
	// Query is added to the URL (authentication tokens, typically) and to
	// the HTTP requests of Chat.Messages.
	Query url.Values
	// ID is the connection id sent as _pk; "" means a random UUID.
	ID string
	// Header is sent with the WebSocket upgrade and HTTP requests.
	Header http.Header
	// Token, when set, is sent as an "Authorization: Bearer <Token>"
	// header with the WebSocket upgrade and HTTP requests, replacing any
	// Authorization in Header. It is what `agentry serve --auth-token`
	// (server.RequireToken) asks for. Browsers, which cannot set headers
	// on a WebSocket, send Query{"token": …} instead.
	Token string
	// HTTPClient performs the upgrade and HTTP requests; nil means
	// http.DefaultClient.
	HTTPClient *http.Client
	// MaxFrameBytes limits one frame from the server; zero means 32 MiB.
	MaxFrameBytes int64
	// Chat says the agent is a chat agent: Dial returns only once its
	// transcript is known (the frame an Agentry server sends with the
	// connect frames, else GET …/get-messages, as useAgentChat fetches it),
	// so Chat().Transcript() is ready when Dial returns. Without it, Dial
	// returns after the identity and the transcript arrives a moment
	// later (Chat.SendMessage fetches it if it has not).
	Chat bool
	// Reconnect, when set, makes the Conn reconnect when its socket is
	// lost, and resume its chat turns (see Reconnect). Nil means a Conn
	// ends with its first socket.
	Reconnect *Reconnect

	// OnFrame, when set, is called for every text frame the server sends,
	// starting with the identity frame, after the Conn has applied it
	// (so State reflects a state frame). It runs on the Conn's reading
	// goroutine: it must not block, and must not wait on the Conn.
	OnFrame func(Frame)
	// OnState, when set, is called with every state the server sends
	// (cf_agent_state), on the reading goroutine, after State reflects it.
	OnState func(state json.RawMessage)
	// OnStateError, when set, is called with the error of every
	// cf_agent_state_error frame (a state update the server rejected).
	OnStateError func(msg string)
}

// Identity is what the server said the connection reached
// (cf_agent_identity): the kebab-cased class and the instance name.
type Identity struct {
	Agent string
	Name  string
}

// Frame is one text frame from the server: its type ("" when it is not a
// JSON object with a string type) and its raw bytes.
type Frame struct {
	Type string
	Data json.RawMessage
}

// Conn is a connection to one agent instance: one WebSocket, or, with
// Options.Reconnect, a series of them. Its methods are safe for concurrent
// use.
type Conn struct {
	opts     Options
	id       string
	wsURL    string // full URL of the socket, query included
	httpBase string // http(s) URL of the instance, without query
	query    url.Values

	ctx    context.Context // the connection's life; canceled by Close
	cancel context.CancelFunc
	loops  sync.WaitGroup // reading goroutines and the reconnect loop
	done   chan struct{}

	mu       sync.Mutex
	sock     *socket       // the current socket; nil while reconnecting
	up       chan struct{} // closed when sock is set; replaced when it is lost
	identity Identity
	state    json.RawMessage
	err      error
	calls    map[string]*call
	subs     map[*Subscription]struct{}
	closing  bool

	chat *Chat
}

// socket is one WebSocket of a Conn and what its connect frames said.
type socket struct {
	ws        *websocket.Conn
	ready     chan struct{} // closed once identity (and state) arrived
	readDone  chan struct{} // closed when its reading goroutine returns
	identSeen bool          // under Conn.mu
	readyDone bool          // under Conn.mu
	ended     bool          // under Conn.mu: its reading goroutine is done reading
	err       error         // why it ended; set before readDone closes
}

// Dial connects to the agent instance that opts address and returns once
// the server identified it (cf_agent_identity, and the state frame when the
// identity says one follows) and, with Options.Chat, the chat transcript is
// known: the one the server sends on connect, or, when none has arrived by
// then, the one GET …/get-messages answers (an agent without a chat answers
// with an error and counts as an empty chat, as for useAgentChat).
//
// A refused upgrade is reported as an *HTTPError with the response's
// status; a socket the server closes before identifying it as a
// *CloseError. Dial does not retry; with Options.Reconnect, a Conn that
// was established reconnects when its socket is lost.
func Dial(ctx context.Context, opts Options) (*Conn, error) {
	if opts.Agent == "" {
		return nil, errors.New("client: dial: Options.Agent is required")
	}
	if opts.ID == "" {
		opts.ID = uuid.NewString()
	}
	wsURL, httpBase, err := instanceURLs(opts)
	if err != nil {
		return nil, fmt.Errorf("client: dial: %w", err)
	}
	if opts.Token != "" {
		h := opts.Header.Clone()
		if h == nil {
			h = http.Header{}
		}
		h.Set("Authorization", "Bearer "+opts.Token)
		opts.Header = h
	}
	if r := opts.Reconnect; r != nil {
		rc := r.withDefaults()
		opts.Reconnect = &rc
	}
	q := url.Values{"_pk": {opts.ID}}
	for k, vs := range opts.Query {
		if k != "_pk" {
			q[k] = vs
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	c := &Conn{
		opts:     opts,
		id:       opts.ID,
		wsURL:    wsURL + "?" + q.Encode(),
		httpBase: httpBase,
		query:    opts.Query,
		ctx:      rctx,
		cancel:   cancel,
		up:       make(chan struct{}),
		done:     make(chan struct{}),
		calls:    map[string]*call{},
		subs:     map[*Subscription]struct{}{},
	}
	c.chat = newChat(c)
	if err := c.connect(ctx); err != nil {
		c.fail(err)
		c.Close()
		return nil, fmt.Errorf("client: dial %s: %w", wsURL, err)
	}
	return c, nil
}

// connect opens a socket, reads its connect frames and makes it the
// current one once the instance is identified and the transcript known.
// Its errors are not wrapped.
func (c *Conn) connect(ctx context.Context) error {
	ws, resp, err := websocket.Dial(ctx, c.wsURL, &websocket.DialOptions{
		HTTPClient: c.opts.HTTPClient,
		HTTPHeader: c.opts.Header,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			he := &HTTPError{StatusCode: resp.StatusCode, Status: resp.Status}
			if resp.Body != nil {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				he.Body = strings.TrimSpace(string(b))
			}
			return he
		}
		return err
	}
	limit := c.opts.MaxFrameBytes
	if limit == 0 {
		limit = 32 << 20
	}
	ws.SetReadLimit(limit)
	sk := &socket{ws: ws, ready: make(chan struct{}), readDone: make(chan struct{})}
	c.chat.beginSocket()
	c.loops.Add(1)
	go c.readLoop(sk)
	abandon := func(err error) error {
		ws.CloseNow()
		<-sk.readDone
		return err
	}
	select {
	case <-sk.ready:
	case <-sk.readDone:
		return sk.err
	case <-c.ctx.Done():
		return abandon(ErrClosed)
	case <-ctx.Done():
		return abandon(fmt.Errorf("waiting for identity: %w", ctx.Err()))
	}
	if err := c.chat.awaitTranscript(ctx, sk.readDone, c.opts.Chat); err != nil {
		select {
		case <-sk.readDone:
			return sk.err
		default:
		}
		return abandon(err)
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return abandon(ErrClosed)
	}
	if sk.ended {
		// Lost before it became current: its reading goroutine saw no
		// current socket to replace, so this attempt failed.
		c.mu.Unlock()
		<-sk.readDone
		return sk.err
	}
	c.sock = sk
	close(c.up)
	c.mu.Unlock()
	return nil
}

// instanceURLs returns the WebSocket URL of the instance opts address
// (without query) and its http(s) twin.
func instanceURLs(opts Options) (wsURL, httpURL string, err error) {
	base := opts.BaseURL
	if base == "" {
		if opts.Host == "" {
			return "", "", errors.New("Options.Host or Options.BaseURL is required")
		}
		base = opts.Host
		if !strings.Contains(base, "://") {
			scheme := "wss"
			if isLocalHost(base) {
				scheme = "ws"
			}
			base = scheme + "://" + base
		}
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", "", fmt.Errorf("bad base URL %q: %w", base, err)
	}
	var wsScheme, httpScheme string
	switch u.Scheme {
	case "ws", "http":
		wsScheme, httpScheme = "ws", "http"
	case "wss", "https":
		wsScheme, httpScheme = "wss", "https"
	default:
		return "", "", fmt.Errorf("bad base URL %q: scheme must be http, https, ws or wss", base)
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "agents"
	}
	name := opts.Name
	if name == "" {
		name = "default"
	}
	var p strings.Builder
	p.WriteString(strings.TrimSuffix(u.EscapedPath(), "/"))
	p.WriteString("/" + prefix + "/" + agent.Kebab(opts.Agent) + "/" + EncodeURIComponent(name))
	for _, h := range opts.Sub {
		if h.Agent == "" || h.Name == "" {
			return "", "", fmt.Errorf("sub-agent hop %+v needs an agent and a name", h)
		}
		p.WriteString("/sub/" + agent.Kebab(h.Agent) + "/" + EncodeURIComponent(h.Name))
	}
	hostPath := u.Host + p.String()
	return wsScheme + "://" + hostPath, httpScheme + "://" + hostPath, nil
}

// isLocalHost applies the npm client's rule for plain-text WebSockets.
func isLocalHost(host string) bool {
	for _, p := range []string{"localhost:", "127.0.0.1:", "192.168.", "10.", "[::ffff:7f00:1]:"} {
		if strings.HasPrefix(host, p) {
			return true
		}
	}
	for i := 16; i <= 31; i++ {
		if strings.HasPrefix(host, fmt.Sprintf("172.%d.", i)) {
			return true
		}
	}
	return false
}

// EncodeURIComponent percent-encodes s as JavaScript's encodeURIComponent
// does: everything but letters, digits and -_.!~*'() is escaped. The npm
// client encodes sub-agent names this way.
func EncodeURIComponent(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9',
			strings.IndexByte("-_.!~*'()", ch) >= 0:
			b.WriteByte(ch)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[ch>>4])
			b.WriteByte(hex[ch&15])
		}
	}
	return b.String()
}

// ID returns the connection id sent as _pk.
func (c *Conn) ID() string { return c.id }

// Identity returns the class and name the server identified.
func (c *Conn) Identity() Identity {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.identity
}

// State returns the agent's state as last sent by the server or set with
// SetState, or nil when the agent has none.
func (c *Conn) State() json.RawMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// DecodeState decodes the current state into v.
func (c *Conn) DecodeState(v any) error {
	s := c.State()
	if s == nil {
		return errors.New("client: the agent has no state")
	}
	if err := json.Unmarshal(s, v); err != nil {
		return fmt.Errorf("client: decode state: %w", err)
	}
	return nil
}

// SetState sends v as the agent's new state (cf_agent_state). Like the npm
// client it applies the state locally at once; the server persists it and
// broadcasts it to the other connections, or answers with a
// cf_agent_state_error (see Options.OnStateError), and the local state is
// not rolled back.
func (c *Conn) SetState(ctx context.Context, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("client: set state: %w", err)
	}
	c.mu.Lock()
	c.state = raw
	c.mu.Unlock()
	if err := c.Send(ctx, struct {
		State json.RawMessage `json:"state"`
		Type  string          `json:"type"`
	}{raw, wire.State}); err != nil {
		return fmt.Errorf("client: set state: %w", err)
	}
	return nil
}

// Send sends v, encoded as JSON, as one text frame.
func (c *Conn) Send(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("client: encode frame: %w", err)
	}
	return c.SendRaw(ctx, b)
}

// SendRaw sends data as one text frame. While a Conn with
// Options.Reconnect is reconnecting, it waits (within ctx) for the new
// socket.
func (c *Conn) SendRaw(ctx context.Context, data []byte) error {
	sk, err := c.socketFor(ctx)
	if err != nil {
		return err
	}
	return c.writeOn(ctx, sk, data)
}

// socketFor returns the current socket, waiting within ctx while the Conn
// reconnects.
func (c *Conn) socketFor(ctx context.Context) (*socket, error) {
	for {
		c.mu.Lock()
		sk, up, err := c.sock, c.up, c.err
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if sk != nil {
			return sk, nil
		}
		select {
		case <-up:
		case <-c.done:
			return nil, c.Err()
		case <-ctx.Done():
			return nil, fmt.Errorf("client: send: waiting for the connection: %w", ctx.Err())
		}
	}
}

// writeOn sends data as one text frame on sk.
func (c *Conn) writeOn(ctx context.Context, sk *socket, data []byte) error {
	if err := sk.ws.Write(ctx, websocket.MessageText, data); err != nil {
		select {
		case <-c.done:
			return c.Err()
		default:
		}
		return fmt.Errorf("client: send: %w", err)
	}
	return nil
}

// sendOn sends v on the socket sk only, so that what a socket's connect
// frames ask for is never sent on the next one.
func (c *Conn) sendOn(ctx context.Context, sk *socket, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("client: encode frame: %w", err)
	}
	return c.writeOn(ctx, sk, b)
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended: a *CloseError when the server
// closed it or it was lost (and, with Options.Reconnect, the server refused
// it for good or the retries ran out), ErrClosed after Close, or nil while
// it is open or reconnecting.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Connected reports whether the Conn has a socket now (false while it
// reconnects, and after it ended).
func (c *Conn) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sock != nil && c.err == nil
}

// Close closes the connection (status 1000) and waits for its goroutines.
// Calls in flight fail with ErrClosed, subscriptions end at once, a
// reconnect in progress stops. Close is idempotent.
func (c *Conn) Close() error {
	c.mu.Lock()
	first := !c.closing
	c.closing = true
	sk := c.sock
	c.mu.Unlock()
	if first {
		c.fail(ErrClosed)
		if sk != nil {
			// Close performs the closing handshake; the reading goroutine
			// reads the server's answer. CloseNow is the fallback.
			if err := sk.ws.Close(websocket.StatusNormalClosure, ""); err != nil {
				sk.ws.CloseNow()
			}
		}
		c.cancel()
	}
	c.loops.Wait()
	c.mu.Lock()
	subs := make([]*Subscription, 0, len(c.subs))
	for s := range c.subs {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
	return nil
}

// readLoop reads and dispatches the frames of sk until it ends, then
// reconnects or ends the Conn.
func (c *Conn) readLoop(sk *socket) {
	defer c.loops.Done()
	var err error
	for {
		var typ websocket.MessageType
		var data []byte
		typ, data, err = sk.ws.Read(c.ctx)
		if err != nil {
			break
		}
		if typ != websocket.MessageText {
			continue
		}
		c.dispatch(sk, data)
	}
	err = closeErrorOf(err)
	sk.err = err
	c.mu.Lock()
	sk.ended = true
	current := c.sock == sk
	if current {
		c.sock = nil
		c.up = make(chan struct{})
	}
	closing := c.closing
	c.mu.Unlock()
	close(sk.readDone)
	if !current {
		return // a socket that never became current: connect reports it
	}
	var ce *CloseError
	if closing || c.opts.Reconnect == nil || (errors.As(err, &ce) && ce.Terminal()) {
		c.fail(err)
		return
	}
	c.lost(err)
	c.loops.Add(1)
	go c.reconnect(err)
}

func (c *Conn) dispatch(sk *socket, data []byte) {
	var h head
	if typ, ok := leadingType(data); ok && !headDecoded(typ) {
		h.Type = typ
	} else if json.Unmarshal(data, &h) != nil {
		h = head{}
	}
	ready := false
	switch h.Type {
	case wire.Identity:
		c.mu.Lock()
		c.identity = Identity{Agent: h.Agent, Name: h.Name}
		sk.identSeen = true
		ready = !h.StateFollows
		c.mu.Unlock()
	case wire.State:
		c.mu.Lock()
		c.state = h.State
		ready = sk.identSeen
		c.mu.Unlock()
		if c.opts.OnState != nil {
			c.opts.OnState(h.State)
		}
	case wire.StateError:
		if c.opts.OnStateError != nil {
			var msg string
			_ = json.Unmarshal(h.Error, &msg)
			c.opts.OnStateError(msg)
		}
	case wire.RPC:
		c.handleRPC(data)
	default:
		c.chat.handleFrame(sk, h.Type, data)
	}
	f := Frame{Type: h.Type, Data: data}
	if c.opts.OnFrame != nil {
		c.opts.OnFrame(f)
	}
	c.mu.Lock()
	subs := make([]*Subscription, 0, len(c.subs))
	for s := range c.subs {
		subs = append(subs, s)
	}
	if ready && !sk.readyDone {
		// Dial returns only after OnFrame has seen the identity (and
		// state) frames.
		sk.readyDone = true
		close(sk.ready)
	}
	c.mu.Unlock()
	for _, s := range subs {
		s.push(f)
	}
}

// lost handles the loss of the current socket of a Conn that reconnects:
// the calls in flight fail with err (the server may or may not have run
// them); chat streams wait for the next socket.
func (c *Conn) lost(err error) {
	c.mu.Lock()
	calls := c.calls
	c.calls = map[string]*call{}
	c.mu.Unlock()
	for _, cl := range calls {
		cl.finish(nil, err)
	}
	if f := c.opts.Reconnect.OnDisconnect; f != nil {
		f(err)
	}
}

// reconnect opens new sockets, with growing delays between attempts,
// until one is up, the server refuses the client for good, the retries run
// out or the Conn is closed. Then the chat picks up its turns in flight.
func (c *Conn) reconnect(cause error) {
	defer c.loops.Done()
	r := c.opts.Reconnect
	last := cause
	for attempt := 0; r.MaxRetries == 0 || attempt < r.MaxRetries; attempt++ {
		if !r.wait(c.ctx, r.delay(attempt)) {
			return
		}
		actx, cancel := context.WithTimeout(c.ctx, r.ConnectTimeout)
		err := c.connect(actx)
		cancel()
		if err == nil {
			if r.OnReconnect != nil {
				r.OnReconnect()
			}
			c.chat.resumeAll(c.ctx)
			return
		}
		if c.ctx.Err() != nil {
			return
		}
		last = err
		var ce *CloseError
		var he *HTTPError
		if (errors.As(err, &ce) && ce.Terminal()) || (errors.As(err, &he) && he.StatusCode/100 == 4 && he.StatusCode != http.StatusTooManyRequests) {
			break // refused: retrying cannot help
		}
	}
	c.fail(last)
}

// fail ends the connection with err (the first error wins): calls in
// flight, chat streams and subscriptions are told.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.done)
	calls := c.calls
	c.calls = map[string]*call{}
	subs := make([]*Subscription, 0, len(c.subs))
	for s := range c.subs {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	for _, cl := range calls {
		cl.finish(nil, err)
	}
	c.chat.fail(err)
	for _, s := range subs {
		s.end()
	}
}

// CloseError is how a connection ended when the server closed it or it was
// lost: the WebSocket close code and reason (1006 for a connection that
// dropped without a close frame).
type CloseError struct {
	Code   int
	Reason string
}

// Error describes the close.
func (e *CloseError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("client: connection closed with code %d", e.Code)
	}
	return fmt.Sprintf("client: connection closed with code %d: %s", e.Code, e.Reason)
}

// Terminal reports whether the code tells the client not to come back:
// 1008 (policy violation) or 4000–4999, the codes on which the npm clients
// stop reconnecting.
func (e *CloseError) Terminal() bool {
	return e.Code == 1008 || (e.Code >= 4000 && e.Code <= 4999)
}

// HTTPError is an HTTP request (or WebSocket upgrade) the server answered
// with a non-success status.
type HTTPError struct {
	StatusCode int
	Status     string
	// Body is the start of the response body.
	Body string
}

// Error describes the response.
func (e *HTTPError) Error() string {
	if e.Body == "" {
		return "client: server answered " + e.Status
	}
	return "client: server answered " + e.Status + ": " + e.Body
}

// ErrClosed is the error of a connection closed with Close.
var ErrClosed = errors.New("client: connection closed")

func closeErrorOf(err error) error {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return &CloseError{Code: int(ce.Code), Reason: ce.Reason}
	}
	return &CloseError{Code: int(websocket.StatusAbnormalClosure), Reason: err.Error()}
}

func cloneValues(v url.Values) url.Values {
	out := make(url.Values, len(v))
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}
