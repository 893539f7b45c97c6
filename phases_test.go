package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// chargeThenRecord is a two-phase operation: "charged" makes the external
// call (counted in charges) and stores the derived key it carried;
// "recorded" writes the ledger entry of the call, after block when it is
// not nil, and fails when fail says so. Whatever the handler writes after
// the phases (the receipt) commits with the completion.
func chargeThenRecord(charges *atomic.Int64, block func(call int64), fail func(call int64) bool) func(w http.ResponseWriter, r *http.Request, call int64) {
	return func(w http.ResponseWriter, r *http.Request, call int64) {
		from := idem.RecoveryPoint(r.Context())
		err := idem.RunPhases(r.Context(),
			idem.Phase{Name: "charged", Run: func(ctx context.Context, tx idemstore.Tx) error {
				charges.Add(1)
				return phaseTx(tx).Put("charge", idem.DerivedKeyFromContext(ctx, "charge"))
			}},
			idem.Phase{Name: "recorded", Run: func(ctx context.Context, tx idemstore.Tx) error {
				if block != nil {
					block(call)
				}
				if err := phaseTx(tx).Put("ledger", fmt.Sprint(call)); err != nil {
					return err
				}
				if fail != nil && fail(call) {
					return errors.New("ledger unavailable")
				}
				return nil
			}},
		)
		if err != nil {
			http.Error(w, "phase failed", http.StatusBadGateway)
			return
		}
		if err := put(r, "receipt", fmt.Sprint(call)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "call %d resumed from %q with %s", call, from, idem.DerivedKeyFromContext(r.Context(), "charge"))
	}
}

// A phase that fails releases the key with the recovery point of the last
// committed phase; the retry resumes there, never repeats the external
// call, and carries the same derived key.
func TestPhasesResumeAfterFailure(t *testing.T) {
	t.Parallel()
	var charges atomic.Int64
	b := txSetup(t, nil, nil, chargeThenRecord(&charges, nil, func(call int64) bool { return call == 1 }))

	if w := b.do(t, "key-one", "{}"); w.Code != http.StatusBadGateway {
		t.Fatalf("first attempt %d %s, want 502", w.Code, w.Body)
	}
	rec := b.record(t)
	if rec == nil || rec.State != idemstore.StateReleased || rec.RecoveryPoint != "charged" {
		t.Fatalf("record after the failed phase %+v, want released at recovery point charged", rec)
	}
	charge := b.store.Values()["charge"]
	if charge == "" {
		t.Fatal("the committed phase's write was rolled back")
	}
	b.requireValues(t, map[string]string{"charge": charge})

	w := b.do(t, "key-one", "{}")
	if want := fmt.Sprintf("call 2 resumed from %q with %s", "charged", charge); w.Code != http.StatusCreated || w.Body.String() != want {
		t.Fatalf("retry %d %q, want 201 %q", w.Code, w.Body, want)
	}
	if charges.Load() != 1 {
		t.Fatalf("%d external calls, want 1", charges.Load())
	}
	b.requireValues(t, map[string]string{"charge": charge, "ledger": "2", "receipt": "2"})
	rec = b.record(t)
	if rec == nil || rec.State != idemstore.StateCompleted || rec.RecoveryPoint != "recorded" || rec.Attempts != 2 {
		t.Fatalf("record after the retry %+v, want completed at recovery point recorded after 2 attempts", rec)
	}
	if r := b.do(t, "key-one", "{}"); r.Body.String() != w.Body.String() || r.Header().Get(idem.HeaderReplayed) != "true" || b.calls.Load() != 2 {
		t.Fatalf("replay %d %q after %d executions", r.Code, r.Body, b.calls.Load())
	}
}

