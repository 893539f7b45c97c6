package payments

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/provider"
)

// logBuffer collects a service's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// charge charges the provider directly, as a payment's relay would, with
// key and reference.
func (b *bundle) charge(t *testing.T, key, reference string, amount int) provider.Charge {
	t.Helper()
	body := fmt.Sprintf(`{"amount_cents":%d,"currency":"EUR","reference":%q}`, amount, reference)
	req, _ := http.NewRequestWithContext(b.ctx, http.MethodPost, b.prov.URL()+"/charges", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("charging the provider: %s", resp.Status)
	}
	cs := b.charges(t)
	return cs[len(cs)-1]
}

// ledgerOnce runs one ledger pass and checks what it did.
func (b *bundle) ledgerOnce(t *testing.T, svc *Service, want LedgerResult) {
	t.Helper()
	res, err := svc.ReconcileLedgerOnce(b.ctx)
	if err != nil {
		t.Fatalf("ReconcileLedgerOnce: %v", err)
	}
	if res != want {
		t.Fatalf("ReconcileLedgerOnce = %+v, want %+v", res, want)
	}
}

// TestLedgerReconciliation provokes each case of the provider-side
// reconciliation: a charge with no payment and a charge whose payment
// failed are reported once each (log line, counts, list), a charge whose
// payment is still pending holds the watermark until it settles, and the
// watermark survives a restart.
func TestLedgerReconciliation(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		logs := &logBuffer{}
		logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		b := setup(t, store, provider.Faults{}, func(c *Config) {
			c.ReconcileBatch = 2 // pages of two charges
			c.Logger = logger
		})

		// A payment charged by the relay: no discrepancy.
		ok := b.mustCreate(t, "ledger-ok", 1000)
		b.relayOnce(t, 1)
		if got := b.status(t, ok.ID); got.Status != StatusSucceeded {
			t.Fatalf("relayed payment: %s", got.Status)
		}
		// A charge no payment made.
		ghost := b.charge(t, "ghost-charge-key", "pay_ghost", 700)
		// A payment that failed, charged all the same (say, an attempt the
		// service gave up on that reached the provider late).
		failed := b.mustCreate(t, "ledger-failed", 1200)
		if changed, err := b.svc.db.repo.markFailed(b.ctx, failed.ID, "test: given up", b.clock.Now()); err != nil || !changed {
			t.Fatalf("markFailed: %v, %v", changed, err)
		}
		fp, err := b.svc.db.repo.byID(b.ctx, failed.ID)
		if err != nil {
			t.Fatal(err)
		}
		failedCharge := b.charge(t, fp.providerKey, failed.ID, 1200)
		// A payment charged but not settled yet (the relay's answer was
		// lost): not a discrepancy, but its verdict is open.
		open := b.mustCreate(t, "ledger-open", 1500)
		op, err := b.svc.db.repo.byID(b.ctx, open.ID)
		if err != nil {
			t.Fatal(err)
		}
		openCharge := b.charge(t, op.providerKey, open.ID, 1500)

		b.ledgerOnce(t, b.svc, LedgerResult{Checked: 4, Reported: 2, Held: 1, Watermark: failedCharge.Seq})
		counts, err := b.svc.LedgerDiscrepancyCounts(b.ctx)
		if err != nil || counts[DiscrepancyNoPayment] != 1 || counts[DiscrepancyPaymentFailed] != 1 {
			t.Fatalf("counts %v, %v; want one of each kind", counts, err)
		}
		list, err := b.svc.LedgerDiscrepancies(b.ctx, 0, 10)
		if err != nil || len(list) != 2 {
			t.Fatalf("list %v, %v; want 2", list, err)
		}
		if d := list[0]; d.ChargeID != failedCharge.ID || d.Kind != DiscrepancyPaymentFailed || d.PaymentID != failed.ID ||
			d.Tenant != tenantA || d.PaymentStatus != StatusFailed || d.AmountCents != 1200 || d.Reference != failed.ID {
			t.Errorf("first discrepancy %+v, want the failed payment's charge", d)
		}
		if d := list[1]; d.ChargeID != ghost.ID || d.Kind != DiscrepancyNoPayment || d.PaymentID != "" ||
			d.Reference != "pay_ghost" || d.AmountCents != 700 || d.Currency != "EUR" || !d.ChargedAt.Equal(ghost.CreatedAt) {
			t.Errorf("second discrepancy %+v, want the ghost charge", d)
		}
		if page, err := b.svc.LedgerDiscrepancies(b.ctx, list[0].ChargeSeq, 10); err != nil || len(page) != 1 || page[0].ChargeID != ghost.ID {
			t.Errorf("the page after the first: %v, %v", page, err)
		}
		out := logs.String()
		if !strings.Contains(out, "charge with no payment") || !strings.Contains(out, "charged a failed payment") {
			t.Errorf("the discrepancies were not logged:\n%s", out)
		}
		for _, secret := range []string{"ghost-charge-key", fp.providerKey, tokenA} {
			if strings.Contains(out, secret) {
				t.Errorf("a key or token reached the log:\n%s", out)
			}
		}

		// Again: nothing new is reported, and the open charge still holds
		// the watermark.
		b.ledgerOnce(t, b.svc, LedgerResult{Checked: 1, Reported: 0, Held: 1, Watermark: failedCharge.Seq})
		if n := strings.Count(logs.String(), "charge with no payment"); n != 1 {
			t.Errorf("the ghost charge was logged %d times, want once", n)
		}
		// The payment settles (as the relay or the other direction would do):
		// the watermark moves past it.
		if changed, err := b.svc.db.repo.markSucceeded(b.ctx, b.svc.db.outbox, open.ID, openCharge.ID, b.clock.Now(), nil); err != nil || !changed {
			t.Fatalf("markSucceeded: %v, %v", changed, err)
		}
		b.ledgerOnce(t, b.svc, LedgerResult{Checked: 1, Reported: 0, Held: 0, Watermark: openCharge.Seq})

		// A restarted service goes on from the stored watermark and finds
		// the discrepancies where they were.
		again, err := New(b.ctx, &Config{
			Store: store, Tokens: map[string]string{tenantA: tokenA}, ProviderURL: b.prov.URL(),
			Logger: logger, Now: b.clock.Now,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { again.Close() })
		if w, err := again.LedgerWatermark(b.ctx); err != nil || w != openCharge.Seq {
			t.Fatalf("watermark after restart: %d, %v; want %d", w, err, openCharge.Seq)
		}
		b.ledgerOnce(t, again, LedgerResult{Checked: 0, Watermark: openCharge.Seq})
		late := b.charge(t, "late-ghost-key", "pay_late", 300)
		b.ledgerOnce(t, again, LedgerResult{Checked: 1, Reported: 1, Watermark: late.Seq})
		if counts, err := again.LedgerDiscrepancyCounts(b.ctx); err != nil || counts[DiscrepancyNoPayment] != 2 || counts[DiscrepancyPaymentFailed] != 1 {
			t.Fatalf("counts after restart %v, %v", counts, err)
		}
		// The first service, still running, sees the same state.
		b.ledgerOnce(t, b.svc, LedgerResult{Checked: 0, Watermark: late.Seq})

		// An operator marks the ghost charge handled: it stays listed, and
		// is no longer counted; a second resolution changes nothing.
		if err := b.svc.ResolveLedgerDiscrepancy(b.ctx, ghost.ID, "ops@example.com"); err != nil {
			t.Fatalf("ResolveLedgerDiscrepancy: %v", err)
		}
		if err := b.svc.ResolveLedgerDiscrepancy(b.ctx, ghost.ID, "someone-else"); !errors.Is(err, ErrNoOpenDiscrepancy) {
			t.Fatalf("resolving again: %v, want ErrNoOpenDiscrepancy", err)
		}
		if err := b.svc.ResolveLedgerDiscrepancy(b.ctx, "ch_unknown", "ops"); !errors.Is(err, ErrNoOpenDiscrepancy) {
			t.Fatalf("resolving an unknown charge: %v, want ErrNoOpenDiscrepancy", err)
		}
		if counts, err := b.svc.LedgerDiscrepancyCounts(b.ctx); err != nil || counts[DiscrepancyNoPayment] != 1 || counts[DiscrepancyPaymentFailed] != 1 {
			t.Fatalf("counts after a resolution %v, %v", counts, err)
		}
		all, err := b.svc.LedgerDiscrepancies(b.ctx, 0, 10)
		if err != nil || len(all) != 3 {
			t.Fatalf("list after a resolution: %v, %v", all, err)
		}
		for _, d := range all {
			if resolved := d.ChargeID == ghost.ID; resolved != !d.ResolvedAt.IsZero() || (resolved && d.ResolvedBy != "ops@example.com") {
				t.Errorf("discrepancy %s: resolved at %v by %q", d.ChargeID, d.ResolvedAt, d.ResolvedBy)
			}
		}
	})
}

