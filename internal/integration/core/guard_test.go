package idem_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/integration/teststore"
)

// TestGuardTransactional: in transactional mode the function's writes commit
// with the completion, and an error rolls them back and releases the key.
func TestGuardTransactional(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	store := teststore.OpenSQLite(t, filepath.Join(t.TempDir(), "idem.db"), clock.Now)
	if _, err := store.DB().Exec("CREATE TABLE credits (amount INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	g := testGuard(store, clock, idem.GuardConfig{Transactional: true})
	fail := true
	credit := func(ctx context.Context) (int, error) {
		tx, err := idemsqlite.TxFromContext(ctx)
		if err != nil {
			return 0, err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO credits (amount) VALUES (100)"); err != nil {
			return 0, err
		}
		if fail {
			return 0, errors.New("ledger closed")
		}
		return 100, nil
	}
	count := func() (n int) {
		if err := store.DB().QueryRow("SELECT count(*) FROM credits").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ctx := context.Background()
	if _, err := idem.Do(ctx, g, "tx-key", "credit", nil, credit); err == nil || count() != 0 {
		t.Fatalf("failing run: %v, %d credits; want the error and none", err, count())
	}
	fail = false
	for range 2 {
		if v, err := idem.Do(ctx, g, "tx-key", "credit", nil, credit); err != nil || v != 100 {
			t.Fatalf("Do: %v, %v", v, err)
		}
	}
	if count() != 1 {
		t.Fatalf("%d credits, want 1", count())
	}
	var phases []string
	_, err := idem.Do(ctx, g, "phased", "credit", nil, func(ctx context.Context) (string, error) {
		err := idem.RunPhases(ctx, idem.Phase{Name: "reserve", Run: func(ctx context.Context, tx idemstore.Tx) error {
			phases = append(phases, "reserve")
			return nil
		}})
		return idem.RecoveryPoint(ctx), err
	})
	if err != nil || len(phases) != 1 {
		t.Fatalf("RunPhases in Do: %v, %v", phases, err)
	}
}
