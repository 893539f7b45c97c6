package migrate_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/internal/migrate"
	"github.com/idem-dev/idem/internal/pgxmigrate"
	"github.com/idem-dev/idem/internal/testenv"

	_ "modernc.org/sqlite"
)

// epoch is the runners' clock in these tests.
var epoch = time.Date(2026, 1, 2, 3, 4, 5, 678901000, time.UTC)

// testMigrations create tables a (two statements) and b; {{schema}} is the
// qualifying prefix that the bundle's expand fills in.
var testMigrations = migrate.MustLoad(fstest.MapFS{
	"m/001_create_a.up.sql":   file("CREATE TABLE {{schema}}a (id integer PRIMARY KEY);\nINSERT INTO {{schema}}a VALUES (1);\n"),
	"m/001_create_a.down.sql": file("DROP TABLE {{schema}}a;\n"),
	"m/002_create_b.up.sql":   file("CREATE TABLE {{schema}}b (id integer);\n"),
	"m/002_create_b.down.sql": file("DROP TABLE {{schema}}b;\n"),
}, "m")

// bundle is one database under test.
type bundle struct {
	// open returns a dialect on a connection pool of its own, as another
	// process would have.
	open func(t *testing.T) migrate.Dialect
	// expand fills the {{schema}} placeholder of testMigrations.
	expand func(sql string) string
	// exec runs set-up SQL.
	exec func(t *testing.T, sql string, args ...any)
	// exists reports whether a table exists where the migrations create
	// theirs.
	exists func(t *testing.T, table string) bool
	// legacy are the statements that create the migrations table as the
	// store packages did before this package, with version 1 applied and
	// recorded by the INSERT, at its argument (unix microseconds on migrate.SQLite).
	legacy []string
}

func (b *bundle) runner(t *testing.T, ms []migrate.Migration) *migrate.Runner {
	return &migrate.Runner{Migrations: ms, Dialect: b.open(t), Now: func() time.Time { return epoch }, Expand: b.expand}
}

// forEachDialect runs f on a new migrate.SQLite file, on a new PostgreSQL schema
// named in the config, and on one reached through the search_path.
func forEachDialect(t *testing.T, f func(t *testing.T, b *bundle)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, sqliteBundle(t))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, postgresBundle(t, false))
	})
	t.Run("postgres_search_path", func(t *testing.T) {
		t.Parallel()
		f(t, postgresBundle(t, true))
	})
}

