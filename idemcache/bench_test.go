package idemcache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// The benchmarks replay one completed key through the real middleware, with
// the store being idempgx alone, idempgx behind the LRU, and idempgx behind
// the Redis cache. GOMAXPROCS×benchParallelism goroutines replay at once,
// like idempgx's own benchmarks.

const benchParallelism = 4

var (
	benchPoolMu sync.Mutex
	benchPool   *pgxpool.Pool
)

// pgPool returns the benchmarks' shared pool, opening it on first use.
func pgPool(b testing.TB) *pgxpool.Pool {
	b.Helper()
	url := testenv.PostgresURL(b)
	benchPoolMu.Lock()
	defer benchPoolMu.Unlock()
	if benchPool != nil {
		return benchPool
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatalf("parsing %s: %v", url, err)
	}
	cfg.MaxConns = 10
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatalf("connecting: %v", err)
	}
	benchPool = p
	return p
}

func closeBenchPool() {
	benchPoolMu.Lock()
	defer benchPoolMu.Unlock()
	if benchPool != nil {
		benchPool.Close()
		benchPool = nil
	}
}

// newPgStore returns a migrated idempgx store in a schema of its own,
// dropped at the end.
func newPgStore(b testing.TB) *idempgx.Store {
	b.Helper()
	p := pgPool(b)
	var r [6]byte
	rand.Read(r[:])
	schema := "idemcache_bench_" + hex.EncodeToString(r[:])
	s := idempgx.New(p, &idempgx.Config{Schema: schema})
	b.Cleanup(func() {
		s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			b.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	if _, err := s.Migrate(context.Background()); err != nil {
		b.Fatalf("Migrate: %v", err)
	}
	return s
}

// benchStores are the stores the benchmarks compare.
var benchStores = []struct {
	name string
	wrap func(b *testing.B, s *idempgx.Store) idemstore.Store
}{
	{"Postgres", func(_ *testing.B, s *idempgx.Store) idemstore.Store { return s }},
	{"PostgresLRU", func(_ *testing.B, s *idempgx.Store) idemstore.Store {
		return New(s, NewLRU(10000, 0), nil)
	}},
	{"PostgresRedis", func(b *testing.B, s *idempgx.Store) idemstore.Store {
		client := redisClient(b)
		return New(s, newRedisCache(b, client), nil)
	}},
}

// BenchmarkMiddlewareReplay replays one completed key.
func BenchmarkMiddlewareReplay(b *testing.B) {
	for _, bc := range benchStores {
		b.Run(bc.name, func(b *testing.B) {
			benchReplay(b, bc.wrap(b, newPgStore(b)))
		})
	}
}

// BenchmarkMiddlewareNewKey runs new keys: what the cache adds to the write
// path (a lookup that misses).
func BenchmarkMiddlewareNewKey(b *testing.B) {
	for _, bc := range benchStores {
		b.Run(bc.name, func(b *testing.B) {
			var runs atomic.Int32
			mw := idem.New(bc.wrap(b, newPgStore(b)), &idem.Config{GuardConfig: idem.GuardConfig{Logger: discardLogger()}})(paymentHandler(&runs))
			var n atomic.Int64
			b.SetParallelism(benchParallelism)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1000}`))
					req.Header.Set(idem.HeaderKey, fmt.Sprintf("key-%d", n.Add(1)))
					req.Header.Set("Content-Type", "application/json")
					w := httptest.NewRecorder()
					mw.ServeHTTP(w, req)
					if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "" {
						b.Errorf("new key: %d %q", w.Code, w.Header().Get(idem.HeaderReplayed))
						return
					}
				}
			})
		})
	}
}

// benchReplay completes one key through the middleware on store, then
// replays it in parallel.
func benchReplay(b *testing.B, store idemstore.Store) {
	var runs atomic.Int32
	mw := idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Logger: discardLogger()}})(paymentHandler(&runs))
	const body = `{"amount":1000,"currency":"eur"}`
	do := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
		req.Header.Set(idem.HeaderKey, "bench-key")
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		mw.ServeHTTP(w, req)
		return w
	}
	if w := do(); w.Code != http.StatusCreated {
		b.Fatalf("first request: %d %s", w.Code, w.Body)
	}
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w := do()
			if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "true" {
				b.Errorf("replay: %d %q", w.Code, w.Header().Get(idem.HeaderReplayed))
				return
			}
		}
	})
	b.StopTimer()
	if n := runs.Load(); n != 1 {
		b.Fatalf("handler ran %d times, want 1", n)
	}
}
