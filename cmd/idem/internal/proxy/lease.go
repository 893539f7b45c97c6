package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/deadline"
	"github.com/idem-dev/idem/internal/rawio"
)

// A protected request is sent under its attempt's lease: the proxy never
// writes it to the upstream once the lease is gone (idem.CheckLease), and
// gives the exchange up when the middleware cancels the handler's context
// for a lost lease.
//
// The last check comes as late as it can: the default transport's
// connections are gated (gatedConn), and every write of a request's bytes
// to the connection checks the lease first, after however long the dial
// took, and after a pause of the process anywhere before the write. What
// is left is the time between that check and the bytes leaving the
// process: a pause there, longer than idem.Config.LeaseMargin, lets a stale
// request out, and only an upstream that keeps the idem.HeaderAttempt token
// can refuse it. An HTTP/2 connection carries several requests at once, and
// a Config.Transport is the caller's: there the check comes when the
// transport hands the request its connection (httptrace GotConn), and a
// failure cancels the request before its headers are written.

// errNotSent is the error of a gated write refused before any byte of the
// request was written: the request never left.
var errNotSent = errors.New("proxy: the lease was lost before the request was sent")

// errLeaseGone is the error of a gated write refused after some of the
// request's bytes were written.
var errLeaseGone = errors.New("proxy: the lease was lost while the request was being sent")

// sending is the state of one protected request's exchange. It is the
// upstream request's context: the handler's values (with the trace) and
// the deadline's expiry, which Cancel ends early.
type sending struct {
	context.Context // the handler's context with the trace: values only
	ctx             deadline.Ctx
	lease           context.Context // the handler's context, for idem.CheckLease
	trace           httptrace.ClientTrace
	gated           atomic.Bool // the connection was gated: wrote is exact
	connected       atomic.Bool // the transport handed the request a connection
	wrote           atomic.Bool // a write of the request's bytes passed the gate
	refused         atomic.Bool // the lease check refused the request
	gate            atomic.Pointer[gatedConn]
}

type sendingKey struct{}

// newSending returns the exchange of the protected request whose handler
// context is lease, and the upstream request's context, which expires
// after timeout.
func newSending(lease context.Context, alarms *deadline.Alarms, timeout time.Duration) (*sending, context.Context) {
	s := &sending{lease: lease}
	s.trace.GotConn = s.gotConn
	s.Context = httptrace.WithClientTrace(lease, &s.trace)
	return s, s.ctx.Arm(alarms, s, timeout)
}

// Value implements context.Context: the exchange finds itself.
func (s *sending) Value(key any) any {
	if key == (sendingKey{}) {
		return s
	}
	return s.Context.Value(key)
}

// sendingFrom returns the exchange of an upstream request, nil outside a
// protected request.
func sendingFrom(ctx context.Context) *sending {
	s, _ := ctx.Value(sendingKey{}).(*sending)
	return s
}

// gotConn arms the gate of the request's connection, or, on a connection
// it cannot gate, checks the lease now and cancels the request when it is
// gone.
func (s *sending) gotConn(info httptrace.GotConnInfo) {
	s.connected.Store(true)
	if g := gateOf(info.Conn); g != nil {
		s.gated.Store(true)
		s.gate.Store(g)
		g.arm(s)
		return
	}
	if idem.CheckLease(s.lease) != nil {
		s.refused.Store(true)
		s.ctx.Cancel()
	}
}

// disarm disarms the gate once the exchange is over. (Disarming it when
// the request is written would cost a callback: until the next request
// takes the connection, nothing else writes to it.)
func (s *sending) disarm() {
	if g := s.gate.Load(); g != nil {
		g.disarm(s)
	}
}

// check is the gate's test before each write of the request's bytes.
func (s *sending) check() error {
	if idem.CheckLease(s.lease) != nil {
		s.refused.Store(true)
		if s.wrote.Load() {
			return errLeaseGone
		}
		return errNotSent
	}
	s.wrote.Store(true)
	return nil
}

// leaseLost cancels the exchange when the attempt gives its lease up
// (idem.AfterLeaseLost; the client going away does not: the upstream call
// outlives the client).
func (s *sending) leaseLost() {
	s.refused.Store(true)
	s.ctx.Cancel()
}

// mayHaveSent reports whether bytes of the request may have reached the
// upstream: a write passed the gate, or, on a connection without one, the
// transport handed the request a connection.
func (s *sending) mayHaveSent() bool {
	if s.gated.Load() {
		return s.wrote.Load()
	}
	return s.connected.Load()
}

// gatedConn is a connection of the default transport whose writes check
// the lease of the request being written, from the transport handing the
// request the connection (arm) to the end of the exchange (disarm). An
// HTTP/1 connection writes one request at a time.
type gatedConn struct {
	net.Conn
	mu sync.Mutex
	s  *sending // the request being written; nil between requests
}

func (c *gatedConn) arm(s *sending) {
	c.mu.Lock()
	c.s = s
	c.mu.Unlock()
}

func (c *gatedConn) disarm(s *sending) {
	c.mu.Lock()
	if c.s == s {
		c.s = nil
	}
	c.mu.Unlock()
}

// Write checks the lease of the request being written, then writes.
func (c *gatedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	s := c.s
	c.mu.Unlock()
	if s != nil {
		if err := s.check(); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
}

// gateOf returns the gate of an HTTP/1 connection of the default
// transport, in the clear or under TLS, and nil for an HTTP/2 connection
// (shared by concurrent requests) or one of another transport.
func gateOf(c net.Conn) *gatedConn {
	if tc, ok := c.(*tls.Conn); ok {
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			return nil
		}
		c = tc.NetConn()
	}
	g, _ := c.(*gatedConn)
	return g
}

// gatedDialer wraps dial so that the connections it makes are gated, and
// read and write as raw system calls (rawio, as the server's connections).
func gatedDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &gatedConn{Conn: rawio.Wrap(c)}, nil
	}
}
