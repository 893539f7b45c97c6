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

// TestRotateUpgradesV1: a response sealed in format v1 under the sealing
// key itself is rewritten in the current format, and opens after.
func TestRotateUpgradesV1(t *testing.T) {
	t.Parallel()
	kr, err := idemcrypt.NewKeyring(legacyKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	store := idemmem.New(nil)
	p := &idemstore.ReserveParams{Identity: legacyID, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour}
	if _, err := store.KeyReserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := store.KeyComplete(ctx, &idemstore.CompleteParams{Identity: legacyID, Token: "t", Response: legacyResponse(t)}); err != nil {
		t.Fatal(err)
	}
	prog, err := idemcrypt.Rotate(ctx, store, kr, nil)
	if err != nil || prog.Resealed != 1 {
		t.Fatalf("Rotate = %+v, %v; want 1 resealed", prog, err)
	}
	raw, err := store.KeyGet(ctx, legacyID)
	if err != nil {
		t.Fatal(err)
	}
	if v := raw.Response.Sealed; v != "v2 legacy" {
		t.Fatalf("after rotation the record is sealed %q, want v2 legacy", v)
	}
	got, err := idemcrypt.New(store, kr).KeyGet(ctx, legacyID)
	if err != nil || string(got.Response.Body) != `{"id":"pay_1","card":"4242"}` {
		t.Fatalf("KeyGet after rotation = %+v, %v", got, err)
	}
	if again, err := idemcrypt.Rotate(ctx, store, kr, nil); err != nil || again.Current != 1 || again.Resealed != 0 {
		t.Fatalf("second Rotate = %+v, %v; want 1 current", again, err)
	}
}

// TestRequired: with Config.Required a response stored in the clear, or
// sealed in format v1, is refused by the reads that replay (ErrNotSealed);
// a v2 one opens.
func TestRequired(t *testing.T) {
	t.Parallel()
	kr, err := idemcrypt.NewKeyring(legacyKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	raw := idemmem.New(nil)
	complete := func(s idemstore.Store, id idemstore.Identity, resp *idemstore.Response) {
		t.Helper()
		p := &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t-" + id.Key, Lease: time.Minute, TTL: time.Hour}
		if _, err := s.KeyReserve(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: p.Token, Response: resp}); err != nil {
			t.Fatal(err)
		}
	}
	plainID := idemstore.Identity{Endpoint: "POST /v1/payments", Key: "plain"}
	complete(raw, plainID, &idemstore.Response{Status: 201, Body: []byte("planted")})
	complete(raw, legacyID, legacyResponse(t))
	sealedID := idemstore.Identity{Endpoint: "POST /v1/payments", Key: "sealed"}
	complete(idemcrypt.New(raw, kr), sealedID, &idemstore.Response{Status: 201, Body: []byte("ok")})

	req := idemcrypt.NewWithConfig(raw, &idemcrypt.Config{Keyring: kr, Required: true})
	for _, id := range []idemstore.Identity{plainID, legacyID} {
		if r, err := req.KeyGet(ctx, id); !errors.Is(err, idemcrypt.ErrNotSealed) {
			t.Fatalf("%s: KeyGet = %+v, %v; want ErrNotSealed", id.Key, r, err)
		}
		p := &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "other", Lease: time.Minute, TTL: time.Hour}
		if r, err := req.KeyReserve(ctx, p); !errors.Is(err, idemcrypt.ErrNotSealed) {
			t.Fatalf("%s: KeyReserve = %+v, %v; want ErrNotSealed", id.Key, r, err)
		}
	}
	if r, err := req.KeyGet(ctx, sealedID); err != nil || string(r.Response.Body) != "ok" {
		t.Fatalf("sealed: KeyGet = %+v, %v", r, err)
	}
	// Without Required both still open (the default).
	for _, id := range []idemstore.Identity{plainID, legacyID} {
		if _, err := idemcrypt.New(raw, kr).KeyGet(ctx, id); err != nil {
			t.Fatalf("%s without Required: %v", id.Key, err)
		}
	}
	// A list shows them all, the refused ones as stored.
	recs, err := req.KeyList(ctx, &idemstore.ListParams{})
	if err != nil || len(recs) != 3 {
		t.Fatalf("KeyList = %d records, %v; want 3", len(recs), err)
	}
	for _, r := range recs {
		if r.Identity == legacyID && r.Response.Sealed != "v1 legacy" {
			t.Fatalf("KeyList changed the refused v1 record: %+v", r.Response)
		}
	}
}
