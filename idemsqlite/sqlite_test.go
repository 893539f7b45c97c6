package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

var testID = idemstore.Identity{Scope: "tenant", Endpoint: "POST /v1/payments", Key: "key-1"}

func reserve(t testing.TB, s idemstore.Store, id idemstore.Identity, token string) {
	t.Helper()
	res, err := s.KeyReserve(context.Background(), &idemstore.ReserveParams{
		Identity: id, Fingerprint: "fp", Token: token, Lease: time.Minute, TTL: time.Hour,
	})
	if err != nil || !res.Reserved {
		t.Fatalf("KeyReserve(%v) = %+v, %v; want reserved", id, res, err)
	}
}

func pragma(t *testing.T, db *sql.DB, name string) string {
	t.Helper()
	var v string
	if err := db.QueryRow("PRAGMA " + name).Scan(&v); err != nil {
		t.Fatalf("PRAGMA %s: %v", name, err)
	}
	return v
}

func TestOpenSettings(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  *idemsqlite.Config
		sync string
	}{
		{nil, "2"},
		{&idemsqlite.Config{Synchronous: "normal"}, "1"},
		{&idemsqlite.Config{Synchronous: "FULL", BusyTimeout: 1234 * time.Millisecond}, "2"},
	} {
		s := openStore(t, tt.cfg)
		db := s.DB()
		if got := pragma(t, db, "journal_mode"); got != "wal" {
			t.Errorf("journal_mode = %s, want wal", got)
		}
		if got := pragma(t, db, "synchronous"); got != tt.sync {
			t.Errorf("synchronous = %s, want %s", got, tt.sync)
		}
		if got := pragma(t, db, "foreign_keys"); got != "1" {
			t.Errorf("foreign_keys = %s, want 1", got)
		}
		want := "5000"
		if tt.cfg != nil && tt.cfg.BusyTimeout != 0 {
			want = "1234"
		}
		if got := pragma(t, db, "busy_timeout"); got != want {
			t.Errorf("busy_timeout = %s, want %s", got, want)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct {
		path string
		cfg  *idemsqlite.Config
	}{
		{"", nil},
		{":memory:", nil},
		{filepath.Join(dir, "a.db?mode=ro"), nil},
		{filepath.Join(dir, "b.db"), &idemsqlite.Config{Synchronous: "OFF"}},
		{filepath.Join(dir, "missing-dir", "c.db"), nil},
	} {
		if s, err := idemsqlite.Open(tt.path, tt.cfg); err == nil {
			s.Close()
			t.Errorf("Open(%q, %+v) succeeded, want an error", tt.path, tt.cfg)
		}
	}
}

func TestMigrations(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openStore(t, nil)
	tables := func() string {
		t.Helper()
		rows, err := s.DB().QueryContext(ctx, "SELECT name FROM sqlite_schema WHERE name LIKE 'idem_keys%' ORDER BY name")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var names []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		return strings.Join(names, ",")
	}
	const schema = "idem_keys,idem_keys_reap_idx,idem_keys_reconcile_idx,idem_keys_sweep_idx"
	if got := tables(); got != schema {
		t.Fatalf("after Open the schema has %q, want %q", got, schema)
	}
	status, err := s.MigrationStatus(ctx)
	if err != nil || len(status) == 0 {
		t.Fatalf("MigrationStatus = %v, %v", status, err)
	}
	for _, m := range status {
		if !m.Applied || m.AppliedAt.IsZero() {
			t.Fatalf("migration %03d_%s not applied after Open", m.Version, m.Name)
		}
	}
	if status[0].Version != 1 || status[0].Name != "create_keys" {
		t.Fatalf("first migration is %03d_%s, want 001_create_keys", status[0].Version, status[0].Name)
	}
	if done, err := s.Migrate(ctx); err != nil || len(done) != 0 {
		t.Fatalf("second Migrate = %v, %v; want nothing to do", done, err)
	}

	for range status {
		m, err := s.MigrateDown(ctx)
		if err != nil || m == nil {
			t.Fatalf("MigrateDown = %v, %v", m, err)
		}
	}
	if m, err := s.MigrateDown(ctx); err != nil || m != nil {
		t.Fatalf("MigrateDown with nothing applied = %v, %v; want nil, nil", m, err)
	}
	if got := tables(); got != "" {
		t.Fatalf("after migrating down the schema has %q", got)
	}
	status, err = s.MigrationStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range status {
		if m.Applied {
			t.Fatalf("migration %03d_%s applied after migrating down", m.Version, m.Name)
		}
	}

	done, err := s.Migrate(ctx)
	if err != nil || len(done) != len(status) {
		t.Fatalf("Migrate = %v, %v; want %d migrations", done, err, len(status))
	}
	if got := tables(); got != schema {
		t.Fatalf("after migrating up again the schema has %q, want %q", got, schema)
	}
	reserve(t, s, testID, "t1")
}

// TestMigrationRebuildKeepsRecords: 003 rebuilds the keys table (to change
// its state check); reverting it and applying it again keep every record as
// it was, and the check still holds.
func TestMigrationRebuildKeepsRecords(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openStore(t, nil)
	reserve(t, s, testID, "t1")
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1",
		Response: &idemstore.Response{Status: 201, Header: http.Header{"A": {"b"}}, Body: []byte("done")}}); err != nil {
		t.Fatal(err)
	}
	other := idemstore.Identity{Scope: testID.Scope, Endpoint: testID.Endpoint, Key: "other"}
	reserve(t, s, other, "t2")
	want := make(map[string]*idemstore.Record)
	for _, id := range []idemstore.Identity{testID, other} {
		r, err := s.KeyGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		want[id.Key] = r
	}
	check := func(when string) {
		t.Helper()
		for _, id := range []idemstore.Identity{testID, other} {
			if r, err := s.KeyGet(ctx, id); err != nil || !reflect.DeepEqual(r, want[id.Key]) {
				t.Errorf("%s: KeyGet(%s) = %+v, %v; want %+v", when, id.Key, r, err, want[id.Key])
			}
		}
		if _, err := s.DB().ExecContext(ctx, "UPDATE idem_keys SET state = 'done'"); err == nil ||
			!strings.Contains(err.Error(), "idem_keys_state_check") {
			t.Errorf("%s: setting an unknown state: %v; want a violation of idem_keys_state_check", when, err)
		}
	}
	m, err := s.MigrateDown(ctx)
	if err != nil || m == nil || m.Name != "state_check" {
		t.Fatalf("MigrateDown = %+v, %v; want 003_state_check reverted", m, err)
	}
	check("reverted")
	if done, err := s.Migrate(ctx); err != nil || len(done) != 1 {
		t.Fatalf("Migrate = %v, %v; want 003_state_check applied", done, err)
	}
	check("applied again")
}

