package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/testenv"

	_ "github.com/go-sql-driver/mysql"
	_ "modernc.org/sqlite"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// epoch is where every test clock starts.
var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// bundle is what every store test gets: a migrated store of one dialect, its
// clock, and helpers that enqueue in a real transaction.
type bundle struct {
	name  string
	store Store
	clock *idemtest.Clock
	ctx   context.Context
	// enqueue runs Enqueue for each message in one transaction and commits
	// (or rolls back when commit is false).
	enqueue func(t *testing.T, commit bool, ms ...Message) ([]int64, error)
	// exec runs a statement outside the store.
	exec func(sql string, args ...any) error
	// migrator is the store's migrations API.
	migrator migrator
	// newStore returns another store on the same database (another relay's
	// view), with its own connections where the dialect allows.
	newStore func(t *testing.T) Store
}

type migrator interface {
	Migrate(ctx context.Context) ([]Migration, error)
	MigrateDown(ctx context.Context) (*Migration, error)
	MigrationStatus(ctx context.Context) ([]Migration, error)
}

// forEachStore runs f against a fresh SQLite file, a fresh PostgreSQL
// schema and a fresh MySQL database, in parallel.
func forEachStore(t *testing.T, f func(t *testing.T, b *bundle)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, setupSQLite(t))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, setupPostgres(t))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		f(t, setupMySQL(t))
	})
}

// newMySQLDB creates a database on the test MySQL server
// (IDEM_TEST_MYSQL_URL), dropped when the test ends, and returns a pool
// on it that scans times as UTC (parseTime, loc=UTC) and nothing more.
func newMySQLDB(t testing.TB) func(t testing.TB) *sql.DB {
	t.Helper()
	base := testenv.MySQLURL(t)
	admin, err := sql.Open("mysql", testenv.MySQLDSN(t, base, ""))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	name := "outbox_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		admin.Close()
		t.Fatalf("creating database: %v", err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	dsn := testenv.MySQLDSN(t, base, name)
	if strings.Contains(dsn, "?") {
		dsn += "&parseTime=true&loc=UTC"
	} else {
		dsn += "?parseTime=true&loc=UTC"
	}
	return func(t testing.TB) *sql.DB {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(8)
		t.Cleanup(func() { db.Close() })
		return db
	}
}

func setupMySQL(t *testing.T) *bundle {
	t.Helper()
	open := newMySQLDB(t)
	db := open(t)
	clock := idemtest.NewClock(epoch)
	s := NewMySQL(db, &Config{Now: clock.Now})
	ctx := context.Background()
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return &bundle{
		name:     "mysql",
		store:    s,
		clock:    clock,
		ctx:      ctx,
		migrator: s,
		enqueue: func(t *testing.T, commit bool, ms ...Message) ([]int64, error) {
			t.Helper()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var ids []int64
			for _, m := range ms {
				id, err := s.Enqueue(ctx, tx, m)
				if err != nil {
					return nil, err
				}
				ids = append(ids, id)
			}
			if commit {
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			return ids, nil
		},
		exec: func(q string, args ...any) error {
			_, err := db.ExecContext(ctx, q, args...)
			return err
		},
		newStore: func(t *testing.T) Store {
			return NewMySQL(open(t), &Config{Now: clock.Now})
		},
	}
}

// openSQLite opens path as idemsqlite.Open would: WAL, a busy timeout and
// IMMEDIATE transactions.
func openSQLite(t testing.TB, path string) *sql.DB {
	t.Helper()
	q := url.Values{}
	q.Set("_busy_timeout", "10000")
	q.Set("_journal_mode", "WAL")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func setupSQLite(t *testing.T) *bundle {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outbox.db")
	db := openSQLite(t, path)
	clock := idemtest.NewClock(epoch)
	s := NewSQLite(db, &Config{Now: clock.Now})
	ctx := context.Background()
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return &bundle{
		name:     "sqlite",
		store:    s,
		clock:    clock,
		ctx:      ctx,
		migrator: s,
		enqueue: func(t *testing.T, commit bool, ms ...Message) ([]int64, error) {
			t.Helper()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var ids []int64
			for _, m := range ms {
				id, err := s.Enqueue(ctx, tx, m)
				if err != nil {
					return nil, err
				}
				ids = append(ids, id)
			}
			if commit {
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			return ids, nil
		},
		exec: func(q string, args ...any) error {
			_, err := db.ExecContext(ctx, q, args...)
			return err
		},
		newStore: func(t *testing.T) Store {
			return NewSQLite(openSQLite(t, path), &Config{Now: clock.Now})
		},
	}
}

// newPgxPool returns a pool whose search_path is a new schema, dropped when
// the test ends.
func newPgxPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	raw := testenv.PostgresURL(t)
	ctx := context.Background()
	b := make([]byte, 6)
	rand.Read(b)
	schema := "outbox_test_" + hex.EncodeToString(b)

	admin, err := pgx.Connect(ctx, raw)
	if err != nil {
		t.Fatalf("connecting to %s: %v", raw, err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close(ctx)
		t.Fatalf("creating schema: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
		admin.Close(ctx)
	})
	return pool
}

func setupPostgres(t *testing.T) *bundle {
	t.Helper()
	pool := newPgxPool(t)
	clock := idemtest.NewClock(epoch)
	s := NewPgx(pool, &Config{Now: clock.Now})
	ctx := context.Background()
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return &bundle{
		name:     "postgres",
		store:    s,
		clock:    clock,
		ctx:      ctx,
		migrator: s,
		enqueue: func(t *testing.T, commit bool, ms ...Message) ([]int64, error) {
			t.Helper()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			var ids []int64
			for _, m := range ms {
				id, err := s.Enqueue(ctx, tx, m)
				if err != nil {
					return nil, err
				}
				ids = append(ids, id)
			}
			if commit {
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			return ids, nil
		},
		exec: func(q string, args ...any) error {
			_, err := pool.Exec(ctx, q, args...)
			return err
		},
		newStore: func(t *testing.T) Store {
			return NewPgx(pool, &Config{Now: clock.Now})
		},
	}
}

// message returns a valid message with key k.
func message(k string) Message {
	return Message{Topic: "provider.charge", Payload: []byte(`{"amount_cents":1250}`), IdempotencyKey: k}
}

// mustEnqueue enqueues and commits m.
func (b *bundle) mustEnqueue(t *testing.T, m Message) int64 {
	t.Helper()
	return b.mustEnqueueAll(t, m)[0]
}

// mustEnqueueAll enqueues ms in one transaction and commits.
func (b *bundle) mustEnqueueAll(t *testing.T, ms ...Message) []int64 {
	t.Helper()
	ids, err := b.enqueue(t, true, ms...)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return ids
}

// messages returns n valid messages with distinct keys.
func messages(n int) []Message {
	ms := make([]Message, n)
	for i := range ms {
		ms[i] = message(fmt.Sprint("k-", i))
	}
	return ms
}

// get reads a message and fails the test on error.
func (b *bundle) get(t *testing.T, id int64) *Message {
	t.Helper()
	m, err := b.store.MessageGet(b.ctx, id)
	if err != nil {
		t.Fatalf("MessageGet(%d): %v", id, err)
	}
	return m
}

// claim claims with the bundle's clock and a one-minute claim.
func (b *bundle) claim(t *testing.T, limit int) []*Message {
	t.Helper()
	now := b.clock.Now()
	msgs, err := b.store.MessageClaim(b.ctx, &ClaimParams{Limit: limit, Now: now, ClaimedUntil: now.Add(time.Minute)})
	if err != nil {
		t.Fatalf("MessageClaim: %v", err)
	}
	return msgs
}
