package idemclient_test

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// faultProxy is a TCP proxy on loopback that loses responses: on the
// connections drop picks, it forwards the request to the server, waits until
// the server starts answering (so the server has done the work) and then
// cuts the client's connection before a byte of the answer reaches it.
type faultProxy struct {
	ln     net.Listener
	target string
	drop   func(n int64) bool // n counts connections from 1

	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	accepted atomic.Int64
	dropped  atomic.Int64 // responses the server sent and the client never got
}

func newFaultProxy(t *testing.T, target string, drop func(n int64) bool) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, drop: drop, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's base URL.
func (p *faultProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *faultProxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.handle(client, p.drop(p.accepted.Add(1)))
	}
}

func (p *faultProxy) handle(client net.Conn, drop bool) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		return
	}
	defer p.untrack(client, server)

	upstreamDone := make(chan struct{})
	go func() {
		defer close(upstreamDone)
		io.Copy(server, client)
		// The client is done sending: pass the half-close on, so an idle
		// server connection ends too.
		server.(*net.TCPConn).CloseWrite()
	}()
	if drop {
		var b [1]byte
		if n, _ := server.Read(b[:]); n > 0 {
			p.dropped.Add(1)
		}
	} else {
		io.Copy(client, server)
	}
	client.Close()
	server.Close()
	<-upstreamDone
}

// track registers a connection pair for close; it reports false, having
// closed them, when the proxy is already closed.
func (p *faultProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *faultProxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		delete(p.conns, c)
	}
}

func (p *faultProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
