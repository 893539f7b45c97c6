package cli

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// lazyPair is a lazyConn accepted from a loopback listener and the client's
// end of it.
func lazyPair(t *testing.T) (*lazyConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, err := lazyListener{ln}.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*lazyConn), client
}

func TestLazyConnDeadlines(t *testing.T) {
	buf := make([]byte, 8)
	t.Run("a past deadline fails the next read", func(t *testing.T) {
		c, client := lazyPair(t)
		client.Write([]byte("x"))
		c.SetReadDeadline(time.Now().Add(-time.Second))
		if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read: %v, want the deadline exceeded", err)
		}
	})
	t.Run("the last deadline asked for is the one a read sees", func(t *testing.T) {
		c, client := lazyPair(t)
		client.Write([]byte("x"))
		c.SetReadDeadline(time.Now().Add(-time.Second))
		c.SetReadDeadline(time.Time{})
		if n, err := c.Read(buf); n != 1 || err != nil {
			t.Fatalf("read: %d, %v", n, err)
		}
	})
	t.Run("a deadline ends a read that waits for it", func(t *testing.T) {
		c, _ := lazyPair(t)
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		start := time.Now()
		if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read: %v, want the deadline exceeded", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the read ended after %s", d)
		}
	})
	t.Run("a deadline asked for during a read ends it", func(t *testing.T) {
		// net/http's abortPendingRead.
		c, _ := lazyPair(t)
		done := make(chan error, 1)
		go func() {
			_, err := c.Read(buf)
			done <- err
		}()
		for {
			c.mu.Lock()
			reading := c.reads > 0
			c.mu.Unlock()
			if reading {
				break
			}
			time.Sleep(time.Millisecond)
		}
		c.SetReadDeadline(time.Now().Add(-time.Second))
		select {
		case err := <-done:
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read: %v, want the deadline exceeded", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the read did not end")
		}
	})
	t.Run("a write deadline is set", func(t *testing.T) {
		c, _ := lazyPair(t)
		c.SetWriteDeadline(time.Now().Add(-time.Second))
		if _, err := c.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("write: %v, want the deadline exceeded", err)
		}
		c.SetWriteDeadline(time.Time{})
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatalf("write: %v", err)
		}
	})
}
