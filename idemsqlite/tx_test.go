package idemsqlite_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// otherTx is a transaction of some other store.
type otherTx struct{ idemstore.Tx }

func (otherTx) Driver() any { return "another driver's transaction" }

// TestTxFrom: TxFrom gives the *sql.Tx of a transaction the store began,
// also through a store that wraps it, and refuses any other transaction.
func TestTxFrom(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openStore(t, nil)
	if _, err := s.DB().ExecContext(ctx, "CREATE TABLE payments (id TEXT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	for name, ts := range map[string]idemstore.TxStore{
		"store":     s,
		"idemcrypt": idemcrypt.New(s, nil).(idemstore.TxStore),
	} {
		tx, err := ts.KeyBeginTx(ctx)
		if err != nil {
			t.Fatalf("%s: KeyBeginTx: %v", name, err)
		}
		stx, ok := idemsqlite.TxFrom(tx)
		if !ok {
			t.Fatalf("%s: TxFrom(%T) = false, want the *sql.Tx", name, tx)
		}
		if _, err := stx.ExecContext(ctx, "INSERT INTO payments (id) VALUES ('p1')"); err != nil {
			t.Fatalf("%s: writing through the *sql.Tx: %v", name, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		var n int // the write was the transaction's: rolled back with it
		if err := s.DB().QueryRowContext(ctx, "SELECT count(*) FROM payments").Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d payments after the rollback (%v), want 0", name, n, err)
		}
	}
	for _, tx := range []idemstore.Tx{nil, otherTx{}} {
		if stx, ok := idemsqlite.TxFrom(tx); ok || stx != nil {
			t.Errorf("TxFrom(%T) = %v, %v; want nil, false", tx, stx, ok)
		}
	}
	tctx := idemstore.ContextWithTx(ctx, func() (idemstore.Tx, error) { return otherTx{}, nil })
	if _, err := idemsqlite.TxFromContext(tctx); err == nil || !strings.Contains(err.Error(), "not a *sql.Tx") {
		t.Errorf("TxFromContext with another store's transaction: %v, want an error naming it", err)
	}
	failed := errors.New("database closed")
	tctx = idemstore.ContextWithTx(context.Background(), func() (idemstore.Tx, error) { return nil, failed })
	if _, err := idemsqlite.TxFromContext(tctx); !errors.Is(err, failed) {
		t.Errorf("TxFromContext when beginning fails: %v, want %v", err, failed)
	}
}
