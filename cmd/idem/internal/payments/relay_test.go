package payments

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/provider"
	"github.com/idem-dev/idem/outbox"
)

// message returns the outbox row of a payment.
func (b *bundle) message(t *testing.T, paymentID string) *outbox.Message {
	t.Helper()
	p, err := b.svc.db.repo.byID(b.ctx, paymentID)
	if err != nil {
		t.Fatalf("reading payment: %v", err)
	}
	m, err := b.svc.db.outbox.MessageGet(b.ctx, p.outboxID)
	if err != nil {
		t.Fatalf("reading the outbox row: %v", err)
	}
	return m
}

// providerKey returns the key the payment is charged with.
func (b *bundle) providerKey(t *testing.T, paymentID string) string {
	t.Helper()
	p, err := b.svc.db.repo.byID(b.ctx, paymentID)
	if err != nil {
		t.Fatalf("reading payment: %v", err)
	}
	return p.providerKey
}

// oneChargeFor checks that the ledger has exactly one charge, made with the
// payment's key and amount, and returns it.
func (b *bundle) oneChargeFor(t *testing.T, p *Payment) provider.Charge {
	t.Helper()
	cs := b.charges(t)
	if len(cs) != 1 {
		t.Fatalf("the ledger has %d charges, want 1: %+v", len(cs), cs)
	}
	c := cs[0]
	if c.IdempotencyKey != b.providerKey(t, p.ID) || c.AmountCents != p.AmountCents || c.Reference != p.ID {
		t.Errorf("charge %+v does not match payment %+v", c, p)
	}
	return c
}

func TestRelayChargesOnce(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{}, nil)
		p := b.mustCreate(t, "relay-1", 2500)
		if len(b.charges(t)) != 0 {
			t.Fatal("the request charged the provider itself")
		}
		b.relayOnce(t, 1)
		got := b.status(t, p.ID)
		c := b.oneChargeFor(t, p)
		if got.Status != StatusSucceeded || got.ChargeID != c.ID {
			t.Errorf("payment %+v, want succeeded with charge %s", got, c.ID)
		}
		if m := b.message(t, p.ID); m.State != outbox.StateDone {
			t.Errorf("outbox row %s, want done", m.State)
		}
		b.relayOnce(t, 0)
		// The replay of the create answer still says pending: it is the
		// answer as it was; GET shows the present.
		a := b.create(t, "relay-1", `{"customer_id":"cus_1","amount_cents":2500,"currency":"EUR"}`)
		if a.header.Get("Idempotent-Replayed") != "true" || a.payment(t).Status != StatusPending {
			t.Errorf("replay: %s", a.body)
		}
		b.oneChargeFor(t, p)
	})
}

func TestProviderFailureRetriesThenFails(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{FailRate: 1}, nil) // MaxAttempts 3, backoff 1s..4s
		p := b.mustCreate(t, "fail-1", 700)
		for attempt := 1; attempt <= 3; attempt++ {
			b.relayOnce(t, 1)
			m := b.message(t, p.ID)
			if m.Attempts != attempt {
				t.Fatalf("attempt %d: the row counts %d attempts", attempt, m.Attempts)
			}
			if attempt < 3 {
				if m.State != outbox.StatePending || b.status(t, p.ID).Status != StatusPending {
					t.Fatalf("attempt %d: row %s, payment %s; want both pending", attempt, m.State, b.status(t, p.ID).Status)
				}
				// Exponential backoff with jitter: due after now, within the cap.
				limit := time.Second << (attempt - 1)
				now := b.clock.Now()
				if !m.AvailableAt.After(now) || m.AvailableAt.After(now.Add(limit)) {
					t.Errorf("attempt %d: due at %v, want in (now, now+%v]", attempt, m.AvailableAt.Sub(now), limit)
				}
				b.relayOnce(t, 0) // not due yet
				b.clock.Advance(limit)
			}
		}
		m := b.message(t, p.ID)
		got := b.status(t, p.ID)
		if m.State != outbox.StateDead {
			t.Errorf("row %s after the last attempt, want dead", m.State)
		}
		if got.Status != StatusFailed || got.FailureReason == "" {
			t.Errorf("payment %+v, want failed with a reason", got)
		}
		if n := len(b.charges(t)); n != 0 {
			t.Errorf("the ledger has %d charges, want 0", n)
		}
		// The reconciler leaves a failed payment alone.
		if res, err := b.svc.ReconcileOnce(b.ctx); err != nil || res.Checked != 0 {
			t.Errorf("ReconcileOnce = %+v, %v; want nothing checked", res, err)
		}
	})
}

