package cli

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/idem-dev/idem/internal/rawio"
)

// lazyListener gives net/http connections whose read deadline reaches the
// connection only when it matters: at the next read, or at once when a
// read is in flight (see lazyConn), and which read and write as raw system
// calls (rawio: each read and write would otherwise wake the runtime's
// monitor thread whenever the server was idle a moment).
type lazyListener struct{ net.Listener }

func (l lazyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lazyConn{Conn: rawio.Wrap(c)}, nil
}

// lazyConn keeps the read deadline asked for until the connection is read:
// net/http sets and lifts it several times per request (idle, header,
// whole request, its background read) and the middleware once more around
// the body, which a small request has mostly delivered already in the
// buffer of the first read; every change that reaches the connection is a
// lock and a runtime timer added, moved or removed, and adding one may wake
// the network poller. Deferred, the deadline a read sees is the last one
// asked for, as it would have been (a deadline is an instant: a past one
// fails the read at once either way), and one asked for while a read is in
// flight is set at once, as net/http's abortPendingRead needs. A write
// deadline is set as asked unless the connection has it already.
type lazyConn struct {
	net.Conn
	mu      sync.Mutex
	reads   int       // reads in flight
	want    time.Time // the read deadline asked for last
	read    time.Time // the read deadline the connection has
	written time.Time // the write deadline the connection has
}

func (c *lazyConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if !c.want.Equal(c.read) {
		if err := c.Conn.SetReadDeadline(c.want); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		c.read = c.want
	}
	c.reads++
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.reads--
	c.mu.Unlock()
	return n, err
}

func (c *lazyConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.want = t
	if c.reads == 0 || t.Equal(c.read) {
		return nil
	}
	if err := c.Conn.SetReadDeadline(t); err != nil {
		return err
	}
	c.read = t
	return nil
}

func (c *lazyConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.Equal(c.written) {
		return nil
	}
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	c.written = t
	return nil
}

func (c *lazyConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// ReadFrom and CloseWrite keep what net/http finds on a *net.TCPConn
// (sendfile, a half close).

func (c *lazyConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

func (c *lazyConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
