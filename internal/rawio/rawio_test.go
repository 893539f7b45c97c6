package rawio_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/rawio"
)

// pair returns a connected pair of sockets of network ("tcp" or "unix"),
// the first wrapped.
func pair(t *testing.T, network string) (wrapped, peer net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer = <-accepted
	if peer == nil {
		t.FailNow()
	}
	wrapped = rawio.Wrap(c)
	t.Cleanup(func() { wrapped.Close(); peer.Close() })
	return wrapped, peer
}

func forEachNetwork(t *testing.T, f func(t *testing.T, network string)) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			t.Parallel()
			f(t, network)
		})
	}
}

func TestWrapWrapsSocketsOnly(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if rawio.Wrap(a) != a {
		t.Error("Wrap changed a net.Pipe")
	}
	c, _ := pair(t, "tcp")
	if _, ok := c.(*net.TCPConn); ok && runtime.GOOS == "linux" {
		t.Error("Wrap left a TCP connection as it was")
	}
}

// TestRoundTrip sends more than a socket's buffers hold each way at once,
// so that writes wait for the peer to read (EAGAIN) and reads for it to
// write.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	forEachNetwork(t, func(t *testing.T, network string) {
		c, peer := pair(t, network)
		out := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // echo
			defer wg.Done()
			if _, err := io.CopyN(peer, peer, int64(len(out))); err != nil {
				t.Errorf("echo: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			if n, err := c.Write(out); n != len(out) || err != nil {
				t.Errorf("Write: %d, %v; want %d, nil", n, err, len(out))
			}
		}()
		in := make([]byte, len(out))
		if _, err := io.ReadFull(c, in); err != nil {
			t.Fatalf("ReadFull: %v", err)
		}
		wg.Wait()
		if !bytes.Equal(in, out) {
			t.Error("read back other bytes than written")
		}
	})
}

func TestEOF(t *testing.T) {
	t.Parallel()
	forEachNetwork(t, func(t *testing.T, network string) {
		c, peer := pair(t, network)
		peer.Write([]byte("last"))
		peer.Close()
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "last" {
			t.Errorf("ReadAll: %q, %v; want \"last\", nil", got, err)
		}
		if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Errorf("Read after EOF: %d, %v; want 0, io.EOF", n, err)
		}
	})
}

func TestReadDeadline(t *testing.T) {
	t.Parallel()
	forEachNetwork(t, func(t *testing.T, network string) {
		c, peer := pair(t, network)
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := c.Read(make([]byte, 8))
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Read past the deadline: %v; want a timeout", err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "read" {
			t.Errorf("Read past the deadline: %#v; want a *net.OpError of op read", err)
		}
		c.SetReadDeadline(time.Time{})
		peer.Write([]byte("x"))
		if n, err := c.Read(make([]byte, 8)); n != 1 || err != nil {
			t.Errorf("Read after the deadline is lifted: %d, %v", n, err)
		}
	})
}

func TestWriteDeadline(t *testing.T) {
	t.Parallel()
	forEachNetwork(t, func(t *testing.T, network string) {
		c, _ := pair(t, network) // the peer never reads
		// Long enough that the write starts before it under any load (a
		// deadline already passed fails the Write with 0 bytes, which is
		// right but not what this tests: at 50 ms it happened in a loaded
		// run); the socket's buffers fill in microseconds, and the Write
		// then waits for the deadline.
		c.SetWriteDeadline(time.Now().Add(time.Second))
		n, err := c.Write(make([]byte, 64<<20))
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write past the deadline: %d, %v; want a timeout", n, err)
		}
		if n == 0 || n >= 64<<20 {
			t.Errorf("Write past the deadline wrote %d bytes; want some, not all", n)
		}
	})
}

func TestCloseWhileReading(t *testing.T) {
	t.Parallel()
	forEachNetwork(t, func(t *testing.T, network string) {
		c, _ := pair(t, network)
		done := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 8))
			done <- err
		}()
		time.Sleep(10 * time.Millisecond) // let the read park; it returns either way
		c.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Read when closed: %v; want net.ErrClosed", err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Write when closed: %v; want net.ErrClosed", err)
		}
	})
}

// TestConcurrentUse reads and writes from several goroutines at once, for
// the race detector.
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	forEachNetwork(t, func(t *testing.T, network string) {
		c, peer := pair(t, network)
		const writers, each = 4, 1000
		go io.Copy(peer, peer)
		var wg sync.WaitGroup
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					if _, err := c.Write([]byte("abcd")); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		var mu sync.Mutex
		total := 0
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 64)
				for {
					mu.Lock()
					if total == writers*each*4 {
						mu.Unlock()
						return
					}
					mu.Unlock()
					c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
					n, err := c.Read(buf)
					mu.Lock()
					total += n
					mu.Unlock()
					if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	})
}

func TestNoAllocations(t *testing.T) {
	c, peer := pair(t, "tcp")
	buf := make([]byte, 8)
	allocs := testing.AllocsPerRun(100, func() {
		c.Write(buf)
		io.ReadFull(peer, buf)
		peer.Write(buf)
		io.ReadFull(c, buf)
	})
	if allocs != 0 {
		t.Errorf("a write and a read on each side: %v allocations; want 0", allocs)
	}
}

func TestCloseWrite(t *testing.T) {
	t.Parallel()
	forEachNetwork(t, func(t *testing.T, network string) {
		c, peer := pair(t, network)
		cw, ok := c.(interface{ CloseWrite() error })
		if !ok {
			t.Fatal("no CloseWrite")
		}
		c.Write([]byte("bye"))
		if err := cw.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if got, err := io.ReadAll(peer); err != nil || string(got) != "bye" {
			t.Errorf("the peer read %q, %v; want \"bye\" and EOF", got, err)
		}
		peer.Write([]byte("still open"))
		if n, err := c.Read(make([]byte, 16)); n != 10 || err != nil {
			t.Errorf("Read after CloseWrite: %d, %v", n, err)
		}
	})
}

func TestReadFrom(t *testing.T) {
	t.Parallel()
	forEachNetwork(t, func(t *testing.T, network string) {
		c, peer := pair(t, network)
		rf, ok := c.(io.ReaderFrom)
		if !ok {
			t.Fatal("no ReadFrom")
		}
		f := filepath.Join(t.TempDir(), "f")
		data := bytes.Repeat([]byte("x"), 100_000)
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
		file, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		done := make(chan []byte)
		go func() {
			got, _ := io.ReadAll(io.LimitReader(peer, int64(len(data))))
			done <- got
		}()
		if n, err := rf.ReadFrom(file); n != int64(len(data)) || err != nil {
			t.Errorf("ReadFrom: %d, %v", n, err)
		}
		if got := <-done; !bytes.Equal(got, data) {
			t.Errorf("the peer read %d bytes, other than sent", len(got))
		}
	})
}