// An attempt that stalls after its first phase (a crashed process, as far
// as the store can tell) loses its lease; the retry takes the key over,
// resumes after the committed phase and completes, and the stale attempt
// can commit nothing when it wakes.
func TestPhasesResumeAfterExpiredLease(t *testing.T) {
	t.Parallel()
	var charges atomic.Int64
	stalled, wake := make(chan struct{}), make(chan struct{})
	// Stalled: its heartbeat does not reach the store either, so moving the
	// clock lets the lease lapse instead of renewing it.
	b := txSetup(t, nil, &txFaults{renew: errOutage}, chargeThenRecord(&charges, func(call int64) {
		if call == 1 {
			close(stalled)
			<-wake
		}
	}, nil))

	stale := make(chan *httptest.ResponseRecorder)
	go func() { stale <- b.do(t, "key-one", "{}") }()
	<-stalled
	if rec := b.record(t); rec == nil || rec.State != idemstore.StateInProgress || rec.RecoveryPoint != "charged" {
		t.Fatalf("record of the stalled attempt %+v, want in progress at recovery point charged", rec)
	}
	if w := b.do(t, "key-one", "{}"); w.Code != http.StatusConflict {
		t.Fatalf("retry within the lease %d %s, want 409", w.Code, w.Body)
	}

	b.clock.Advance(txLease + time.Second)
	w := b.do(t, "key-one", "{}")
	if w.Code != http.StatusCreated || !strings.HasPrefix(w.Body.String(), `call 2 resumed from "charged"`) {
		t.Fatalf("retry after the lease %d %q, want 201 resumed from charged", w.Code, w.Body)
	}
	close(wake)
	if s := <-stale; s.Code != http.StatusBadGateway {
		t.Fatalf("the stale attempt answered %d %s, want 502 (its phase lost the lease)", s.Code, s.Body)
	}

	if charges.Load() != 1 {
		t.Fatalf("%d external calls, want 1", charges.Load())
	}
	b.requireValues(t, map[string]string{"charge": b.store.Values()["charge"], "ledger": "2", "receipt": "2"})
	rec := b.record(t)
	if rec == nil || rec.State != idemstore.StateCompleted || rec.RecoveryPoint != "recorded" || rec.Attempts != 2 {
		t.Fatalf("record %+v, want completed at recovery point recorded after 2 attempts", rec)
	}
	if r := b.do(t, "key-one", "{}"); r.Body.String() != w.Body.String() || r.Header().Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("replay %d %q, want the resumed attempt's answer", r.Code, r.Body)
	}
}

func TestPhasesErrors(t *testing.T) {
	t.Parallel()
	ok := func(context.Context, idemstore.Tx) error { return nil }
	errDisk := errors.New("disk full")

	t.Run("outside transactional mode", func(t *testing.T) {
		t.Parallel()
		if err := idem.RunPhases(context.Background(), idem.Phase{Name: "a", Run: ok}); !errors.Is(err, idem.ErrNotTransactional) {
			t.Fatalf("RunPhases outside a request = %v, want ErrNotTransactional", err)
		}
		if rp := idem.RecoveryPoint(context.Background()); rp != "" {
			t.Fatalf("RecoveryPoint outside a request = %q", rp)
		}
		var err error
		b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
			err = idem.RunPhases(r.Context(), idem.Phase{Name: "a", Run: ok})
			w.WriteHeader(http.StatusCreated)
		})
		b.do(t, "POST", "key-one", "{}")
		if !errors.Is(err, idem.ErrNotTransactional) {
			t.Fatalf("RunPhases without Config.Transactional = %v, want ErrNotTransactional", err)
		}
	})

	t.Run("recovery point not among the phases", func(t *testing.T) {
		t.Parallel()
		var err error
		b := txSetup(t, nil, nil, func(w http.ResponseWriter, r *http.Request, call int64) {
			if call == 1 {
				err = idem.RunPhases(r.Context(), idem.Phase{Name: "a", Run: ok}, idem.Phase{Name: "b", Run: func(context.Context, idemstore.Tx) error {
					return errDisk
				}})
			} else {
				err = idem.RunPhases(r.Context(), idem.Phase{Name: "renamed", Run: ok})
			}
			w.WriteHeader(http.StatusInternalServerError)
		})
		b.do(t, "key-one", "{}")
		if !errors.Is(err, errDisk) {
			t.Fatalf("RunPhases = %v, want the phase's own error", err)
		}
		b.do(t, "key-one", "{}")
		if err == nil || !strings.Contains(err.Error(), `recovery point "a" is not one of the phases`) {
			t.Fatalf("RunPhases with a stale recovery point = %v", err)
		}
	})

	for _, tc := range []struct {
		name   string
		faults txFaults
		msg    string
	}{
		{"begin fails", txFaults{begin: errDisk}, `beginning phase "a"`},
		{"commit fails", txFaults{commit: errDisk}, `committing phase "a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var err error
			b := txSetup(t, nil, &tc.faults, func(w http.ResponseWriter, r *http.Request, call int64) {
				err = idem.RunPhases(r.Context(), idem.Phase{Name: "a", Run: func(_ context.Context, tx idemstore.Tx) error {
					return phaseTx(tx).Put("a", "done")
				}})
				w.WriteHeader(http.StatusServiceUnavailable)
			})
			b.do(t, "key-one", "{}")
			if !errors.Is(err, errDisk) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("RunPhases = %v, want %s: disk full", err, tc.msg)
			}
			b.requireValues(t, map[string]string{})
			if rec := b.record(t); rec == nil || rec.State != idemstore.StateReleased || rec.RecoveryPoint != "" {
				t.Fatalf("record %+v, want released with no recovery point", rec)
			}
		})
	}
}
