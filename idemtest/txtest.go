package idemtest

import (
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

func testTransactional(t *testing.T, setup setupFunc) {
	if _, ok := setup(t).store.(idemstore.TxStore); !ok {
		t.Skip("the store does not implement idemstore.TxStore")
	}
	// txSetup returns the bundle and its store as a TxStore.
	txSetup := func(t *testing.T) (*bundle, idemstore.TxStore) {
		t.Helper()
		b := setup(t)
		return b, b.store.(idemstore.TxStore)
	}
	begin := func(t *testing.T, b *bundle, ts idemstore.TxStore) idemstore.Tx {
		t.Helper()
		tx, err := ts.KeyBeginTx(b.ctx)
		if err != nil {
			t.Fatalf("KeyBeginTx: %v", err)
		}
		t.Cleanup(func() { tx.Rollback(b.ctx) })
		return tx
	}
	commit := func(t *testing.T, b *bundle, tx idemstore.Tx) {
		t.Helper()
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatalf("Commit: %v", err)
		}
	}
	rollback := func(t *testing.T, b *bundle, tx idemstore.Tx) {
		t.Helper()
		if err := tx.Rollback(b.ctx); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
	}
	checkpoint := func(t *testing.T, b *bundle, ts idemstore.TxStore, token, point string) {
		t.Helper()
		tx := begin(t, b, ts)
		err := tx.KeyCheckpoint(b.ctx, &idemstore.CheckpointParams{Identity: b.id, Token: token, RecoveryPoint: point})
		if err != nil {
			t.Fatalf("KeyCheckpoint: %v", err)
		}
		commit(t, b, tx)
	}

	t.Run("CompleteCommits", func(t *testing.T) {
		t.Parallel()
		b, ts := txSetup(t)
		p := b.params(b.id)
		before := b.reserveNew(t, p)
		tx := begin(t, b, ts)
		if err := tx.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: b.id, Token: p.Token, Response: sampleResponse()}); err != nil {
			t.Fatalf("Tx.KeyComplete: %v", err)
		}
		requireSameRecord(t, "record seen outside the open transaction", b.get(t, b.id), before)
		commit(t, b, tx)
		r := b.get(t, b.id)
		requireState(t, r, idemstore.StateCompleted)
		requireResponse(t, r, sampleResponse())
		if err := tx.Rollback(b.ctx); err != nil {
			t.Fatalf("Rollback after Commit: %v", err)
		}
		requireState(t, b.get(t, b.id), idemstore.StateCompleted)
	})

	t.Run("CompleteRollsBack", func(t *testing.T) {
		t.Parallel()
		b, ts := txSetup(t)
		p := b.params(b.id)
		before := b.reserveNew(t, p)
		tx := begin(t, b, ts)
		if err := tx.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: b.id, Token: p.Token, Response: sampleResponse()}); err != nil {
			t.Fatalf("Tx.KeyComplete: %v", err)
		}
		rollback(t, b, tx)
		requireSameRecord(t, "record after the rollback", b.get(t, b.id), before)
		// The attempt still owns the record, and releases it.
		b.release(t, b.id, p.Token)
		requireState(t, b.get(t, b.id), idemstore.StateReleased)
	})

	t.Run("CompleteFenced", func(t *testing.T) {
		t.Parallel()
		b, ts := txSetup(t)
		p := b.params(b.id)
		p.LeaseExpiredState = idemstore.StateReleased
		b.reserveNew(t, p)
		b.clock.Advance(testLease)
		p2 := b.params(b.id)
		b.reserveNew(t, p2)
		before := b.get(t, b.id)

		tx := begin(t, b, ts)
		err := tx.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: b.id, Token: p.Token, Response: sampleResponse()})
		requireErr(t, "Tx.KeyComplete by the attempt whose lease was taken over", err, idemstore.ErrLeaseLost)
		err = tx.KeyCheckpoint(b.ctx, &idemstore.CheckpointParams{Identity: b.id, Token: p.Token, RecoveryPoint: "charged"})
		requireErr(t, "Tx.KeyCheckpoint by the attempt whose lease was taken over", err, idemstore.ErrLeaseLost)
		rollback(t, b, tx)
		requireSameRecord(t, "record after stale transactional writes", b.get(t, b.id), before)
	})

	t.Run("CheckpointKeptAcrossReclaim", func(t *testing.T) {
		t.Parallel()
		b, ts := txSetup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		b.clock.Advance(time.Second)
		checkpoint(t, b, ts, p.Token, "charged")
		r := b.get(t, b.id)
		requireState(t, r, idemstore.StateInProgress)
		if r.RecoveryPoint != "charged" || r.Token != p.Token || !r.UpdatedAt.Equal(b.clock.Now()) {
			t.Fatalf("after a checkpoint: recovery point %q token %q updated %v; want charged, %q, %v",
				r.RecoveryPoint, r.Token, r.UpdatedAt, p.Token, b.clock.Now())
		}

		b.release(t, b.id, p.Token)
		if rp := b.get(t, b.id).RecoveryPoint; rp != "charged" {
			t.Fatalf("released record's recovery point = %q, want charged", rp)
		}
		w := requireOneWinner(t, b.raceReserve(t, b.id, testFingerprint))
		if w.RecoveryPoint != "charged" || w.Attempts != 2 {
			t.Fatalf("re-claimed record: recovery point %q attempts %d, want charged and 2", w.RecoveryPoint, w.Attempts)
		}

		// The next phase advances it, and the completion keeps it.
		checkpoint(t, b, ts, w.Token, "recorded")
		tx := begin(t, b, ts)
		if err := tx.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: b.id, Token: w.Token, Response: sampleResponse()}); err != nil {
			t.Fatalf("Tx.KeyComplete: %v", err)
		}
		commit(t, b, tx)
		r = b.get(t, b.id)
		if r.State != idemstore.StateCompleted || r.RecoveryPoint != "recorded" {
			t.Fatalf("completed record: state %q recovery point %q, want completed, recorded", r.State, r.RecoveryPoint)
		}
	})

	t.Run("CheckpointKeptAcrossLeaseTakeover", func(t *testing.T) {
		t.Parallel()
		b, ts := txSetup(t)
		p := b.params(b.id)
		p.LeaseExpiredState = idemstore.StateReleased
		b.reserveNew(t, p)
		checkpoint(t, b, ts, p.Token, "charged")
		b.clock.Advance(testLease + time.Second)
		r := b.reserveNew(t, b.params(b.id))
		if r.RecoveryPoint != "charged" || r.Attempts != 2 {
			t.Fatalf("taken-over record: recovery point %q attempts %d, want charged and 2", r.RecoveryPoint, r.Attempts)
		}
	})

	t.Run("CheckpointRollsBack", func(t *testing.T) {
		t.Parallel()
		b, ts := txSetup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		checkpoint(t, b, ts, p.Token, "first")
		before := b.get(t, b.id)
		tx := begin(t, b, ts)
		if err := tx.KeyCheckpoint(b.ctx, &idemstore.CheckpointParams{Identity: b.id, Token: p.Token, RecoveryPoint: "second"}); err != nil {
			t.Fatalf("KeyCheckpoint: %v", err)
		}
		rollback(t, b, tx)
		requireSameRecord(t, "record after a rolled-back checkpoint", b.get(t, b.id), before)
	})

	t.Run("CheckpointOnlyInProgress", func(t *testing.T) {
		t.Parallel()
		b, ts := txSetup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		try := func(what, token string) {
			t.Helper()
			tx := begin(t, b, ts)
			err := tx.KeyCheckpoint(b.ctx, &idemstore.CheckpointParams{Identity: b.id, Token: token, RecoveryPoint: "x"})
			requireErr(t, what, err, idemstore.ErrLeaseLost)
			rollback(t, b, tx)
		}
		try("KeyCheckpoint with another token", b.token())
		b.markUnknown(t, b.id, p.Token)
		try("KeyCheckpoint of an unknown record", p.Token)
		b.complete(t, b.id, p.Token, sampleResponse())
		try("KeyCheckpoint of a completed record", p.Token)
		if rp := b.get(t, b.id).RecoveryPoint; rp != "" {
			t.Fatalf("recovery point = %q after refused checkpoints, want empty", rp)
		}
	})
}
