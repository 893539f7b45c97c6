package idemcrypt_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// TestForwardsReconcileState: the wrapper forwards the purge, the reconcile
// claims and failures and the backlog with the wrapped store's semantics.
// (The conformance suite's encryption tests wrap the store themselves, so it
// runs on the raw stores.)
func TestForwardsReconcileState(t *testing.T) {
	t.Parallel()
	kr, err := idemcrypt.NewKeyring(idemcrypt.Key{Name: "k1", Secret: bytes.Repeat([]byte{7}, idemcrypt.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	s := idemcrypt.New(idemmem.New(nil), kr)
	id := idemstore.Identity{Endpoint: "POST /x", Key: "k"}
	if _, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.KeyMarkUnknown(ctx, &idemstore.FinishParams{Identity: id, Token: "t"}); err != nil {
		t.Fatal(err)
	}
	if b, err := s.KeyBacklog(ctx); err != nil || b.Unknown != 1 {
		t.Fatalf("KeyBacklog = %+v, %v; want 1", b, err)
	}
	recs, err := s.KeyReconcileClaim(ctx, &idemstore.ReconcileClaimParams{Hold: time.Minute})
	if err != nil || len(recs) != 1 || recs[0].Identity != id {
		t.Fatalf("KeyReconcileClaim = %v, %v", recs, err)
	}
	if err := s.KeyReconcileFail(ctx, &idemstore.ReconcileFailParams{Identity: id, Token: "t", Error: "no", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.KeyGet(ctx, id); err != nil || r.ReconcileAttempts != 1 || r.ReconcileError != "no" {
		t.Fatalf("KeyGet = %+v, %v", r, err)
	}
	if _, err := s.KeyPurge(ctx, &idemstore.PurgeParams{Identity: id}); !errors.Is(err, idemstore.ErrInvalidState) {
		t.Fatalf("KeyPurge without force = %v, want ErrInvalidState", err)
	}
	if r, err := s.KeyPurge(ctx, &idemstore.PurgeParams{Identity: id, Force: true}); err != nil || r.State != idemstore.StateUnknown {
		t.Fatalf("KeyPurge(force) = %+v, %v", r, err)
	}
	if _, err := s.KeyGet(ctx, id); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("KeyGet after purge = %v, want ErrNotFound", err)
	}
}