func TestTimeoutIsReconciledToOneCharge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		faults provider.Faults
	}{
		{"dropped connection", provider.Faults{TimeoutRate: 1, DropConnection: true}},
		{"timeout", provider.Faults{TimeoutRate: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stores(t, func(t *testing.T, store string) {
				b := setup(t, store, tc.faults, func(c *Config) { c.DeliverTimeout = 300 * time.Millisecond })
				p := b.mustCreate(t, "timeout-1", 4200)
				b.relayOnce(t, 1)
				if got := b.status(t, p.ID); got.Status != StatusRequiresReconciliation {
					t.Fatalf("payment %s after a lost answer, want requires_reconciliation", got.Status)
				}
				c := b.oneChargeFor(t, p) // the provider did charge

				res, err := b.svc.ReconcileOnce(b.ctx)
				if err != nil || res.Checked != 1 || res.Succeeded != 1 {
					t.Fatalf("ReconcileOnce = %+v, %v; want one succeeded", res, err)
				}
				got := b.status(t, p.ID)
				if got.Status != StatusSucceeded || got.ChargeID != c.ID {
					t.Errorf("payment %+v, want succeeded with charge %s", got, c.ID)
				}
				// The relay's retry finds the payment settled and charges nothing.
				b.prov.SetFaults(provider.Faults{})
				b.clock.Advance(time.Minute)
				b.relayOnce(t, 1)
				if m := b.message(t, p.ID); m.State != outbox.StateDone {
					t.Errorf("outbox row %s, want done", m.State)
				}
				b.oneChargeFor(t, p)
			})
		})
	}
}

func TestRetryAfterUnknownAsksBeforeCharging(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{TimeoutRate: 1, DropConnection: true}, nil)
		p := b.mustCreate(t, "ask-first", 900)
		b.relayOnce(t, 1)
		// The provider now fails every charge before charging: a retry that
		// sent the charge blindly would be refused; the relay asks first
		// and finds the earlier charge.
		b.prov.SetFaults(provider.Faults{FailRate: 1})
		b.clock.Advance(time.Minute)
		b.relayOnce(t, 1)
		got := b.status(t, p.ID)
		c := b.oneChargeFor(t, p)
		if got.Status != StatusSucceeded || got.ChargeID != c.ID {
			t.Errorf("payment %+v, want succeeded with charge %s", got, c.ID)
		}
		if m := b.message(t, p.ID); m.State != outbox.StateDone || m.Attempts != 2 {
			t.Errorf("outbox row %s after %d attempts, want done after 2", m.State, m.Attempts)
		}
	})
}

func TestUnknownWithoutChargeFailsAfterSettling(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		// The provider takes longer than the relay waits, and charges
		// nothing for a client that gave up: an unknown outcome with no
		// charge behind it.
		b := setup(t, store, provider.Faults{Latency: time.Minute}, func(c *Config) {
			c.DeliverTimeout = 200 * time.Millisecond
			c.MaxAttempts = 1
		})
		p := b.mustCreate(t, "never-charged", 300)
		b.relayOnce(t, 1)
		if got := b.status(t, p.ID); got.Status != StatusRequiresReconciliation {
			t.Fatalf("payment %s, want requires_reconciliation", got.Status)
		}
		if m := b.message(t, p.ID); m.State != outbox.StateDead {
			t.Fatalf("outbox row %s after the only attempt, want dead", m.State)
		}
		// Right after the attempt, "no charge" proves nothing yet.
		res, err := b.svc.ReconcileOnce(b.ctx)
		if err != nil || res.Unresolved != 1 || res.Failed != 0 {
			t.Fatalf("early ReconcileOnce = %+v, %v; want one unresolved", res, err)
		}
		if res, _ := b.svc.ReconcileOnce(b.ctx); res.Checked != 0 {
			t.Errorf("the deferred payment was checked again at once: %+v", res)
		}
		b.clock.Advance(time.Minute) // SettleAfter
		res, err = b.svc.ReconcileOnce(b.ctx)
		if err != nil || res.Failed != 1 {
			t.Fatalf("ReconcileOnce = %+v, %v; want one failed", res, err)
		}
		if got := b.status(t, p.ID); got.Status != StatusFailed {
			t.Errorf("payment %s, want failed", got.Status)
		}
		if n := len(b.charges(t)); n != 0 {
			t.Errorf("the ledger has %d charges, want 0", n)
		}
	})
}

func TestReconcilerWaitsForAnUnreachableProvider(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite:"+t.TempDir()+"/p.db", provider.Faults{TimeoutRate: 1, DropConnection: true}, nil)
	p := b.mustCreate(t, "unreachable", 300)
	b.relayOnce(t, 1)
	b.svc.provider.base = "http://127.0.0.1:1" // nothing listens there
	res, err := b.svc.ReconcileOnce(b.ctx)
	if err != nil || res.Unresolved != 1 {
		t.Fatalf("ReconcileOnce = %+v, %v; want one unresolved", res, err)
	}
	if got := b.status(t, p.ID); got.Status != StatusRequiresReconciliation {
		t.Errorf("payment %s, want still requires_reconciliation", got.Status)
	}
	b.svc.provider.base = b.prov.URL()
	b.clock.Advance(DefaultReconcileInterval)
	if res, err := b.svc.ReconcileOnce(b.ctx); err != nil || res.Succeeded != 1 {
		t.Fatalf("ReconcileOnce = %+v, %v; want one succeeded", res, err)
	}
	b.oneChargeFor(t, p)
}