func TestSchemaConstraints(t *testing.T) {
	t.Parallel()
	s := openStore(t, nil)
	reserve(t, s, testID, "t1")
	for _, tt := range []struct {
		stmt, constraint string
	}{
		{"UPDATE idem_keys SET state = 'done'", "idem_keys_state_check"},
		{"UPDATE idem_keys SET lease_expired_state = 'completed'", "idem_keys_lease_expired_state_check"},
		{"UPDATE idem_keys SET response_status = 200", "idem_keys_response_check"},
		{"UPDATE idem_keys SET state = 'completed'", "idem_keys_response_check"},
		{"UPDATE idem_keys SET state = 'completed', response_status = 42", "idem_keys_response_status_check"},
		{"UPDATE idem_keys SET state = 'completed', response_status = 200, response_header = 'nope'", "idem_keys_response_header_check"},
		{"UPDATE idem_keys SET attempts = 0", "idem_keys_attempts_check"},
		{"UPDATE idem_keys SET not_replayable = 2", "idem_keys_not_replayable_check"},
		{"INSERT INTO idem_keys SELECT * FROM idem_keys", "UNIQUE"},
		{"UPDATE idem_keys SET locked_until = 'soon'", "cannot store TEXT value in INTEGER column"},
	} {
		_, err := s.DB().Exec(tt.stmt)
		if err == nil || !strings.Contains(err.Error(), tt.constraint) {
			t.Errorf("%s: err = %v, want a violation of %s", tt.stmt, err, tt.constraint)
		}
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := sql.Open("sqlite", path+"?_journal_mode=WAL&_busy_timeout=5000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := idemsqlite.New(nil, nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	if _, err := idemsqlite.New(db, &idemsqlite.Config{Synchronous: "sometimes"}); err == nil {
		t.Fatal("New with a bad Synchronous succeeded")
	}
	s, err := idemsqlite.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.DB() != db {
		t.Fatal("DB() is not the pool given to New")
	}
	if _, err := s.KeyGet(ctx, testID); err == nil {
		t.Fatal("KeyGet before Migrate succeeded")
	}
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	reserve(t, s, testID, "t1")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("Close closed the caller's pool: %v", err)
	}
}

func TestCompleteTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openStore(t, nil)
	db := s.DB()
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id TEXT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	reserve(t, s, testID, "t1")
	resp := &idemstore.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"p1"}`)}
	payments := func() int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM payments").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	state := func() idemstore.State {
		t.Helper()
		r, err := s.KeyGet(ctx, testID)
		if err != nil {
			t.Fatal(err)
		}
		return r.State
	}

	// businessTx writes a payment and completes the key in one transaction.
	businessTx := func(token string) (*sql.Tx, error) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO payments (id) VALUES ('p1')"); err != nil {
			t.Fatal(err)
		}
		return tx, s.CompleteTx(ctx, tx, &idemstore.CompleteParams{Identity: testID, Token: token, Response: resp})
	}

	// A stale token is refused inside the transaction.
	tx, err := businessTx("stale")
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("CompleteTx with a stale token = %v, want ErrLeaseLost", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	// Rolled back: neither the payment nor the completion is there.
	tx, err = businessTx("t1")
	if err != nil {
		t.Fatalf("CompleteTx: %v", err)
	}
	if got := state(); got != idemstore.StateInProgress {
		t.Fatalf("state before commit, seen from outside = %s, want in_progress", got)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if got, n := state(), payments(); got != idemstore.StateInProgress || n != 0 {
		t.Fatalf("after rollback: state %s, %d payments; want in_progress, 0", got, n)
	}

	// Committed: both are.
	tx, err = businessTx("t1")
	if err != nil {
		t.Fatalf("CompleteTx: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r, err := s.KeyGet(ctx, testID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != idemstore.StateCompleted || r.Response == nil || string(r.Response.Body) != `{"id":"p1"}` || payments() != 1 {
		t.Fatalf("after commit: %+v, %d payments; want completed with the response and 1 payment", r, payments())
	}
}

func TestTwoStoresOneFile(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "idem.db")
	var stores []*idemsqlite.Store
	for range 2 {
		s, err := idemsqlite.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores = append(stores, s)
	}
	const goroutines = 100
	results := make(chan bool, 2*goroutines)
	errs := make(chan error, 2*goroutines)
	start := make(chan struct{})
	for i := range 2 * goroutines {
		go func() {
			<-start
			res, err := stores[i%2].KeyReserve(ctx, &idemstore.ReserveParams{
				Identity: testID, Fingerprint: "fp", Token: "t" + string(rune('A'+i%50)) + string(rune('a'+i/50)),
				Lease: time.Minute, TTL: time.Hour,
			})
			if err != nil {
				errs <- err
				return
			}
			results <- res.Reserved
		}()
	}
	close(start)
	winners := 0
	for range 2 * goroutines {
		select {
		case err := <-errs:
			t.Fatalf("KeyReserve: %v", err)
		case won := <-results:
			if won {
				winners++
			}
		}
	}
	if winners != 1 {
		t.Fatalf("%d winners across two stores on one file, want 1", winners)
	}
}

func TestOpenRelativePath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	s, err := idemsqlite.Open("idem.db", nil)
	if err != nil {
		t.Fatal(err)
	}
	reserve(t, s, testID, "t1")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "idem.db")); err != nil {
		t.Fatalf("the database is not in the working directory: %v", err)
	}
}
