package idemredis

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// TestReserveRetriedByTheClient: go-redis sends a command again when its
// connection breaks before the reply (MaxRetries), so a reservation whose
// reply was lost runs twice, and the second run finds the record the first
// one wrote, with the attempt's own token. The attempt holds the key: the
// store must say so, not answer that the key is in use by another (the
// chaos campaign found the middleware answering 409 key-in-use to such an
// attempt, leaving a lease nobody ran that turned unknown).
func TestReserveRetriedByTheClient(t *testing.T) {
	t.Parallel()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	key := "retried-" + time.Now().Format("150405.000000000")
	cut := &replyCutter{trigger: []byte(key)}
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cutConn{Conn: c, cut: cut}, nil
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	s := newTestStore(t, client, time.Now)

	p := reserveParams("the-attempt", idemstore.StateUnknown)
	p.Key = key
	res, err := s.KeyReserve(t.Context(), p)
	if !cut.done() {
		t.Fatal("the reservation's reply was never cut: the test proves nothing")
	}
	if err != nil {
		t.Fatalf("KeyReserve after a lost reply: %v", err)
	}
	if !res.Reserved || res.Record.Token != "the-attempt" || res.Record.State != idemstore.StateInProgress {
		t.Fatalf("KeyReserve after a lost reply: Reserved %v, state %s, token %q; want this attempt's reservation",
			res.Reserved, res.Record.State, res.Record.Token)
	}
	// A reservation by another attempt is still refused.
	other := reserveParams("another-attempt", idemstore.StateUnknown)
	other.Key = key
	if res, err := s.KeyReserve(t.Context(), other); err != nil || res.Reserved {
		t.Fatalf("another attempt's reservation: %+v, %v; want the key in use", res, err)
	}
}

// replyCutter breaks the first connection that writes a command holding
// trigger, once the server's reply to it has arrived, and drops the reply:
// the command ran, and the client saw its connection end.
type replyCutter struct {
	trigger []byte
	mu      sync.Mutex
	armed   *cutConn // the connection that sent it
	cut     bool
}

func (r *replyCutter) done() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cut
}

type cutConn struct {
	net.Conn
	cut *replyCutter
}

func (c *cutConn) Write(b []byte) (int, error) {
	c.cut.mu.Lock()
	if !c.cut.cut && c.cut.armed == nil && bytes.Contains(b, c.cut.trigger) {
		c.cut.armed = c
	}
	c.cut.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *cutConn) Read(b []byte) (int, error) {
	c.cut.mu.Lock()
	armed := c.cut.armed == c && !c.cut.cut
	if armed {
		c.cut.cut = true
	}
	c.cut.mu.Unlock()
	if !armed {
		return c.Conn.Read(b)
	}
	// Wait for the reply (the command ran), drop it, break the connection.
	if _, err := c.Conn.Read(make([]byte, 64<<10)); err != nil {
		return 0, err
	}
	c.Conn.Close()
	return 0, io.EOF
}
