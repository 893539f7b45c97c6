package idempgx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/internal/rawio"
	"github.com/idem-dev/idem/internal/testenv"
)

// The tests share one pool; every store gets its own schema.
var (
	poolMu sync.Mutex
	pool   *pgxpool.Pool
)

func TestMain(m *testing.M) {
	code := m.Run()
	poolMu.Lock()
	if pool != nil {
		pool.Close()
	}
	poolMu.Unlock()
	os.Exit(code)
}

// testPool returns the shared pool, opening it on first use.
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := testenv.PostgresURL(t)
	poolMu.Lock()
	defer poolMu.Unlock()
	if pool != nil {
		return pool
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	cfg.MaxConns = 10
	// Read and written as raw system calls, as idem proxy's pools are (see
	// cmd/idem's storeurl): the tests and benchmarks on the shared pool and
	// the middleware benchmarks run over them; the direct-path tests' own
	// pools over net's.
	cfg.ConnConfig.DialFunc = rawio.Dial(cfg.ConnConfig.DialFunc)
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	pool = p
	return pool
}

// newSchemaName returns a random schema name for one test.
func newSchemaName() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "idempgx_test_" + hex.EncodeToString(b)
}

// newTestStore returns a migrated store in a schema of its own, dropped when
// the test ends.
func newTestStore(t testing.TB, now func() time.Time) *Store {
	t.Helper()
	s := newUnmigratedStore(t, now)
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// newUnmigratedStore returns a store on a schema that does not exist yet,
// dropped (if created) when the test ends.
func newUnmigratedStore(t testing.TB, now func() time.Time) *Store {
	t.Helper()
	p := testPool(t)
	schema := newSchemaName()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return New(p, &Config{Schema: schema, Now: now})
}
