package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/console"
)

// memLedger is an in-memory console.Ledger, newest charge last.
type memLedger struct {
	mu   sync.Mutex
	list []*console.LedgerDiscrepancy
	err  error
}

func (m *memLedger) LedgerDiscrepancyList(_ context.Context, p *console.LedgerListParams) ([]*console.LedgerDiscrepancy, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	var out []*console.LedgerDiscrepancy
	for i := len(m.list) - 1; i >= 0 && len(out) < p.Limit; i-- {
		if d := m.list[i]; p.BeforeSeq == 0 || d.ChargeSeq < p.BeforeSeq {
			out = append(out, d)
		}
	}
	return out, nil
}

func (m *memLedger) LedgerDiscrepancyResolve(_ context.Context, chargeID, operator string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	for _, d := range m.list {
		if d.ChargeID == chargeID && d.ResolvedAt.IsZero() {
			d.ResolvedAt, d.ResolvedBy = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), operator
			return nil
		}
	}
	return fmt.Errorf("resolving %s: %w", chargeID, console.ErrNoOpenDiscrepancy)
}

func TestLedgerDiscrepancies(t *testing.T) {
	t.Parallel()
	l := &memLedger{}
	b := setup(t, func(c *console.Config) { c.Ledger = l; c.PageSize = 2 })
	at := time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)
	l.list = []*console.LedgerDiscrepancy{
		{ChargeID: "ch_ghost", ChargeSeq: 3, Kind: "no_payment", Reference: `<b>pay_ghost</b>`, AmountCents: 700, Currency: "EUR", ChargedAt: at, FoundAt: at},
		{ChargeID: "ch_failed", ChargeSeq: 5, Kind: "payment_failed", Reference: "pay_1", PaymentID: "pay_1", Tenant: "acme",
			PaymentStatus: "failed", AmountCents: 1205, Currency: "EUR", ChargedAt: at, FoundAt: at},
		{ChargeID: "ch_other", ChargeSeq: 9, Kind: "no_payment", Reference: "pay_other", AmountCents: 5, Currency: "USD", ChargedAt: at, FoundAt: at},
	}
	first := b.get(t, "/_idem/ledger").Body.String()
	for _, want := range []string{"ch_other", "ch_failed", "payment failed", "pay_1", "acme", "12.05 EUR", "0.05 USD", "/_idem/ledger?before=5"} {
		if !strings.Contains(first, want) {
			t.Errorf("the first page lacks %q:\n%s", want, first)
		}
	}
	if strings.Contains(first, "ch_ghost") {
		t.Errorf("the first page shows more than a page:\n%s", first)
	}
	second := b.get(t, "/_idem/ledger?before=5").Body.String()
	if !strings.Contains(second, "ch_ghost") || !strings.Contains(second, "no payment") || strings.Contains(second, "<b>pay_ghost") ||
		!strings.Contains(second, "&lt;b&gt;pay_ghost") || strings.Contains(second, "ch_failed") {
		t.Errorf("the second page is wrong:\n%s", second)
	}
	if rec := b.get(t, "/_idem/ledger?before=x"); rec.Code != 400 {
		t.Errorf("a bad page link: %d, want 400", rec.Code)
	}
	l.mu.Lock()
	l.err = errors.New("connection refused")
	l.mu.Unlock()
	if page := b.get(t, "/_idem/ledger").Body.String(); !strings.Contains(page, "could not be read") {
		t.Errorf("a failing ledger is not told:\n%s", page)
	}
	if logs := b.logs.String(); !strings.Contains(logs, "listing ledger discrepancies failed") {
		t.Errorf("the failure was not logged:\n%s", logs)
	}
}

func TestLedgerPageWithoutLedger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if page := b.get(t, "/_idem/ledger").Body.String(); !strings.Contains(page, "No payments ledger is connected") {
		t.Errorf("the ledger page does not say there is no ledger:\n%s", page)
	}
	l := &memLedger{}
	b = setup(t, func(c *console.Config) { c.Ledger = l })
	if page := b.get(t, "/_idem/ledger").Body.String(); !strings.Contains(page, "No discrepancies") {
		t.Errorf("an empty ledger page:\n%s", page)
	}
}

// Marking a discrepancy handled is a CSRF-checked POST with an audit line;
// a second one is 409 and changes nothing.
func TestLedgerResolve(t *testing.T) {
	t.Parallel()
	l := &memLedger{}
	b := setup(t, func(c *console.Config) { c.Ledger = l })
	at := time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)
	l.list = []*console.LedgerDiscrepancy{
		{ChargeID: "ch_ghost", ChargeSeq: 3, Kind: "no_payment", Reference: "pay_ghost", AmountCents: 700, Currency: "EUR", ChargedAt: at, FoundAt: at},
	}
	page := b.get(t, "/_idem/ledger").Body.String()
	if !strings.Contains(page, ">Mark handled<") {
		t.Fatalf("no action on an open discrepancy:\n%s", page)
	}
	if rec := b.post(t, "/_idem/ledger/resolve", url.Values{"charge": {"ch_ghost"}}); rec.Code != 403 {
		t.Fatalf("a POST without the CSRF token: %d, want 403", rec.Code)
	}
	rec := b.post(t, "/_idem/ledger/resolve", url.Values{"csrf": {formValue(t, page, "csrf")}, "charge": {formValue(t, page, "charge")}})
	if rec.Code != 303 || rec.Header().Get("Location") != "/_idem/ledger?done=handled" {
		t.Fatalf("resolve: %d %s", rec.Code, rec.Header().Get("Location"))
	}
	logs := b.logs.String()
	if !strings.Contains(logs, "action=ledger_resolve") || !strings.Contains(logs, "charge_id=ch_ghost") {
		t.Errorf("no audit line:\n%s", logs)
	}
	after := b.get(t, "/_idem/ledger?done=handled").Body.String()
	if strings.Contains(after, ">Mark handled<") || !strings.Contains(after, "Marked handled") {
		t.Errorf("the page after resolving:\n%s", after)
	}
	if rec := b.post(t, "/_idem/ledger/resolve", url.Values{"csrf": {b.csrf(t)}, "charge": {"ch_ghost"}}); rec.Code != 409 {
		t.Errorf("resolving again: %d, want 409", rec.Code)
	}
	if rec := b.post(t, "/_idem/ledger/resolve", url.Values{"csrf": {b.csrf(t)}, "charge": {""}}); rec.Code != 400 {
		t.Errorf("no charge: %d, want 400", rec.Code)
	}
}
