package testenv

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a server: Cut drops those open (a lost
// network: no close frame), SetRefuse makes it drop new ones at once, and
// SetDrop makes it drop the client-to-server bytes (a request lost on the
// way).
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  []net.Conn
	refuse bool
	drop   bool // client-to-server bytes are dropped (a request lost on the way)
	wg     sync.WaitGroup
	// Dropped receives the size of each read it dropped.
	Dropped chan int
}

// StartProxy starts a proxy to target (host:port) on 127.0.0.1 and closes
// it with t.Cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, Dropped: make(chan int, 64)}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refuse {
			p.mu.Unlock()
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn, droppable bool) {
			defer dst.Close()
			defer src.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					p.mu.Lock()
					drop := droppable && p.drop
					p.mu.Unlock()
					if drop {
						select {
						case p.Dropped <- n:
						default:
						}
					} else if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}
		p.wg.Go(func() { pipe(out, in, true) })
		p.wg.Go(func() { pipe(in, out, false) })
	}
}

// Cut drops every open connection.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// SetDrop sets whether client-to-server bytes are dropped.
func (p *Proxy) SetDrop(v bool) {
	p.mu.Lock()
	p.drop = v
	p.mu.Unlock()
}

// SetRefuse sets whether new connections are closed at once.
func (p *Proxy) SetRefuse(v bool) {
	p.mu.Lock()
	p.refuse = v
	p.mu.Unlock()
}

func (p *Proxy) close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
