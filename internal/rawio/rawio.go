// Package rawio reads and writes sockets without the runtime's system call
// bookkeeping, for the connections of a process that waits on a network
// store between short bursts of work.
//
// Every read and write of a net.Conn enters the kernel through the
// runtime's entersyscall, which, when every processor was idle, wakes the
// runtime's monitor thread (sysmon) from its deep sleep and resets its
// period to 20 µs: it then polls at that period until the process is idle
// again, a nanosleep and a context switch each time. A proxy in front of
// PostgreSQL goes idle and busy again at every round trip, so the monitor
// never settles: in-process, at 16 concurrent new keys on two processors,
// about 1.3 of the 5 system calls and 1.2 of the 3 context switches per
// key were its (BenchmarkMiddlewarePGNewKeyGroupCommit).
//
// A read or write of a non-blocking socket never blocks (the kernel answers
// EAGAIN instead), so it needs none of that bookkeeping, which exists to
// hand the processor to another thread while a call blocks: Wrap's
// connection issues them as raw system calls, through the socket's
// syscall.RawConn, and parks on the runtime's network poller as net does
// when the socket is not ready. Deadlines, Close and concurrent use behave
// as net's.
package rawio

import (
	"context"
	"net"
)

// Wrap returns c with Read and Write issued as raw system calls, when c is
// a socket of this platform's net package (a *net.TCPConn or
// *net.UnixConn on Linux); otherwise c itself. The connection it returns
// keeps CloseWrite and ReadFrom (sendfile and splice); the socket's other
// methods are not there.
func Wrap(c net.Conn) net.Conn {
	return wrap(c)
}

// Dial returns dial with the connections it makes wrapped by Wrap; a
// failed dial's error is dial's. It fits pgconn.DialFunc.
func Dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return Wrap(c), nil
	}
}
