package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/cmd/idem/internal/console"
	paysvc "github.com/idem-dev/idem/cmd/idem/internal/payments"
)

// ledgerCollector reports the payments service's ledger discrepancies
// (charges with no payment or with a failed one) as
// idem_payments_ledger_discrepancies{kind}, read from the database at each
// scrape, so every node of a service reports the same numbers.
type ledgerCollector struct{ svc *paysvc.Service }

var descLedgerDiscrepancies = prometheus.NewDesc("idem_payments_ledger_discrepancies",
	"Charges of the provider's ledger that match no succeeded payment, by kind: no_payment, or payment_failed (money taken, customer told no).",
	[]string{"kind"}, nil)

func (c ledgerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descLedgerDiscrepancies }

func (c ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := c.svc.LedgerDiscrepancyCounts(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descLedgerDiscrepancies, err)
		return
	}
	for _, kind := range paysvc.DiscrepancyKinds {
		ch <- prometheus.MustNewConstMetric(descLedgerDiscrepancies, prometheus.GaugeValue, float64(counts[kind]), kind)
	}
}

// consoleLedger adapts the payments service to the console's Ledger.
type consoleLedger struct{ svc *paysvc.Service }

func (c consoleLedger) LedgerDiscrepancyList(ctx context.Context, p *console.LedgerListParams) ([]*console.LedgerDiscrepancy, error) {
	list, err := c.svc.LedgerDiscrepancies(ctx, p.BeforeSeq, p.Limit)
	if err != nil {
		return nil, err
	}
	out := make([]*console.LedgerDiscrepancy, len(list))
	for i, d := range list {
		out[i] = &console.LedgerDiscrepancy{
			ChargeID: d.ChargeID, ChargeSeq: d.ChargeSeq, Kind: d.Kind, Reference: d.Reference,
			PaymentID: d.PaymentID, Tenant: d.Tenant, PaymentStatus: string(d.PaymentStatus),
			AmountCents: d.AmountCents, Currency: d.Currency, ChargedAt: d.ChargedAt, FoundAt: d.FoundAt,
			ResolvedAt: d.ResolvedAt, ResolvedBy: d.ResolvedBy,
		}
	}
	return out, nil
}

func (c consoleLedger) LedgerDiscrepancyResolve(ctx context.Context, chargeID, operator string) error {
	err := c.svc.ResolveLedgerDiscrepancy(ctx, chargeID, operator)
	if errors.Is(err, paysvc.ErrNoOpenDiscrepancy) {
		return fmt.Errorf("%w: %w", console.ErrNoOpenDiscrepancy, err)
	}
	return err
}
