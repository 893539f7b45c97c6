package payments

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/cmd/idem/internal/provider"
)

// legacyAt is when the legacy runner of the tests applied 001.
var legacyAt = time.Date(2029, 5, 6, 7, 8, 9, 0, time.UTC)

// migrateLegacy migrates store as the payments service did before it used
// internal/migrate: its own payments_migrations table, created with the
// statements of that release, and 001 applied at legacyAt.
func migrateLegacy(t *testing.T, store string) {
	t.Helper()
	ctx := t.Context()
	if path, ok := strings.CutPrefix(store, "sqlite:"); ok {
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for _, stmt := range []string{
			`CREATE TABLE IF NOT EXISTS payments_migrations (
		version    INTEGER NOT NULL CONSTRAINT payments_migrations_pkey PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at INTEGER NOT NULL
	) STRICT`,
			sqliteMigrations[0].Up,
		} {
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("legacy migration: %v", err)
			}
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO payments_migrations (version, name, applied_at) VALUES (?, ?, ?)",
			1, "create_payments", legacyAt.UnixMicro()); err != nil {
			t.Fatal(err)
		}
		return
	}
	u, err := url.Parse(store)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	schema := pgx.Identifier{q.Get("schema")}.Sanitize() + "."
	q.Del("schema")
	u.RawQuery = q.Encode()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, stmt := range []string{
		// The idem store created the schema before.
		"CREATE SCHEMA " + strings.TrimSuffix(schema, "."),
		`CREATE TABLE IF NOT EXISTS ` + schema + `payments_migrations (
		version    integer     NOT NULL,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL,
		CONSTRAINT payments_migrations_pkey PRIMARY KEY (version)
	)`,
		strings.ReplaceAll(postgresMigrations[0].Up, "{{schema}}", schema),
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("legacy migration: %v", err)
		}
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+schema+"payments_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
		1, "create_payments", legacyAt); err != nil {
		t.Fatal(err)
	}
}

// TestMigrationsLegacyTable checks that a database migrated by the
// payments service's own runner, before internal/migrate, keeps its
// history: New does not apply 001 again, and the service works.
func TestMigrationsLegacyTable(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		if strings.HasPrefix(store, "mysql:") {
			t.Skip("no release migrated the payments table on MySQL before internal/migrate")
		}
		migrateLegacy(t, store)
		b := setup(t, store, provider.Faults{}, nil)
		status, err := b.svc.db.repo.migrator(b.clock.Now).Status(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		// 001 keeps its legacy date; 002 and 003 are applied now.
		if len(status) != 3 || status[0].Version != 1 || status[0].Name != "create_payments" ||
			!status[0].Applied || !status[0].AppliedAt.Equal(legacyAt) ||
			status[1].Name != "create_settings" || !status[1].Applied ||
			status[2].Name != "ledger_reconciliation" || !status[2].Applied {
			t.Fatalf("Status = %+v; want 001_create_payments applied at %v, then 002_create_settings and 003_ledger_reconciliation", status, legacyAt)
		}
		if n := b.count(t, "payments_migrations"); n != 3 {
			t.Errorf("%d rows in payments_migrations, want 3", n)
		}
		p := b.mustCreate(t, "legacy-1", 1200)
		if got := b.status(t, p.ID); got.ID != p.ID || got.Status != StatusPending {
			t.Errorf("GET: %+v", got)
		}
	})
}

// schemaObjects returns the names of the tables, indexes and sequences of
// the service's database whose name starts with payments, sorted.
func schemaObjects(t *testing.T, d *database) []string {
	t.Helper()
	ctx := t.Context()
	var names []string
	switch r := d.repo.(type) {
	case *sqliteRepo:
		rows, err := r.db.QueryContext(ctx, "SELECT name FROM sqlite_schema WHERE name LIKE 'payments%'")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	case *pgxRepo:
		rows, err := r.pool.Query(ctx, `SELECT c.relname FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname LIKE 'payments%'`, r.schemaName)
		if err != nil {
			t.Fatal(err)
		}
		if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
	case *mysqlRepo:
		// Tables and their indexes (MySQL names every primary key PRIMARY).
		rows, err := r.db.QueryContext(ctx, `SELECT table_name FROM information_schema.tables
			WHERE table_schema = DATABASE() AND table_name LIKE 'payments%'
			UNION SELECT DISTINCT index_name FROM information_schema.statistics
			WHERE table_schema = DATABASE() AND table_name LIKE 'payments%' AND index_name <> 'PRIMARY'`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(names)
	return names
}

// TestMigrationsDown checks that the down migrations drop everything the
// up migrations create, and that the payments table migrates up again.
func TestMigrationsDown(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	now := func() time.Time { return at }
	for _, kind := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			store := "sqlite:" + filepath.Join(t.TempDir(), "payments.db")
			switch kind {
			case "postgres":
				store = postgresStore(t)
			case "mysql":
				store = mysqlStore(t)
			}
			d, err := openDatabase(t.Context(), store, now)
			if err != nil {
				t.Fatal(err)
			}
			defer d.close()
			r := d.repo.migrator(now)
			migrated := schemaObjects(t, d)
			for _, want := range []string{"payments", "payments_migrations", "payments_tenant_seq_idx", "payments_unsettled_idx", "payments_settings",
				"payments_ledger_watermark", "payments_ledger_discrepancies", "payments_ledger_discrepancies_found_idx"} {
				if !slices.Contains(migrated, want) {
					t.Fatalf("after New, the database has %q, want %s among them", migrated, want)
				}
			}

			s, err := r.Down(t.Context())
			if err != nil || s == nil || s.Version != 3 || s.Applied {
				t.Fatalf("Down = %+v, %v; want 003 reverted", s, err)
			}
			if left := schemaObjects(t, d); slices.Contains(left, "payments_ledger_watermark") || slices.Contains(left, "payments_ledger_discrepancies") ||
				!slices.Contains(left, "payments_settings") {
				t.Errorf("after reverting 003, the database has %q", left)
			}
			s, err = r.Down(t.Context())
			if err != nil || s == nil || s.Version != 2 || s.Applied {
				t.Fatalf("Down = %+v, %v; want 002 reverted", s, err)
			}
			if left := schemaObjects(t, d); slices.Contains(left, "payments_settings") || !slices.Contains(left, "payments") {
				t.Errorf("after reverting 002, the database has %q", left)
			}
			s, err = r.Down(t.Context())
			if err != nil || s == nil || s.Version != 1 || s.Applied {
				t.Fatalf("Down = %+v, %v; want 001 reverted", s, err)
			}
			want := []string{"payments_migrations", "payments_migrations_pkey"}
			if kind != "postgres" {
				// SQLite's primary key is the rowid, MySQL's is named
				// PRIMARY: no index of its own here.
				want = []string{"payments_migrations"}
			}
			if left := schemaObjects(t, d); !slices.Equal(left, want) {
				t.Errorf("after Down, the database has %q, want %q", left, want)
			}
			if s, err := r.Down(t.Context()); err != nil || s != nil {
				t.Fatalf("Down with none applied = %+v, %v; want nil, nil", s, err)
			}

			done, err := r.Up(t.Context())
			if err != nil || len(done) != 3 || done[0].Version != 1 || done[1].Version != 2 || done[2].Version != 3 || !done[0].AppliedAt.Equal(at) {
				t.Fatalf("Up after Down = %+v, %v; want 001, 002 and 003 applied at %v", done, err, at)
			}
			if again := schemaObjects(t, d); !slices.Equal(again, migrated) {
				t.Errorf("after Up again, the database has %q, want %q as after New", again, migrated)
			}
		})
	}
}
