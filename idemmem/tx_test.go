package idemmem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// txBundle is a store on a test clock with one reserved key.
type txBundle struct {
	ctx   context.Context
	clock *idemtest.Clock
	store *idemmem.Store
	id    idemstore.Identity
	token string
}

func txSetup(t *testing.T) *txBundle {
	t.Helper()
	b := &txBundle{
		ctx:   t.Context(),
		clock: idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		id:    idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "k"},
		token: "t1",
	}
	b.store = idemmem.New(&idemmem.Config{Now: b.clock.Now})
	b.reserve(t, b.token, true)
	return b
}

// reserve reserves b.id with token (released when its lease expires, as
// in transactional mode) and checks whether it won.
func (b *txBundle) reserve(t *testing.T, token string, want bool) *idemstore.Record {
	t.Helper()
	res, err := b.store.KeyReserve(b.ctx, &idemstore.ReserveParams{
		Identity: b.id, Fingerprint: "f", Token: token, Lease: time.Minute, TTL: time.Hour,
		LeaseExpiredState: idemstore.StateReleased,
	})
	if err != nil || res.Reserved != want {
		t.Fatalf("KeyReserve(%s) = %+v, %v; want reserved %v", token, res, err, want)
	}
	return res.Record
}

func (b *txBundle) begin(t *testing.T) *idemmem.Tx {
	t.Helper()
	tx, err := b.store.KeyBeginTx(b.ctx)
	if err != nil {
		t.Fatalf("KeyBeginTx: %v", err)
	}
	return tx.(*idemmem.Tx)
}

func (b *txBundle) state(t *testing.T) idemstore.State {
	t.Helper()
	r, err := b.store.KeyGet(b.ctx, b.id)
	if err != nil {
		t.Fatalf("KeyGet: %v", err)
	}
	return r.State
}

func (b *txBundle) completeParams() *idemstore.CompleteParams {
	return &idemstore.CompleteParams{Identity: b.id, Token: b.token, Response: &idemstore.Response{Status: http.StatusCreated, Body: []byte("ok")}}
}

// The business values commit with the completion, and only then.
func TestTxValuesCommitWithTheKey(t *testing.T) {
	t.Parallel()
	b := txSetup(t)
	tx := b.begin(t)
	if err := tx.Put("payment", "1000"); err != nil {
		t.Fatal(err)
	}
	if err := tx.KeyComplete(b.ctx, b.completeParams()); err != nil {
		t.Fatal(err)
	}
	if v, ok := tx.Get("payment"); !ok || v != "1000" {
		t.Fatalf("the transaction reads its own write as %q, %v", v, ok)
	}
	if _, ok := b.store.Values()["payment"]; ok || b.state(t) != idemstore.StateInProgress {
		t.Fatalf("before Commit: values %v, state %s; want nothing visible", b.store.Values(), b.state(t))
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if v := b.store.Values()["payment"]; v != "1000" || b.state(t) != idemstore.StateCompleted {
		t.Fatalf("after Commit: payment %q, state %s; want 1000 and completed", v, b.state(t))
	}
	// A later transaction reads the committed value.
	if v, ok := b.begin(t).Get("payment"); !ok || v != "1000" {
		t.Fatalf("a new transaction reads %q, %v", v, ok)
	}
}

func TestTxRollbackDiscards(t *testing.T) {
	t.Parallel()
	b := txSetup(t)
	tx := b.begin(t)
	if err := tx.Put("payment", "1000"); err != nil {
		t.Fatal(err)
	}
	if err := tx.KeyComplete(b.ctx, b.completeParams()); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.store.Values()) != 0 || b.state(t) != idemstore.StateInProgress {
		t.Fatalf("after Rollback: values %v, state %s; want none and in_progress", b.store.Values(), b.state(t))
	}
	for what, err := range map[string]error{
		"Put":         tx.Put("x", "y"),
		"KeyComplete": tx.KeyComplete(b.ctx, b.completeParams()),
		"Commit":      tx.Commit(b.ctx),
	} {
		if !errors.Is(err, idemmem.ErrTxDone) {
			t.Errorf("%s after Rollback = %v, want ErrTxDone", what, err)
		}
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatalf("second Rollback = %v, want nil", err)
	}
}

