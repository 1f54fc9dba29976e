package mcpclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentry/agentry/chat"
)

// connectTimeout bounds one connection attempt (the handshake and the
// first tools/list).
const connectTimeout = 30 * time.Second

// conn is the node's connection to one server: a loop that connects,
// lists the tools, waits for the session to end and reconnects.
type conn struct {
	c      *Client
	cfg    Server
	client *mcp.Client

	refresh      chan struct{} // a tools/list_changed arrived (capacity 1)
	stopCh       chan struct{}
	stopOnce     sync.Once
	firstAttempt chan struct{} // closed after the first connection attempt
	firstErr     error         // its error; read after firstAttempt is closed

	mu          sync.Mutex
	session     *mcp.ClientSession // nil while disconnected
	tools       []chat.Tool
	names       []string // tools' prefixed names
	pid         int
	lastErr     error
	sessions    int
	nextToken   uint64
	progressFns map[string]func(*mcp.ProgressNotificationParams)
}

func newConn(c *Client, s Server) *conn {
	s.Header = s.Header.Clone()
	s.Args = append([]string(nil), s.Args...)
	s.Env = append([]string(nil), s.Env...)
	cn := &conn{
		c:            c,
		cfg:          s,
		refresh:      make(chan struct{}, 1),
		stopCh:       make(chan struct{}),
		firstAttempt: make(chan struct{}),
		progressFns:  map[string]func(*mcp.ProgressNotificationParams){},
	}
	cn.client = c.newMCPClient(cn)
	return cn
}

func (cn *conn) stop() { cn.stopOnce.Do(func() { close(cn.stopCh) }) }

func (cn *conn) requestRefresh() {
	select {
	case cn.refresh <- struct{}{}:
	default: // a refresh is pending already
	}
}

// run connects and reconnects until stop.
func (cn *conn) run() {
	log := cn.c.log.With("mcp_server", cn.cfg.Name)
	first := true
	backoff := cn.c.opts.MinBackoff
	for {
		sess, err := cn.connect()
		if err == nil {
			err = cn.listTools(sess)
			if err != nil {
				_ = sess.Close()
				cn.detach(sess, err)
			}
		}
		if first {
			cn.firstErr = err
			close(cn.firstAttempt)
			first = false
		}
		if err == nil {
			backoff = cn.c.opts.MinBackoff
			log.Info("mcp: connected", "tools", len(cn.status().Tools))
			err = cn.serve(sess)
			if err == nil {
				return // stopped
			}
			log.Warn("mcp: session ended; reconnecting", "err", err)
		} else {
			log.Warn("mcp: cannot connect", "err", err, "retry_in", backoff)
			cn.mu.Lock()
			cn.lastErr = err
			cn.mu.Unlock()
		}
		select {
		case <-cn.stopCh:
			return
		case <-cn.c.opts.Clock.After(backoff):
		}
		backoff = min(2*backoff, cn.c.opts.MaxBackoff)
	}
}

// serve holds a connected session until it ends (its error) or the
// client stops (nil), refreshing the tools on tools/list_changed.
func (cn *conn) serve(sess *mcp.ClientSession) error {
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	for {
		select {
		case <-cn.refresh:
			if err := cn.listTools(sess); err != nil {
				cn.c.log.Warn("mcp: refresh of the tool list failed", "mcp_server", cn.cfg.Name, "err", err)
			}
		case err := <-done:
			if err == nil {
				err = errors.New("session closed by the server")
			}
			cn.detach(sess, err)
			return err
		case <-cn.stopCh:
			_ = sess.Close()
			<-done
			cn.detach(sess, ErrClosed)
			return nil
		}
	}
}

func (cn *conn) detach(sess *mcp.ClientSession, err error) {
	cn.mu.Lock()
	if cn.session == sess {
		cn.session = nil
		cn.pid = 0
	}
	cn.lastErr = err
	cn.mu.Unlock()
	cn.changed()
}

func (cn *conn) changed() {
	if f := cn.c.opts.OnChange; f != nil {
		f(cn.status())
	}
}

