package idemmysql

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestMigrateConcurrently: processes that start at once on a new database
// apply each migration once (the named lock), and the status, a down and an
// up again follow.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	ctx := t.Context()
	const n = 4
	applied := make([][]Migration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		s, err := Open(ctx, dsn, &Config{MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
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
		t.Fatalf("%d migrations applied in all, want each of the %d once", total, len(migrations))
	}

	s, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	status, err := s.MigrationStatus(ctx)
	if err != nil || len(status) != len(migrations) || !status[0].Applied || status[0].Name != "create_keys" ||
		time.Since(status[0].AppliedAt) > time.Hour {
		t.Fatalf("MigrationStatus = %+v, %v", status, err)
	}
	down, err := s.MigrateDown(ctx)
	if err != nil || down == nil || down.Version != len(migrations) {
		t.Fatalf("MigrateDown = %+v, %v", down, err)
	}
	if len(migrations) == 1 {
		var n int
		err := s.db.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'idem_keys'").Scan(&n)
		if err != nil || n != 0 {
			t.Fatalf("idem_keys after reverting its migration: %d tables (%v)", n, err)
		}
	}
	if done, err := s.Migrate(context.Background()); err != nil || len(done) != 1 {
		t.Fatalf("Migrate after the down = %+v, %v; want the reverted one again", done, err)
	}
}
