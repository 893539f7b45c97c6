package rawio

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

func wrap(c net.Conn) net.Conn {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return c
	}
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return c
	}
	r := &conn{Conn: c}
	r.r.fn, r.r.wait = r.r.read, rc.Read
	r.w.fn, r.w.wait = r.w.write, rc.Write
	return r
}

// conn is a socket whose reads and writes are raw system calls.
type conn struct {
	net.Conn
	r call // reads, one at a time
	w call // writes, one at a time
}

// call is one direction's system call, its arguments and its outcome, kept
// with the connection so that a call allocates nothing (a closure given to
// syscall.RawConn would escape).
type call struct {
	mu    sync.Mutex
	fn    func(fd uintptr) bool             // read or write, bound once
	wait  func(func(fd uintptr) bool) error // the RawConn's Read or Write
	buf   []byte
	n     int
	errno syscall.Errno
}

// read reads once into buf; it reports false, to wait for the socket to
// be readable, on EAGAIN.
func (c *call) read(fd uintptr) bool {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&c.buf[0])), uintptr(len(c.buf)))
	if e == syscall.EAGAIN {
		return false
	}
	if e == syscall.EINTR {
		return c.read(fd)
	}
	c.n, c.errno = int(r), e
	return true
}

// write writes all of buf, counting what is written in n; it reports
// false, to wait for the socket to be writable, on EAGAIN.
func (c *call) write(fd uintptr) bool {
	for c.n < len(c.buf) {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&c.buf[c.n])), uintptr(len(c.buf)-c.n))
		switch e {
		case 0:
			c.n += int(r)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.errno = e
			return true
		}
	}
	return true
}

// do runs the call on b, through the RawConn that waits for the socket to
// be ready, and returns what it did.
func (c *call) do(b []byte) (int, syscall.Errno, error) {
	c.mu.Lock()
	c.buf, c.n, c.errno = b, 0, 0
	err := c.wait(c.fn)
	n, errno := c.n, c.errno
	c.buf = nil
	c.mu.Unlock()
	return n, errno, err
}

func (c *conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return c.Conn.Read(b)
	}
	n, errno, err := c.r.do(b)
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (c *conn) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return c.Conn.Write(b)
	}
	n, errno, err := c.w.do(b)
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// CloseWrite shuts down the writing side of the socket, as
// *net.TCPConn's and *net.UnixConn's do (net/http half-closes a connection
// it is done with).
func (c *conn) CloseWrite() error {
	return c.Conn.(interface{ CloseWrite() error }).CloseWrite()
}

// ReadFrom copies r to the socket as *net.TCPConn's does (sendfile or
// splice when r is a file or a socket, through net's writes), or with
// Write when the socket has none.
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c}, r)
}

// opError is err as net reports a failed read or write. syscall.RawConn
// already wraps its own errors (a deadline, a closed connection) in a
// *net.OpError, of operation "raw-read" or "raw-write".
func (c *conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		e := *oe
		e.Op = op
		return &e
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
