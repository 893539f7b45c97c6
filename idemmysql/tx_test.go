package idemmysql

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
)

// otherTx is a transaction of some other store.
type otherTx struct{ idemstore.Tx }

func (otherTx) Driver() any { return "another driver's transaction" }

// TestTxFrom: TxFrom gives the *sql.Tx of a transaction this store began,
// also through a store that wraps it, and refuses any other transaction.
func TestTxFrom(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.store.db.ExecContext(b.ctx, "CREATE TABLE payments (id VARCHAR(64) PRIMARY KEY) ENGINE = InnoDB"); err != nil {
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
		stx, ok := TxFrom(tx)
		if !ok {
			t.Fatalf("%s: TxFrom(%T) = false, want the *sql.Tx", name, tx)
		}
		if _, err := stx.ExecContext(b.ctx, "INSERT INTO payments VALUES ('pay_1')"); err != nil {
			t.Fatalf("%s: writing through the *sql.Tx: %v", name, err)
		}
		if err := tx.Rollback(b.ctx); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := b.store.db.QueryRowContext(b.ctx, "SELECT count(*) FROM payments").Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d payments after the rollback (%v), want 0", name, n, err)
		}
	}
	for _, tx := range []idemstore.Tx{nil, otherTx{}} {
		if stx, ok := TxFrom(tx); ok || stx != nil {
			t.Errorf("TxFrom(%T) = %v, %v; want nil, false", tx, stx, ok)
		}
	}
	ctx := idemstore.ContextWithTx(b.ctx, func() (idemstore.Tx, error) { return otherTx{}, nil })
	if _, err := TxFromContext(ctx); err == nil || !strings.Contains(err.Error(), "not a *sql.Tx") {
		t.Errorf("TxFromContext with another store's transaction: %v, want an error naming it", err)
	}
	failed := errors.New("pool closed")
	ctx = idemstore.ContextWithTx(context.Background(), func() (idemstore.Tx, error) { return nil, failed })
	if _, err := TxFromContext(ctx); !errors.Is(err, failed) {
		t.Errorf("TxFromContext when beginning fails: %v, want %v", err, failed)
	}
}

// TestTxStore: the business writes and the key's completion commit or roll
// back together through the idemstore.Tx the middleware uses, and a handler
// finds the *sql.Tx in its context.
func TestTxStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.store.db.ExecContext(b.ctx, "CREATE TABLE payments (id VARCHAR(64) PRIMARY KEY) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	b.reserve(t, reserveParams("t1", idemstore.StateReleased))
	complete := &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()}
	run := func(commit bool) {
		t.Helper()
		var tx idemstore.Tx
		ctx := idemstore.ContextWithTx(b.ctx, func() (idemstore.Tx, error) {
			var err error
			if tx == nil {
				tx, err = b.store.KeyBeginTx(b.ctx)
			}
			return tx, err
		})
		stx, err := TxFromContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stx.ExecContext(ctx, "INSERT INTO payments VALUES ('pay_1')"); err != nil {
			t.Fatal(err)
		}
		if err := tx.KeyCheckpoint(ctx, &idemstore.CheckpointParams{Identity: testID, Token: "t1", RecoveryPoint: "charged"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.KeyComplete(ctx, complete); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatalf("Rollback (after Commit: %v): %v", commit, err)
		}
	}
	payments := func() int {
		t.Helper()
		var n int
		if err := b.store.db.QueryRowContext(b.ctx, "SELECT count(*) FROM payments").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	run(false)
	if rec := b.get(t); rec.State != idemstore.StateInProgress || rec.RecoveryPoint != "" || payments() != 0 {
		t.Fatalf("after rollback: state %s, recovery point %q, %d payments; want in_progress, none, 0", rec.State, rec.RecoveryPoint, payments())
	}
	run(true)
	if rec := b.get(t); rec.State != idemstore.StateCompleted || rec.RecoveryPoint != "charged" || payments() != 1 {
		t.Fatalf("after commit: state %s, recovery point %q, %d payments; want completed, charged, 1", rec.State, rec.RecoveryPoint, payments())
	}
	if _, err := TxFromContext(b.ctx); !errors.Is(err, idemstore.ErrNoTx) {
		t.Fatalf("TxFromContext outside a transactional request: %v, want ErrNoTx", err)
	}
}

// TestCompleteTxBlocksTakeover: while a transaction that completes the key
// is open, a retry that finds the lease expired (turning released) waits for
// it, and after the commit replays the completion instead of taking over;
// a replay meanwhile reads the record without waiting.
func TestCompleteTxBlocksTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.reserve(t, reserveParams("t1", idemstore.StateReleased))
	tx, err := b.store.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := b.store.CompleteTx(b.ctx, tx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()}); err != nil {
		t.Fatal(err)
	}
	var conn int64
	if err := tx.QueryRowContext(b.ctx, "SELECT CONNECTION_ID()").Scan(&conn); err != nil {
		t.Fatal(err)
	}
	// Before the lease expires, a duplicate reads the in-progress record at
	// once: the reserve statement takes no lock.
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	if res, err := b.store.KeyReserve(ctx, reserveParams("t-dup", idemstore.StateReleased)); err != nil || res.Reserved || res.Record.State != idemstore.StateInProgress {
		t.Fatalf("duplicate while the completion is open: %+v, %v; want the in-progress record at once", res, err)
	}
	b.clock.Advance(lease) // the lease expired while the transaction runs

	type result struct {
		res *idemstore.ReserveResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := b.store.KeyReserve(b.ctx, reserveParams("t2", idemstore.StateReleased))
		done <- result{res, err}
	}()
	b.waitLockWait(t)
	select {
	case r := <-done:
		t.Fatalf("the takeover did not wait for the open completion: %+v", r)
	default:
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Reserved || r.res.Record.State != idemstore.StateCompleted || r.res.Record.Token != "t1" {
		t.Fatalf("retry after the commit: reserved %v state %s token %s, want the completion of t1",
			r.res.Reserved, r.res.Record.State, r.res.Record.Token)
	}
}