// attemptCtx is the context of one step of a connection (connecting,
// listing tools): it ends after connectTimeout or when the connection is
// stopped, whichever comes first. The caller cancels it.
func (cn *conn) attemptCtx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	go func() {
		select {
		case <-cn.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// connect makes one connection attempt.
func (cn *conn) connect() (*mcp.ClientSession, error) {
	ctx, cancel := cn.attemptCtx()
	defer cancel()
	var t mcp.Transport
	var cmd *exec.Cmd
	if cn.cfg.URL != "" {
		hc := cn.cfg.HTTPClient
		if hc == nil {
			hc = &http.Client{}
		} else {
			c := *hc
			hc = &c
		}
		if len(cn.cfg.Header) > 0 || cn.cfg.BearerToken != "" {
			base := hc.Transport
			if base == nil {
				base = http.DefaultTransport
			}
			h := cn.cfg.Header.Clone()
			if h == nil {
				h = http.Header{}
			}
			if cn.cfg.BearerToken != "" {
				h.Set("Authorization", "Bearer "+cn.cfg.BearerToken)
			}
			hc.Transport = &headerTransport{base: base, header: h}
		}
		t = &mcp.StreamableClientTransport{Endpoint: cn.cfg.URL, HTTPClient: hc, OAuthHandler: cn.cfg.OAuthHandler}
	} else {
		// The process is not tied to ctx: it lives as long as the
		// session, and the session's Close stops it.
		cmd = exec.Command(cn.cfg.Command, cn.cfg.Args...)
		cmd.Dir = cn.cfg.Dir
		if len(cn.cfg.Env) > 0 {
			cmd.Env = append(os.Environ(), cn.cfg.Env...)
		}
		cmd.Stderr = cn.c.opts.Stderr
		setProcAttr(cmd)
		t = &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
	}
	pv := cn.cfg.ProtocolVersion
	if pv == "" {
		pv = DefaultProtocolVersion
	}
	sess, err := cn.client.Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: pv})
	if err != nil {
		if cmd != nil && cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return nil, fmt.Errorf("mcpclient: server %s: connect: %w", cn.cfg.Name, err)
	}
	cn.mu.Lock()
	cn.session = sess
	cn.sessions++
	if cmd != nil && cmd.Process != nil {
		cn.pid = cmd.Process.Pid
	}
	cn.mu.Unlock()
	return sess, nil
}

type headerTransport struct {
	base   http.RoundTripper
	header http.Header
}

func (t *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range t.header {
		req.Header[k] = v
	}
	return t.base.RoundTrip(req)
}

// listTools reads the server's tool list and replaces the chat tools.
func (cn *conn) listTools(sess *mcp.ClientSession) error {
	ctx, cancel := cn.attemptCtx()
	defer cancel()
	var list []*mcp.Tool
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("mcpclient: server %s: tools/list: %w", cn.cfg.Name, err)
		}
		if len(list) == MaxTools {
			cn.c.log.Warn("mcp: server lists too many tools; the rest are left out", "mcp_server", cn.cfg.Name, "limit", MaxTools)
			break
		}
		list = append(list, t)
	}
	tools := make([]chat.Tool, 0, len(list))
	names := make([]string, 0, len(list))
	used := map[string]bool{}
	for _, mt := range list {
		name := toolName(cn.cfg.Name, mt.Name, used)
		used[name] = true
		tl, err := cn.chatTool(name, mt)
		if err != nil {
			cn.c.log.Warn("mcp: tool left out", "mcp_server", cn.cfg.Name, "tool", mt.Name, "err", err)
			continue
		}
		tools = append(tools, tl)
		names = append(names, name)
	}
	cn.mu.Lock()
	cn.tools, cn.names = tools, names
	cn.mu.Unlock()
	cn.changed()
	return nil
}

// toolName returns the chat tool name of an MCP tool: "{server}_{tool}",
// with characters outside [A-Za-z0-9_-] replaced by '_', cut to 64
// characters; a name that was changed or is taken ends with a short hash
// of the original, so that two tools of one server cannot collide.
// Server names contain no '_', so two servers cannot collide.
func toolName(server, tool string, used map[string]bool) string {
	var b strings.Builder
	b.WriteString(server)
	b.WriteByte('_')
	changed := tool == ""
	for _, r := range tool {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
			changed = true
		}
	}
	name := b.String()
	if len(name) <= 64 && !changed && !used[name] {
		return name
	}
	sum := sha256.Sum256([]byte(tool))
	suffix := "_" + hex.EncodeToString(sum[:4])
	if len(name) > 64-len(suffix) {
		name = name[:64-len(suffix)]
	}
	name += suffix
	for i := 2; used[name]; i++ { // a hash collision within one server
		name = name[:len(name)-len(strconv.Itoa(i-1))] + strconv.Itoa(i)
	}
	return name
}

