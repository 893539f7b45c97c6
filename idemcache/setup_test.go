package idemcache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	// The dead-Redis tests make go-redis log every failed dial.
	redis.SetLogger(quietRedisLog{})
	code := m.Run()
	closeBenchPool()
	if code == 0 {
		// go-redis probes a dead server from a goroutine that notices the
		// client's Close only after its one-second sleep.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

type quietRedisLog struct{}

func (quietRedisLog) Printf(context.Context, string, ...any) {}

const (
	fp1 = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0"
	fp2 = "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a"
)

var testID = idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "key-1"}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func sampleResponse() *idemstore.Response {
	return &idemstore.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_1"}},
		Body:   []byte(`{"id":"pay_1","amount":1000}`),
	}
}

// countingMem is an idemmem store that counts KeyReserve calls; it is a
// Waiter like idemmem.
type countingMem struct {
	*idemmem.Store
	reserves atomic.Int64
}

func newCountingMem(now func() time.Time) *countingMem {
	return &countingMem{Store: idemmem.New(&idemmem.Config{Now: now})}
}

func (c *countingMem) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	c.reserves.Add(1)
	return c.Store.KeyReserve(ctx, p)
}

// countingSQLite is an idemsqlite store that counts KeyReserve calls; it is
// a TxStore like idemsqlite.
type countingSQLite struct {
	*idemsqlite.Store
	reserves atomic.Int64
}

func (c *countingSQLite) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	c.reserves.Add(1)
	return c.Store.KeyReserve(ctx, p)
}

// openSQLite opens a file store in the test's temporary directory.
func openSQLite(t testing.TB, now func() time.Time) *idemsqlite.Store {
	t.Helper()
	s, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), &idemsqlite.Config{Now: now})
	if err != nil {
		t.Fatalf("idemsqlite.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the sqlite store: %v", err)
		}
	})
	return s
}

// redisClient returns a client of the test Redis, closed at the end of the
// test.
func redisClient(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	return client
}

// randomPrefix returns a Redis key prefix no other test uses.
func randomPrefix() string {
	var b [6]byte
	rand.Read(b[:])
	return "idemcache-test:" + hex.EncodeToString(b[:]) + ":"
}

// newRedisCache returns a Redis cache under a random prefix whose keys are
// deleted at the end of the test.
func newRedisCache(t testing.TB, client redis.UniversalClient) *Redis {
	t.Helper()
	c := NewRedis(client, randomPrefix())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := deleteKeys(ctx, client, c.prefix); err != nil {
			t.Errorf("deleting the test keys: %v", err)
		}
	})
	return c
}

// deleteKeys deletes every key under prefix (which has no glob characters).
func deleteKeys(ctx context.Context, client redis.UniversalClient, prefix string) error {
	iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	return client.Del(ctx, keys...).Err()
}

// closedAddr returns a local address nothing listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// deadOptions are client options for a Redis that is not there or will be
// killed: no command retries and one dial attempt (go-redis's default of five
// with 100 ms between them would make every call use the cache's whole
// Timeout).
func deadOptions(addr string) *redis.Options {
	return &redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, DialerRetries: 1}
}

// deadRedisClient returns a client of a Redis that is not there.
func deadRedisClient(t testing.TB) *redis.Client {
	t.Helper()
	client := redis.NewClient(deadOptions(closedAddr(t)))
	t.Cleanup(func() { client.Close() })
	return client
}