// A charge younger than LedgerGrace is checked and reported, but the
// watermark waits for it: a charge with a lower seq may still commit.
func TestLedgerGraceHoldsTheWatermark(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{}, func(c *Config) {
			c.LedgerGrace = 24 * time.Hour
			c.Now = func() time.Time { return time.Now() } // the provider's clock
		})
		ghost := b.charge(t, "young-ghost-key", "pay_young", 500)
		b.ledgerOnce(t, b.svc, LedgerResult{Checked: 1, Reported: 1, Held: 1, Watermark: 0})
		b.ledgerOnce(t, b.svc, LedgerResult{Checked: 1, Reported: 0, Held: 1, Watermark: 0})
		if list, err := b.svc.LedgerDiscrepancies(b.ctx, 0, 10); err != nil || len(list) != 1 || list[0].ChargeID != ghost.ID {
			t.Fatalf("list %v, %v", list, err)
		}
	})
}

// A provider that cannot be read fails the pass and leaves the watermark.
func TestLedgerProviderDown(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite:"+t.TempDir()+"/payments.db", provider.Faults{}, nil)
	b.charge(t, "some-key", "pay_x", 100)
	b.prov.Close()
	res, err := b.svc.ReconcileLedgerOnce(b.ctx)
	if err == nil || res.Watermark != 0 || res.Reported != 0 {
		t.Fatalf("ReconcileLedgerOnce with the provider down = %+v, %v; want an error and no change", res, err)
	}
	if w, err := b.svc.LedgerWatermark(b.ctx); err != nil || w != 0 {
		t.Fatalf("watermark %d, %v", w, err)
	}
}
