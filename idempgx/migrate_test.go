package idempgx

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
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

// TestChecksRefuseBadRecords: the checks of the key table (domains and the
// table's idem_keys_response_check, a call of idem_response_ok) refuse a
// record no statement writes, on one table and on a partitioned one, and
// let through every record the rule allows.
func TestChecksRefuseBadRecords(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{0, 4} {
		t.Run(fmt.Sprintf("partitions=%d", parts), func(t *testing.T) {
			t.Parallel()
			clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
			s := newTestStore(t, clock.Now)
			if parts > 0 {
				s = newPartitionedStore(t, clock.Now, parts)
			}
			b := &bundle{store: s, clock: clock, ctx: t.Context()}
			// Every copy of the check (the table's and each partition's) is
			// validated and holds want.
			checkDefs := func(want string) {
				t.Helper()
				rows, err := s.pool.Query(b.ctx, `SELECT c.convalidated, pg_get_constraintdef(c.oid)
FROM pg_constraint AS c JOIN pg_class AS r ON r.oid = c.conrelid
WHERE c.conname = 'idem_keys_response_check' AND r.relnamespace = $1::regnamespace`, s.cfg.Schema)
				if err != nil {
					t.Fatal(err)
				}
				defs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
					Valid bool
					Def   string
				}])
				if err != nil {
					t.Fatal(err)
				}
				if len(defs) != parts+1 {
					t.Fatalf("%d copies of idem_keys_response_check, want %d", len(defs), parts+1)
				}
				for _, d := range defs {
					if !d.Valid || !strings.Contains(d.Def, want) {
						t.Errorf("idem_keys_response_check: validated %t, %s; want %s", d.Valid, d.Def, want)
					}
				}
			}
			// A completed record, then the check migrated down and up
			// again over it: 006 validates the records it finds.
			done := reserveParams("t0", idemstore.StateUnknown)
			done.Identity.Key = "done"
			b.reserve(t, done)
			if err := s.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: done.Identity, Token: "t0", Response: sampleResponse()}); err != nil {
				t.Fatal(err)
			}
			b.reserve(t, reserveParams("t1", idemstore.StateUnknown))
			checkDefs("idem_response_ok(")
			if m, err := s.MigrateDown(b.ctx); err != nil || m == nil || m.Name != "response_check_function" {
				t.Fatalf("MigrateDown = %+v, %v; want 006", m, err)
			}
			checkDefs("CASE")
			if done, err := s.Migrate(b.ctx); err != nil || len(done) != 1 {
				t.Fatalf("Migrate = %+v, %v; want 006 applied", done, err)
			}
			checkDefs("idem_response_ok(")
			// The function is granted to every role (a role that writes the
			// table runs it), not left to the default privileges.
			var granted bool
			if err := s.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_proc AS p, aclexplode(p.proacl) AS a
WHERE p.proname = 'idem_response_ok' AND p.pronamespace = $1::regnamespace
  AND a.grantee = 0 AND a.privilege_type = 'EXECUTE')`, s.cfg.Schema).Scan(&granted); err != nil || !granted {
				t.Errorf("EXECUTE on idem_response_ok granted to PUBLIC: %t, %v", granted, err)
			}
			table := s.schema + ".idem_keys"
			insert := "INSERT INTO " + table + ` (scope, endpoint, key, fingerprint, state, token, locked_until,
    started_at, lease_expired_state, created_at, updated_at, expires_at, response_status, not_replayable)
SELECT scope, endpoint, 'other', fingerprint, $1, token, locked_until, started_at, lease_expired_state,
    created_at, updated_at, expires_at, $2, $3 FROM ` + table + " WHERE key = 'key-1'"
			for _, c := range []struct {
				sql        string
				args       []any
				constraint string // "" when the statement is allowed
			}{
				{sql: "state = 'done'", constraint: "idem_state_check"},
				{sql: "lease_expired_state = 'completed'", constraint: "idem_lease_expired_state_check"},
				{sql: "attempts = 0", constraint: "idem_attempts_check"},
				{sql: "reconcile_attempts = -1", constraint: "idem_reconcile_attempts_check"},
				{sql: "reconcile_error = repeat('x', 257)", constraint: "idem_reconcile_error_check"},
				{sql: "ttl = interval '-1 second'", constraint: "idem_ttl_check"},
				{sql: "state = 'completed', response_status = 42", constraint: "idem_response_status_check"},
				// A completed record has a response or the not-replayable mark.
				{sql: "state = 'completed'", constraint: "idem_keys_response_check"},
				{sql: "state = 'completed', response_header = '{}', response_body = 'x'", constraint: "idem_keys_response_check"},
				{sql: insert, args: []any{"completed", nil, false}, constraint: "idem_keys_response_check"},
				// Only a completed record carries either.
				{sql: "response_status = 200", constraint: "idem_keys_response_check"},
				{sql: "response_header = '{}'", constraint: "idem_keys_response_check"},
				{sql: "response_body = 'x'", constraint: "idem_keys_response_check"},
				{sql: "not_replayable = true", constraint: "idem_keys_response_check"},
				{sql: "state = 'released', response_status = 200", constraint: "idem_keys_response_check"},
				{sql: "state = 'in_progress', not_replayable = true", constraint: "idem_keys_response_check"},
				{sql: insert, args: []any{"unknown", 200, false}, constraint: "idem_keys_response_check"},
				{sql: insert, args: []any{"released", nil, true}, constraint: "idem_keys_response_check"},
				// What the rule allows.
				{sql: "state = 'completed', response_status = 200, response_header = '{}', response_body = 'x'"},
				{sql: "state = 'completed', response_status = 200"},
				{sql: "state = 'completed', not_replayable = true"},
				{sql: "state = 'completed', not_replayable = true, response_header = '{}'"},
				{sql: "state = 'released'"},
				{sql: insert, args: []any{"completed", 200, false}},
				{sql: insert, args: []any{"completed", nil, true}},
				{sql: insert, args: []any{"in_progress", nil, false}},
			} {
				sql := c.sql
				if !strings.HasPrefix(sql, "INSERT") {
					sql = "UPDATE " + table + " SET " + sql + " WHERE key = 'key-1'"
				}
				tx, err := s.pool.Begin(b.ctx)
				if err != nil {
					t.Fatal(err)
				}
				tag, err := tx.Exec(b.ctx, sql, c.args...)
				tx.Rollback(b.ctx)
				var pgErr *pgconn.PgError
				switch {
				case c.constraint == "" && (err != nil || tag.RowsAffected() != 1):
					t.Errorf("%s %v: %v, %d rows; want one row written", c.sql, c.args, err, tag.RowsAffected())
				case c.constraint != "" && (!errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != c.constraint):
					t.Errorf("%s %v: %v, want a violation of %s", c.sql, c.args, err, c.constraint)
				}
			}
		})
	}
}
