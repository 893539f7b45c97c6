package idempgx

import (
	"errors"
	"maps"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-dev/idem/idemstore"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newUnmigratedStore(t, nil)

	status, err := s.MigrationStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(status) != len(migrations) || status[0].Applied || status[0].Version != 1 || status[0].Name != "create_keys" {
		t.Fatalf("status before migrating: %+v", status)
	}

	// Several processes starting at once: each migration is applied once.
	const n = 8
	applied := make([][]Migration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { applied[i], errs[i] = s.Migrate(ctx) })
	}
	wg.Wait()
	total := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Migrate #%d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	if total != len(migrations) {
		t.Fatalf("%d concurrent Migrate calls applied %d migrations, want %d", n, total, len(migrations))
	}

	status, err = s.MigrationStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range status {
		if !m.Applied || m.AppliedAt.IsZero() {
			t.Fatalf("after Migrate: %+v not applied", m)
		}
	}
	if _, err := s.KeyGet(ctx, testID); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("KeyGet on the migrated schema: %v, want not found", err)
	}

	for i := len(migrations); i > 0; i-- {
		m, err := s.MigrateDown(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m == nil || m.Version != i {
			t.Fatalf("MigrateDown reverted %+v, want version %d", m, i)
		}
	}
	if m, err := s.MigrateDown(ctx); err != nil || m != nil {
		t.Fatalf("MigrateDown with nothing applied = %+v, %v; want nil, nil", m, err)
	}
	var table *string
	if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1)::text", s.schema+".idem_keys").Scan(&table); err != nil {
		t.Fatal(err)
	}
	if table != nil {
		t.Fatalf("idem_keys still exists after migrating down")
	}
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after down: %v", err)
	}
}

// TestEmbeddedSQL checks that every statement and migration is present and
// has its placeholders filled.
func TestEmbeddedSQL(t *testing.T) {
	t.Parallel()
	loadQueries(`"s"`, "c") // panics when a statement is missing
	if len(statements) != 22 {
		t.Errorf("queries.sql has %d statements, want 22", len(statements))
	}
	if len(migrations) == 0 {
		t.Fatal("no embedded migrations")
	}
	stmts := maps.Clone(statements)
	for _, m := range migrations {
		stmts[m.String()+".up"], stmts[m.String()+".down"] = m.Up, m.Down
	}
	unqualified := regexp.MustCompile(`(?:^|[^.\w'])idem_(?:keys|migrations)\b`)
	for name, sql := range stmts {
		sql = expandPartitions(expand(sql, `"s"`, "c"), `"s"`, 4)
		var code strings.Builder
		for line := range strings.Lines(sql) {
			if !strings.HasPrefix(strings.TrimSpace(line), "--") {
				code.WriteString(line)
			}
		}
		if strings.Contains(sql, "{{") {
			t.Errorf("%s: placeholders left:\n%s", name, sql)
		}
		if unqualified.MatchString(code.String()) {
			t.Errorf("%s: a table without the schema:\n%s", name, sql)
		}
		if strings.Contains(strings.ToLower(code.String()), "now()") {
			t.Errorf("%s reads the server's clock", name)
		}
	}
}

// TestChecksRefuseBadRecords: the checks of the key table (domains and a
// table constraint) refuse a record no statement writes.
func TestChecksRefuseBadRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.reserve(t, reserveParams("t1", idemstore.StateUnknown))
	for _, set := range []string{
		"state = 'done'",
		"lease_expired_state = 'completed'",
		"response_status = 200",
		"state = 'completed'",
		"state = 'completed', response_status = 42",
		"attempts = 0",
		"reconcile_attempts = -1",
		"reconcile_error = repeat('x', 257)",
		"ttl = interval '-1 second'",
	} {
		_, err := b.store.pool.Exec(b.ctx, "UPDATE "+b.store.schema+".idem_keys SET "+set)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Errorf("SET %s: %v, want a check violation", set, err)
		}
	}
}