// A transaction sees its own key writes: a completed record takes no
// checkpoint, in the transaction as in the store.
func TestTxSeesItsOwnKeyWrites(t *testing.T) {
	t.Parallel()
	b := txSetup(t)
	tx := b.begin(t)
	if err := tx.KeyCheckpoint(b.ctx, &idemstore.CheckpointParams{Identity: b.id, Token: b.token, RecoveryPoint: "charged"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.KeyComplete(b.ctx, b.completeParams()); err != nil {
		t.Fatal(err)
	}
	err := tx.KeyCheckpoint(b.ctx, &idemstore.CheckpointParams{Identity: b.id, Token: b.token, RecoveryPoint: "late"})
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("checkpoint after the transaction's completion = %v, want ErrLeaseLost", err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	r, err := b.store.KeyGet(b.ctx, b.id)
	if err != nil || r.State != idemstore.StateCompleted || r.RecoveryPoint != "charged" {
		t.Fatalf("committed record %+v, %v; want completed at recovery point charged", r, err)
	}
}

// A lease taken over while the transaction is open makes Commit fail with
// ErrLeaseLost, writing neither the completion nor the business values.
func TestTxCommitFencedOnTakeover(t *testing.T) {
	t.Parallel()
	b := txSetup(t)
	tx := b.begin(t)
	if err := tx.Put("payment", "1000"); err != nil {
		t.Fatal(err)
	}
	if err := tx.KeyComplete(b.ctx, b.completeParams()); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	b.reserve(t, "t2", true)
	if err := tx.Commit(b.ctx); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Commit after a takeover = %v, want ErrLeaseLost", err)
	}
	r, err := b.store.KeyGet(b.ctx, b.id)
	if err != nil || r.State != idemstore.StateInProgress || r.Token != "t2" || len(b.store.Values()) != 0 {
		t.Fatalf("after the failed Commit: %+v, %v, values %v; want t2's attempt untouched and no values", r, err, b.store.Values())
	}
}

// Commit and a takeover of an expired lease race for real: exactly one of
// them wins, and the business value exists exactly when the completion
// committed.
func TestTxCommitRacesTakeover(t *testing.T) {
	t.Parallel()
	for i := range 200 {
		b := txSetup(t)
		tx := b.begin(t)
		if err := tx.Put("payment", "1000"); err != nil {
			t.Fatal(err)
		}
		if err := tx.KeyComplete(b.ctx, b.completeParams()); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(time.Minute)
		var commitErr error
		var res *idemstore.ReserveResult
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; commitErr = tx.Commit(b.ctx) })
		wg.Go(func() {
			<-start
			var err error
			res, err = b.store.KeyReserve(b.ctx, &idemstore.ReserveParams{
				Identity: b.id, Fingerprint: "f", Token: "t2", Lease: time.Minute, TTL: time.Hour,
				LeaseExpiredState: idemstore.StateReleased,
			})
			if err != nil {
				t.Error(err)
			}
		})
		close(start)
		wg.Wait()
		_, paid := b.store.Values()["payment"]
		committed := commitErr == nil
		switch {
		case res == nil:
			t.Fatal("no reserve result")
		case committed == res.Reserved:
			t.Fatalf("round %d: commit err %v and takeover %v: want exactly one winner", i, commitErr, res.Reserved)
		case !committed && !errors.Is(commitErr, idemstore.ErrLeaseLost):
			t.Fatalf("round %d: Commit = %v, want ErrLeaseLost", i, commitErr)
		case paid != committed:
			t.Fatalf("round %d: payment written %v, completion committed %v", i, paid, committed)
		case committed && (res.Record.State != idemstore.StateCompleted || res.Record.Token != b.token):
			t.Fatalf("round %d: the retry after the commit saw %s by %s", i, res.Record.State, res.Record.Token)
		}
	}
}

func TestTxFromContext(t *testing.T) {
	t.Parallel()
	if _, err := idemmem.TxFromContext(t.Context()); !errors.Is(err, idemstore.ErrNoTx) {
		t.Fatalf("TxFromContext outside a transactional request = %v, want ErrNoTx", err)
	}
	s := idemmem.New(nil)
	var begun idemstore.Tx
	ctx := idemstore.ContextWithTx(t.Context(), func() (idemstore.Tx, error) {
		if begun == nil {
			begun, _ = s.KeyBeginTx(t.Context())
		}
		return begun, nil
	})
	tx, err := idemmem.TxFromContext(ctx)
	if err != nil || tx == nil || idemstore.Tx(tx) != begun {
		t.Fatalf("TxFromContext = %v, %v; want the request's transaction", tx, err)
	}
}

// otherTx is a transaction of some other store.
type otherTx struct{ idemstore.Tx }

func (otherTx) Driver() any { return "another driver's transaction" }

// TestTxFrom: TxFrom gives the *Tx of a transaction the store began, also
// through a store that wraps it, and refuses any other transaction.
func TestTxFrom(t *testing.T) {
	t.Parallel()
	b := txSetup(t)
	for name, ts := range map[string]idemstore.TxStore{
		"store":     b.store,
		"idemcrypt": idemcrypt.New(b.store, nil).(idemstore.TxStore),
	} {
		tx, err := ts.KeyBeginTx(b.ctx)
		if err != nil {
			t.Fatalf("%s: KeyBeginTx: %v", name, err)
		}
		mtx, ok := idemmem.TxFrom(tx)
		if !ok {
			t.Fatalf("%s: TxFrom(%T) = false, want the *Tx", name, tx)
		}
		if err := mtx.Put("payment", name); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		if got := b.store.Values()["payment"]; got != name {
			t.Errorf("%s: committed value %q, want the one Put through TxFrom's *Tx", name, got)
		}
	}
	for _, tx := range []idemstore.Tx{nil, otherTx{}} {
		if mtx, ok := idemmem.TxFrom(tx); ok || mtx != nil {
			t.Errorf("TxFrom(%T) = %v, %v; want nil, false", tx, mtx, ok)
		}
	}
	ctx := idemstore.ContextWithTx(b.ctx, func() (idemstore.Tx, error) { return otherTx{}, nil })
	if _, err := idemmem.TxFromContext(ctx); err == nil || !strings.Contains(err.Error(), "not an *idemmem.Tx") {
		t.Errorf("TxFromContext with another store's transaction: %v, want an error naming it", err)
	}
}