// chatTool wraps one MCP tool.
func (cn *conn) chatTool(name string, mt *mcp.Tool) (chat.Tool, error) {
	schema := []byte(`{"type":"object"}`)
	if mt.InputSchema != nil {
		var err error
		if schema, err = json.Marshal(mt.InputSchema); err != nil {
			return chat.Tool{}, fmt.Errorf("input schema: %w", err)
		}
	}
	mcpName := mt.Name
	tl, err := chat.NewRawTool(name, mt.Description, schema, func(ctx context.Context, input json.RawMessage) (any, error) {
		return cn.call(ctx, mcpName, input)
	})
	if err != nil {
		return chat.Tool{}, err
	}
	switch {
	case mt.Title != "":
		tl.Title = mt.Title
	case mt.Annotations != nil && mt.Annotations.Title != "":
		tl.Title = mt.Annotations.Title
	}
	tl.NeedsApproval = cn.cfg.NeedsApproval
	if f, ok := cn.cfg.ToolApproval[mcpName]; ok {
		tl.NeedsApproval = f
	}
	return tl, nil
}

func (cn *conn) currentTools() []chat.Tool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.tools
}

func (cn *conn) status() ServerStatus {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return ServerStatus{
		Name:      cn.cfg.Name,
		Connected: cn.session != nil,
		Tools:     append([]string(nil), cn.names...),
		PID:       cn.pid,
		LastError: cn.lastErr,
		Sessions:  cn.sessions,
	}
}

// progress routes a notifications/progress to the call that gave its
// token.
func (cn *conn) progress(p *mcp.ProgressNotificationParams) {
	tok, ok := p.ProgressToken.(string)
	if !ok {
		return
	}
	cn.mu.Lock()
	f := cn.progressFns[tok]
	cn.mu.Unlock()
	if f != nil {
		f(p)
	}
}

// ErrNotConnected is wrapped by the error of a call made while its server
// is not connected.
var ErrNotConnected = errors.New("mcpclient: server not connected")

// call runs one tools/call and maps its result (result.go).
func (cn *conn) call(ctx context.Context, tool string, input json.RawMessage) (any, error) {
	cn.mu.Lock()
	sess := cn.session
	lastErr := cn.lastErr
	cn.nextToken++
	token := cn.cfg.Name + "-" + strconv.FormatUint(cn.nextToken, 10)
	cn.mu.Unlock()
	if sess == nil {
		if lastErr != nil {
			return nil, fmt.Errorf("%w: %s (reconnecting; last error: %v)", ErrNotConnected, cn.cfg.Name, lastErr)
		}
		return nil, fmt.Errorf("%w: %s (reconnecting)", ErrNotConnected, cn.cfg.Name)
	}
	timeout := cn.cfg.CallTimeout
	if timeout == 0 {
		timeout = DefaultCallTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	params := &mcp.CallToolParams{Name: tool, Arguments: input}
	if ts, ok := chat.ToolStreamFrom(ctx); ok {
		params.SetProgressToken(token)
		cn.mu.Lock()
		cn.progressFns[token] = func(p *mcp.ProgressNotificationParams) {
			_ = ts.Preliminary(progressOutput(p))
		}
		cn.mu.Unlock()
		defer func() {
			cn.mu.Lock()
			delete(cn.progressFns, token)
			cn.mu.Unlock()
		}()
	}
	res, err := sess.CallTool(ctx, params)
	if err != nil {
		if brokenTransport(err) {
			// The transport is broken (the server went away, or
			// restarted and forgot the session): end the session so
			// that the client reconnects now rather than when the
			// transport gives up.
			_ = sess.Close()
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("mcp tool %s/%s: timed out after %v", cn.cfg.Name, tool, timeout)
		}
		return nil, fmt.Errorf("mcp tool %s/%s: %w", cn.cfg.Name, tool, err)
	}
	return cn.c.mapResult(ctx, res)
}

// codeRejected is the JSON-RPC error code the SDK gives a message its
// transport could not send.
const codeRejected = -32005

// brokenTransport reports whether a call's error says that the session's
// transport is broken, rather than that the server answered with an
// error.
func brokenTransport(err error) bool {
	var we *jsonrpc.Error
	return errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing) ||
		(errors.As(err, &we) && we.Code == codeRejected)
}

// Progress is the preliminary output of an MCP tool call while the server
// reports progress.
type Progress struct {
	Progress float64 `json:"progress"`
	Total    float64 `json:"total,omitempty"`
	Message  string  `json:"message,omitempty"`
}

func progressOutput(p *mcp.ProgressNotificationParams) Progress {
	return Progress{Progress: p.Progress, Total: p.Total, Message: p.Message}
}
