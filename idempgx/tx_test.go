package idempgx

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
)

// otherTx is a transaction of some other store.
type otherTx struct{ idemstore.Tx }

func (otherTx) Driver() any { return "another driver's transaction" }

// TestTxFrom: TxFrom gives the pgx.Tx of a transaction this store began,
// also through a store that wraps it, and refuses any other transaction.
func TestTxFrom(t *testing.T) {
	t.Parallel()
	b := setup(t)
	payments := b.store.schema + ".payments"
	if _, err := b.store.pool.Exec(b.ctx, "CREATE TABLE "+payments+" (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	for name, ts := range map[string]idemstore.TxStore{
		"store":     b.store,
		"idemcrypt": idemcrypt.New(b.store, nil).(idemstore.TxStore),
	} {
		tx, err := ts.KeyBeginTx(b.ctx)
		if err != nil {
			t.Fatalf("%s: KeyBeginTx: %v", name, err)
		}
		ptx, ok := TxFrom(tx)
		if !ok {
			t.Fatalf("%s: TxFrom(%T) = false, want the pgx.Tx", name, tx)
		}
		if _, err := ptx.Exec(b.ctx, "INSERT INTO "+payments+" VALUES ('pay_1')"); err != nil {
			t.Fatalf("%s: writing through the pgx.Tx: %v", name, err)
		}
		if err := tx.Rollback(b.ctx); err != nil {
			t.Fatal(err)
		}
		var n int // the write was the transaction's: rolled back with it
		if err := b.store.pool.QueryRow(b.ctx, "SELECT count(*) FROM "+payments).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d payments after the rollback (%v), want 0", name, n, err)
		}
	}
	for _, tx := range []idemstore.Tx{nil, otherTx{}} {
		if ptx, ok := TxFrom(tx); ok || ptx != nil {
			t.Errorf("TxFrom(%T) = %v, %v; want nil, false", tx, ptx, ok)
		}
	}
	ctx := idemstore.ContextWithTx(b.ctx, func() (idemstore.Tx, error) { return otherTx{}, nil })
	if _, err := TxFromContext(ctx); err == nil || !strings.Contains(err.Error(), "not a pgx.Tx") {
		t.Errorf("TxFromContext with another store's transaction: %v, want an error naming it", err)
	}
	failed := errors.New("pool closed")
	ctx = idemstore.ContextWithTx(context.Background(), func() (idemstore.Tx, error) { return nil, failed })
	if _, err := TxFromContext(ctx); !errors.Is(err, failed) {
		t.Errorf("TxFromContext when beginning fails: %v, want %v", err, failed)
	}
}
