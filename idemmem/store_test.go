package idemmem_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

func TestStore(t *testing.T) {
	t.Parallel()
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return idemmem.New(&idemmem.Config{Now: clock.Now})
	})
}

// TestStoreKeepsHandedOutRecords runs the suite again, failing if the
// store changes a record after KeyReserve handed it out: it shares a
// completed record with every replay, so it must replace records, never
// change them in place.
func TestStoreKeepsHandedOutRecords(t *testing.T) {
	t.Parallel()
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return idemtest.CheckReserveResults(t, idemmem.New(&idemmem.Config{Now: clock.Now}))
	})
}

func TestNewDefaults(t *testing.T) {
	t.Parallel()
	s := idemmem.New(nil)
	before := time.Now()
	res, err := s.KeyReserve(t.Context(), &idemstore.ReserveParams{
		Identity: idemstore.Identity{Key: "k"}, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour,
	})
	if err != nil || !res.Reserved {
		t.Fatalf("KeyReserve = %+v, %v", res, err)
	}
	if res.Record.CreatedAt.Before(before) || res.Record.CreatedAt.After(time.Now()) {
		t.Fatalf("CreatedAt %v is not from time.Now", res.Record.CreatedAt)
	}
	if res.Record.LeaseExpiredState != idemstore.StateUnknown {
		t.Fatalf("LeaseExpiredState = %q, want unknown by default", res.Record.LeaseExpiredState)
	}
}

func TestKeyWait(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		change func(t *testing.T, s *idemmem.Store, clock *idemtest.Clock, id idemstore.Identity, token string) error
	}{
		{"Complete", func(t *testing.T, s *idemmem.Store, _ *idemtest.Clock, id idemstore.Identity, token string) error {
			return s.KeyComplete(t.Context(), &idemstore.CompleteParams{Identity: id, Token: token, Response: &idemstore.Response{Status: http.StatusOK}})
		}},
		{"Release", func(t *testing.T, s *idemmem.Store, _ *idemtest.Clock, id idemstore.Identity, token string) error {
			return s.KeyRelease(t.Context(), &idemstore.FinishParams{Identity: id, Token: token})
		}},
		{"MarkUnknown", func(t *testing.T, s *idemmem.Store, _ *idemtest.Clock, id idemstore.Identity, token string) error {
			return s.KeyMarkUnknown(t.Context(), &idemstore.FinishParams{Identity: id, Token: token})
		}},
		{"Delete", func(t *testing.T, s *idemmem.Store, _ *idemtest.Clock, id idemstore.Identity, token string) error {
			return s.KeyDelete(t.Context(), &idemstore.FinishParams{Identity: id, Token: token})
		}},
		{"Sweep", func(t *testing.T, s *idemmem.Store, clock *idemtest.Clock, _ idemstore.Identity, _ string) error {
			clock.Advance(time.Minute)
			_, err := s.KeySweep(t.Context(), &idemstore.SweepParams{})
			return err
		}},
		{"Reap", func(t *testing.T, s *idemmem.Store, clock *idemtest.Clock, _ idemstore.Identity, _ string) error {
			clock.Advance(time.Hour)
			_, err := s.KeyReap(t.Context(), &idemstore.ReapParams{})
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			clock := idemtest.NewClock(time.Now())
			s := idemmem.New(&idemmem.Config{Now: clock.Now})
			id := idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "k"}
			bystander := idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "bystander"}
			// The bystander outlives every change below.
			for rid, ttl := range map[idemstore.Identity]time.Duration{id: time.Hour, bystander: 3 * time.Hour} {
				res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
					Identity: rid, Fingerprint: "f", Token: "t1", Lease: time.Minute, TTL: ttl,
					// Released on expiry, so that the reaper may delete
					// it (an unknown record is never reaped).
					LeaseExpiredState: idemstore.StateReleased,
				})
				if err != nil || !res.Reserved {
					t.Fatalf("KeyReserve = %+v, %v", res, err)
				}
			}
			if err := s.KeyRenew(ctx, &idemstore.RenewParams{Identity: bystander, Token: "t1", Lease: 2 * time.Hour}); err != nil {
				t.Fatal(err)
			}

			const waiters = 5
			done := make(chan error, waiters+1)
			for range waiters {
				go func() { done <- s.KeyWait(ctx, id) }()
			}
			bctx, cancel := context.WithCancel(ctx)
			defer cancel()
			bystanderDone := make(chan error, 1)
			go func() { bystanderDone <- s.KeyWait(bctx, bystander) }()
			deadline := time.Now().Add(10 * time.Second)
			for idemmem.Parked(s, id) < waiters || idemmem.Parked(s, bystander) < 1 {
				if time.Now().After(deadline) {
					t.Fatal("waiters did not park")
				}
				time.Sleep(time.Millisecond)
			}

			// A renewal is no change worth waking for.
			if err := s.KeyRenew(ctx, &idemstore.RenewParams{Identity: id, Token: "t1", Lease: time.Minute}); err != nil {
				t.Fatal(err)
			}
			if n := idemmem.Parked(s, id); n != waiters {
				t.Fatalf("%d waiters parked after a renewal, want %d", n, waiters)
			}

			if err := tt.change(t, s, clock, id, "t1"); err != nil {
				t.Fatalf("change: %v", err)
			}
			for range waiters {
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("KeyWait = %v, want nil", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("KeyWait did not return after the record changed")
				}
			}
			if n := idemmem.Parked(s, bystander); n != 1 {
				t.Fatalf("a change of another record woke its waiter (%d parked)", n)
			}
			cancel()
			if err := <-bystanderDone; !errors.Is(err, context.Canceled) {
				t.Fatalf("bystander KeyWait = %v, want context.Canceled", err)
			}
			if n := idemmem.Parked(s, bystander); n != 0 {
				t.Fatalf("%d waiters parked after cancellation, want 0", n)
			}
		})
	}
}

func TestKeyWaitReturnsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemtest.NewClock(time.Now())
	s := idemmem.New(&idemmem.Config{Now: clock.Now})
	id := idemstore.Identity{Key: "k"}
	if err := s.KeyWait(ctx, id); err != nil {
		t.Fatalf("KeyWait on a missing record = %v", err)
	}
	res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour})
	if err != nil || !res.Reserved {
		t.Fatalf("KeyReserve = %+v, %v", res, err)
	}
	// An expired lease is no longer in progress.
	clock.Advance(time.Minute)
	if err := s.KeyWait(ctx, id); err != nil {
		t.Fatalf("KeyWait on an expired lease = %v", err)
	}
	if err := s.KeyMarkUnknown(ctx, &idemstore.FinishParams{Identity: id, Token: "t"}); err != nil {
		t.Fatal(err)
	}
	if err := s.KeyWait(ctx, id); err != nil {
		t.Fatalf("KeyWait on an unknown record = %v", err)
	}
	if n := idemmem.Parked(s, id); n != 0 {
		t.Fatalf("%d waiters parked, want 0", n)
	}
}

func TestKeyWaitCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	s := idemmem.New(nil)
	id := idemstore.Identity{Key: "k"}
	res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour})
	if err != nil || !res.Reserved {
		t.Fatalf("KeyReserve = %+v, %v", res, err)
	}
	done := make(chan error, 1)
	go func() { done <- s.KeyWait(ctx, id) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("KeyWait = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("KeyWait did not return after its context was canceled")
	}
}

// Records whose stored headers are equal share one header map (the store
// keeps a record read-only), and what a caller does with the maps it handed
// in or was handed back never reaches a stored record.
func TestStoredHeadersShared(t *testing.T) {
	t.Parallel()
	s := idemmem.New(nil)
	ctx := t.Context()
	complete := func(key string, h http.Header) *idemstore.Record {
		t.Helper()
		id := idemstore.Identity{Endpoint: "POST /v1/payments", Key: key}
		if _, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: key, Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: key,
			Response: &idemstore.Response{Status: 201, Header: h, Body: []byte("{}")}}); err != nil {
			t.Fatal(err)
		}
		res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "other", Lease: time.Minute, TTL: time.Hour})
		if err != nil || res.Reserved {
			t.Fatalf("replay of %s: %+v, %v", key, res, err)
		}
		return res.Record
	}
	json := func() http.Header { return http.Header{"Content-Type": {"application/json"}} }
	a, b := complete("a", json()), complete("b", json())
	other := complete("c", http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/1"}})
	split := complete("d", http.Header{"Content-Type": {"application/", "json"}})
	same := func(x, y http.Header) bool {
		return reflect.ValueOf(x).UnsafePointer() == reflect.ValueOf(y).UnsafePointer()
	}
	if !same(a.Response.Header, b.Response.Header) {
		t.Error("equal headers are kept as two maps")
	}
	if same(a.Response.Header, other.Response.Header) || same(a.Response.Header, split.Response.Header) {
		t.Error("different headers share a map")
	}

	// The caller's map is copied, not kept.
	h := json()
	e := complete("e", h)
	h.Set("Content-Type", "text/plain")
	h.Set("X-Changed", "1")
	if got := e.Response.Header; got.Get("Content-Type") != "application/json" || len(got) != 1 {
		t.Errorf("stored header followed the caller's map: %v", got)
	}
	// A KeyGet copy is the caller's to change.
	got, err := s.KeyGet(ctx, idemstore.Identity{Endpoint: "POST /v1/payments", Key: "a"})
	if err != nil {
		t.Fatal(err)
	}
	got.Response.Header.Set("Content-Type", "text/plain")
	if b.Response.Header.Get("Content-Type") != "application/json" {
		t.Error("changing a KeyGet copy changed a stored record")
	}
}
