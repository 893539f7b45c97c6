package idem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemredis"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// realStore is a store of every kind the conformance suite covers, on a
// clock the test drives, with a place of its own (a file, a schema, a key
// prefix) removed when the test ends.
type realStore struct {
	name string
	open func(t *testing.T, now func() time.Time) idemstore.Store
}

var realStores = []realStore{
	{"memory", func(t *testing.T, now func() time.Time) idemstore.Store {
		return idemmem.New(&idemmem.Config{Now: now})
	}},
	{"sqlite", func(t *testing.T, now func() time.Time) idemstore.Store {
		return openSQLite(t, filepath.Join(t.TempDir(), "idem.db"), now)
	}},
	{"postgres", func(t *testing.T, now func() time.Time) idemstore.Store {
		return openPostgres(t, newTestSchema(t), now)
	}},
	{"redis", func(t *testing.T, now func() time.Time) idemstore.Store {
		return openRedis(t, now)
	}},
}

// forEachStore runs f as a parallel subtest on each real store.
func forEachStore(t *testing.T, f func(t *testing.T, rs realStore)) {
	for _, rs := range realStores {
		t.Run(rs.name, func(t *testing.T) {
			t.Parallel()
			f(t, rs)
		})
	}
}

func openSQLite(t testing.TB, path string, now func() time.Time) *idemsqlite.Store {
	t.Helper()
	s, err := idemsqlite.Open(path, &idemsqlite.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newTestSchema returns a fresh schema name, dropped when the test ends.
func newTestSchema(t *testing.T) string {
	var b [6]byte
	rand.Read(b[:])
	schema := "idem_core_test_" + hex.EncodeToString(b[:])
	pool := testPool(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return schema
}

// testPool opens a pool on the test PostgreSQL, closed when the test ends.
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := testenv.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func openPostgres(t testing.TB, schema string, now func() time.Time) *idempgx.Store {
	t.Helper()
	s := idempgx.New(testPool(t), &idempgx.Config{Schema: schema, Now: now})
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// openRedis returns a store under a fresh key prefix whose keys are
// deleted when the test ends (unknown records have no TTL).
func openRedis(t testing.TB, now func() time.Time) *idemredis.Store {
	t.Helper()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	var b [6]byte
	rand.Read(b[:])
	prefix := "idemcoretest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		defer client.Close()
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			client.Unlink(ctx, keys...)
		}
		if err := iter.Err(); err != nil {
			t.Errorf("deleting the test's keys: %v", err)
		}
	})
	return idemredis.New(client, &idemredis.Config{Prefix: prefix, Now: now})
}