func TestCrashPointsAreCalled(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var points []CrashPoint
	b := setup(t, "sqlite:"+t.TempDir()+"/p.db", provider.Faults{}, func(c *Config) {
		c.Crash = func(p CrashPoint) {
			mu.Lock()
			defer mu.Unlock()
			points = append(points, p)
		}
	})
	b.mustCreate(t, "crash-1", 100)
	b.create(t, "crash-1", `{"customer_id":"cus_1","amount_cents":100,"currency":"EUR"}`) // a replay passes none
	b.relayOnce(t, 1)
	mu.Lock()
	defer mu.Unlock()
	want := []CrashPoint{CrashAfterReserve, CrashAfterCommit, CrashAfterCharge}
	if !slices.Equal(points, want) {
		t.Errorf("crash points %v, want %v", points, want)
	}
}

func TestRelaysDeliverConcurrentPaymentsOnce(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		// 24 writers at once on SQLite's one write lock, under -race and
		// beside every other package's tests: a reservation may wait longer
		// than the 2 s default for the lock, and this test is about
		// charging once, not about that bound.
		b := setup(t, store, provider.Faults{}, func(c *Config) { c.RelayWorkers = 3; c.StoreTimeout = 20 * time.Second })
		const n = 12
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				// Every payment is posted twice at once.
				for range 2 {
					key := "concurrent-" + string(rune('a'+i))
					a := b.create(t, key, `{"customer_id":"cus_1","amount_cents":100,"currency":"EUR"}`)
					if a.status != http.StatusCreated && a.status != http.StatusConflict {
						t.Errorf("create: status %d, body %s", a.status, a.body)
					}
				}
			})
		}
		wg.Wait()
		for _, r := range b.svc.relays {
			wg.Go(func() {
				if _, err := r.RunOnce(b.ctx); err != nil {
					t.Errorf("RunOnce: %v", err)
				}
			})
		}
		wg.Wait()
		if c := len(b.charges(t)); c != n {
			t.Errorf("the ledger has %d charges, want %d", c, n)
		}
		if c := b.count(t, "payments"); c != n {
			t.Errorf("%d payments, want %d", c, n)
		}
	})
}

// TestKeyInUseAtTheLastAttemptIsNotAFailure: when the provider still runs an
// earlier attempt (409 key-in-use) on the last allowed attempt, that charge
// may yet commit, so the payment must go to reconciliation, never to failed.
func TestKeyInUseAtTheLastAttemptIsNotAFailure(t *testing.T) {
	t.Parallel()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // the lookup cannot see the charge in flight
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"type":"about:blank","title":"no charge","status":404,"code":"no-charge"}`)
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"type":"about:blank","title":"in progress","status":409,"code":"key-in-use"}`)
	}))
	t.Cleanup(busy.Close)
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{}, func(c *Config) { c.ProviderURL = busy.URL; c.MaxAttempts = 1 })
		p := b.mustCreate(t, "busy-1", 700)
		b.relayOnce(t, 1)
		if got := b.status(t, p.ID); got.Status != StatusRequiresReconciliation {
			t.Fatalf("payment %s after a key-in-use on its last attempt, want requires_reconciliation", got.Status)
		}
	})
}

func TestPruneDeliveredOutboxRows(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{}, func(c *Config) { c.KeyTTL = time.Hour })
		delivered := b.mustCreate(t, "prune-1", 1000)
		b.relayOnce(t, 1)
		pending := b.mustCreate(t, "prune-2", 2000) // not relayed
		pendingID := b.message(t, pending.ID).ID
		prune := func(want int) {
			t.Helper()
			if n, err := b.svc.PruneOnce(b.ctx); err != nil || n != want {
				t.Fatalf("PruneOnce = %d, %v; want %d", n, err, want)
			}
		}
		prune(0) // delivered just now: kept for KeyTTL
		deliveredID := b.message(t, delivered.ID).ID
		b.clock.Advance(time.Hour + time.Second)
		prune(1)
		if _, err := b.svc.db.outbox.MessageGet(b.ctx, deliveredID); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("the delivered row after pruning: %v, want ErrNotFound", err)
		}
		if got := b.status(t, delivered.ID); got.Status != StatusSucceeded {
			t.Errorf("the delivered payment after pruning: %+v", got)
		}
		if m, err := b.svc.db.outbox.MessageGet(b.ctx, pendingID); err != nil || m.State != outbox.StatePending {
			t.Fatalf("the pending row after pruning: %+v, %v", m, err)
		}
		prune(0)
		// The pending row is still delivered, once, and pruned in its turn.
		b.relayOnce(t, 1)
		b.clock.Advance(time.Hour + time.Second)
		prune(1)
		if len(b.charges(t)) != 2 {
			t.Errorf("the ledger has %d charges, want 2", len(b.charges(t)))
		}
	})
}