func sqliteBundle(t *testing.T) *bundle {
	path := filepath.Join(t.TempDir(), "test.db")
	open := func(t *testing.T) *sql.DB {
		db, err := sql.Open("sqlite", path+"?_busy_timeout=10000&_journal_mode=WAL")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	db := open(t)
	// Switch the new file to WAL once, before any process races to.
	if _, err := db.ExecContext(t.Context(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	return &bundle{
		open:   func(t *testing.T) migrate.Dialect { return &migrate.SQLite{DB: open(t), Table: "idem_migrations"} },
		expand: func(sql string) string { return strings.ReplaceAll(sql, "{{schema}}", "") },
		exec: func(t *testing.T, sql string, args ...any) {
			t.Helper()
			if _, err := db.ExecContext(t.Context(), sql, args...); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		},
		exists: func(t *testing.T, table string) bool {
			t.Helper()
			var n int
			err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?", table).Scan(&n)
			if err != nil {
				t.Fatal(err)
			}
			return n > 0
		},
		// idemsqlite's table.
		legacy: []string{`CREATE TABLE idem_migrations (
	version    INTEGER NOT NULL,
	name       TEXT    NOT NULL,
	applied_at INTEGER NOT NULL,
	CONSTRAINT idem_migrations_pkey PRIMARY KEY (version)
) STRICT`,
			"INSERT INTO idem_migrations (version, name, applied_at) VALUES (1, 'create_a', ?1)",
			"CREATE TABLE a (id integer PRIMARY KEY)",
		},
	}
}

// postgresBundle returns a bundle on a new schema, dropped when the test
// ends. With searchPath the schema exists, the pools reach it through their
// search_path and the dialect names no schema (as outbox does by default);
// otherwise the dialect names it and creates it (as idempgx does).
func postgresBundle(t *testing.T, searchPath bool) *bundle {
	url := testenv.PostgresURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	schema := "migrate_test_" + hex.EncodeToString(b)
	quoted := pgx.Identifier{schema}.Sanitize()

	newPool := func(t *testing.T) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 2
		if searchPath {
			cfg.ConnConfig.RuntimeParams["search_path"] = schema
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	admin := newPool(t)
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+quoted+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	exec := func(t *testing.T, sql string, args ...any) {
		t.Helper()
		if _, err := admin.Exec(t.Context(), sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	bnd := &bundle{
		exec: exec,
		exists: func(t *testing.T, table string) bool {
			t.Helper()
			var exists bool
			err := admin.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, table}.Sanitize()).Scan(&exists)
			if err != nil {
				t.Fatal(err)
			}
			return exists
		},
	}
	if searchPath {
		exec(t, "CREATE SCHEMA "+quoted)
		bnd.open = func(t *testing.T) migrate.Dialect {
			return &pgxmigrate.Postgres{DB: newPool(t), Table: "idem_outbox_migrations", LockName: "outbox.migrate"}
		}
		bnd.expand = func(sql string) string { return strings.ReplaceAll(sql, "{{schema}}", "") }
		// outbox's table.
		bnd.legacy = []string{
			`CREATE TABLE IF NOT EXISTS ` + quoted + `.idem_outbox_migrations (
    version    integer     NOT NULL CONSTRAINT idem_outbox_migrations_pkey PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL
)`,
			"INSERT INTO " + quoted + ".idem_outbox_migrations (version, name, applied_at) VALUES (1, 'create_a', $1)",
			"CREATE TABLE " + quoted + ".a (id integer PRIMARY KEY)",
		}
		return bnd
	}
	bnd.open = func(t *testing.T) migrate.Dialect {
		return &pgxmigrate.Postgres{DB: newPool(t), Schema: schema, Table: "idem_migrations", LockName: "idempgx.migrate"}
	}
	bnd.expand = func(sql string) string { return strings.ReplaceAll(sql, "{{schema}}", quoted+".") }
	// idempgx's table, in a schema the tests create first.
	bnd.legacy = []string{
		"CREATE SCHEMA " + quoted,
		`CREATE TABLE IF NOT EXISTS ` + quoted + `.idem_migrations (
    version    integer     NOT NULL CONSTRAINT idem_migrations_pkey PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL
)`,
		"INSERT INTO " + quoted + ".idem_migrations (version, name, applied_at) VALUES (1, 'create_a', $1)",
		"CREATE TABLE " + quoted + ".a (id integer PRIMARY KEY)",
	}
	return bnd
}

// wantStatus fails the test unless status is testMigrations with the
// versions in applied applied at epoch.
func wantStatus(t *testing.T, status []migrate.Status, applied ...int) {
	t.Helper()
	if len(status) != len(testMigrations) {
		t.Fatalf("status of %d migrations, want %d: %+v", len(status), len(testMigrations), status)
	}
	for i, s := range status {
		m := testMigrations[i]
		want := migrate.Status{Version: m.Version, Name: m.Name}
		for _, v := range applied {
			if v == m.Version {
				want.Applied, want.AppliedAt = true, epoch
			}
		}
		if s.Version != want.Version || s.Name != want.Name || s.Applied != want.Applied || !s.AppliedAt.Equal(want.AppliedAt) {
			t.Errorf("status %+v, want %+v", s, want)
		}
	}
}

func TestRunner(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, b *bundle) {
		ctx := t.Context()
		r := b.runner(t, testMigrations)
		table := "idem_migrations"
		if p, ok := r.Dialect.(*pgxmigrate.Postgres); ok {
			table = p.Table
		}

		status, err := r.Status(ctx)
		if err != nil {
			t.Fatalf("Status on a new database: %v", err)
		}
		wantStatus(t, status)
		if b.exists(t, table) {
			t.Fatal("Status created the migrations table")
		}

		// Several processes starting at once: each migration is applied
		// once.
		const n = 4
		runners := make([]*migrate.Runner, n)
		for i := range runners {
			runners[i] = b.runner(t, testMigrations)
		}
		done := make([][]migrate.Status, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, r := range runners {
			wg.Go(func() { done[i], errs[i] = r.Up(ctx) })
		}
		wg.Wait()
		var all []migrate.Status
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("Up #%d: %v", i, errs[i])
			}
			all = append(all, done[i]...)
		}
		if len(all) != len(testMigrations) {
			t.Fatalf("%d concurrent Up calls applied %+v, want each of %d migrations once", n, all, len(testMigrations))
		}
		for _, s := range all {
			if !s.Applied || !s.AppliedAt.Equal(epoch) {
				t.Errorf("Up returned %+v, want it applied at %v", s, epoch)
			}
		}
		if !b.exists(t, "a") || !b.exists(t, "b") {
			t.Fatal("Up did not create tables a and b")
		}
		status, err = r.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, status, 1, 2)
		if again, err := r.Up(ctx); err != nil || again != nil {
			t.Fatalf("second Up = %+v, %v; want nil, nil", again, err)
		}

		for _, want := range []struct {
			version int
			table   string
		}{{2, "b"}, {1, "a"}} {
			s, err := r.Down(ctx)
			if err != nil || s == nil || s.Version != want.version || s.Applied || !s.AppliedAt.IsZero() {
				t.Fatalf("Down = %+v, %v; want version %d, not applied", s, err, want.version)
			}
			if b.exists(t, want.table) {
				t.Fatalf("table %s survived Down", want.table)
			}
		}
		if s, err := r.Down(ctx); err != nil || s != nil {
			t.Fatalf("Down with none applied = %+v, %v; want nil, nil", s, err)
		}
		status, err = r.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, status)

		if done, err := r.Up(ctx); err != nil || len(done) != len(testMigrations) {
			t.Fatalf("Up after Down = %+v, %v; want %d migrations", done, err, len(testMigrations))
		}
	})
}