// waitLockWait waits until a transaction of the store's database waits for
// a lock.
func (b *bundle) waitLockWait(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := b.store.db.QueryRowContext(b.ctx,
			"SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'").Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		// innodb_trx is a cache that InnoDB refreshes only once it has
		// not been read for 100ms.
		time.Sleep(150 * time.Millisecond)
	}
	t.Fatal("no transaction waited for a lock within 10s")
}

// TestCheckpointTx: a checkpoint commits or rolls back with the transaction,
// is fenced, and a takeover after the lease expired resumes at it.
func TestCheckpointTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	orig := b.reserve(t, reserveParams("t1", idemstore.StateReleased)).Record
	b.clock.Advance(time.Second)
	checkpoint := func(token, point string, commit bool) error {
		tx, err := b.store.db.BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := b.store.CheckpointTx(b.ctx, tx, &idemstore.CheckpointParams{Identity: testID, Token: token, RecoveryPoint: point}); err != nil {
			return err
		}
		if commit {
			return tx.Commit()
		}
		return nil
	}
	if err := checkpoint("t1", "charged", false); err != nil {
		t.Fatal(err)
	}
	if rec := b.get(t); rec.RecoveryPoint != "" {
		t.Fatalf("after rollback: recovery point %q, want none", rec.RecoveryPoint)
	}
	if err := checkpoint("t1", "charged", true); err != nil {
		t.Fatal(err)
	}
	rec := b.get(t)
	if rec.RecoveryPoint != "charged" || rec.State != idemstore.StateInProgress ||
		!rec.LockedUntil.Equal(orig.LockedUntil) || !rec.UpdatedAt.Equal(b.clock.Now()) {
		t.Fatalf("after commit: %+v; want recovery point charged, the lease unchanged", rec)
	}
	if err := checkpoint("other", "shipped", true); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("CheckpointTx with another token: %v, want ErrLeaseLost", err)
	}
	b.clock.Advance(lease)
	res := b.reserve(t, reserveParams("t2", idemstore.StateReleased))
	if !res.Reserved || res.Record.RecoveryPoint != "charged" {
		t.Fatalf("takeover: reserved %v, recovery point %q; want the lease at charged", res.Reserved, res.Record.RecoveryPoint)
	}
	if err := checkpoint("t1", "shipped", true); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("CheckpointTx by the attempt taken over: %v, want ErrLeaseLost", err)
	}
}