// TestRunnerFailure checks that a migration that fails rolls back the whole
// run, earlier migrations included.
func TestRunnerFailure(t *testing.T) {
	t.Parallel()
	broken := []migrate.Migration{testMigrations[0], {Version: 2, Name: "broken", Up: "CREATE TABLE {{schema}}b (", Down: "SELECT 1"}}
	forEachDialect(t, func(t *testing.T, b *bundle) {
		ctx := t.Context()
		r := b.runner(t, broken)
		done, err := r.Up(ctx)
		if err == nil || !strings.HasPrefix(err.Error(), "migrating up: applying 002_broken: ") || done != nil {
			t.Fatalf("Up = %+v, %v; want an error applying 002_broken", done, err)
		}
		if b.exists(t, "a") {
			t.Error("001_create_a survived the failed run")
		}
		status, err := r.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range status {
			if s.Applied {
				t.Errorf("%+v applied after the failed run", s)
			}
		}

		// A failing down migration leaves its migration applied.
		r.Migrations = []migrate.Migration{{Version: 1, Name: "create_a", Up: testMigrations[0].Up, Down: "DROP TABLE {{schema}}nonexistent;"}}
		if _, err := r.Up(ctx); err != nil {
			t.Fatal(err)
		}
		if s, err := r.Down(ctx); err == nil || !strings.HasPrefix(err.Error(), "migrating down: reverting 001_create_a: ") || s != nil {
			t.Fatalf("Down = %+v, %v; want an error reverting 001_create_a", s, err)
		}
		status, err = r.Status(ctx)
		if err != nil || len(status) != 1 || !status[0].Applied {
			t.Fatalf("Status after the failed Down = %+v, %v; want 001 applied", status, err)
		}
	})
}

// TestRunnerLegacyTable checks that a database migrated by the store
// packages before they shared this package keeps its history.
func TestRunnerLegacyTable(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, b *bundle) {
		ctx := t.Context()
		at := epoch.Add(-time.Hour)
		var arg any = at
		if _, ok := b.open(t).(*migrate.SQLite); ok {
			arg = at.UnixMicro()
		}
		for _, sql := range b.legacy {
			if strings.HasPrefix(sql, "INSERT") {
				b.exec(t, sql, arg)
			} else {
				b.exec(t, sql)
			}
		}

		r := b.runner(t, testMigrations)
		status, err := r.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(status) != 2 || !status[0].Applied || !status[0].AppliedAt.Equal(at) || status[1].Applied {
			t.Fatalf("Status of the legacy table = %+v; want 001 applied at %v, 002 pending", status, at)
		}
		done, err := r.Up(ctx)
		if err != nil || len(done) != 1 || done[0].Version != 2 {
			t.Fatalf("Up = %+v, %v; want 002 alone", done, err)
		}
		if s, err := r.Down(ctx); err != nil || s == nil || s.Version != 2 {
			t.Fatalf("Down = %+v, %v; want 002", s, err)
		}
		if s, err := r.Down(ctx); err != nil || s == nil || s.Version != 1 || b.exists(t, "a") {
			t.Fatalf("Down = %+v, %v; want 001, dropping a", s, err)
		}
	})
}

// TestPostgresNoSchema checks the search_path mode when no schema of the
// search_path exists.
func TestPostgresNoSchema(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["search_path"] = "migrate_test_missing"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r := &migrate.Runner{Migrations: testMigrations, Dialect: &pgxmigrate.Postgres{DB: pool, Table: "idem_outbox_migrations", LockName: "outbox.migrate"}}
	if _, err := r.Up(t.Context()); err == nil || !strings.Contains(err.Error(), "no schema of the search_path exists") {
		t.Fatalf("Up = %v, want an error saying that no schema exists", err)
	}
	status, err := r.Status(t.Context())
	if err != nil || len(status) != 2 || status[0].Applied {
		t.Fatalf("Status = %+v, %v; want nothing applied", status, err)
	}
}

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
