package console

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Ledger is what the console needs of a payments service's provider-side
// reconciliation: the charges of the provider's ledger that match no
// succeeded payment. The command adapts the payments service to it.
type Ledger interface {
	// LedgerDiscrepancyList returns at most p.Limit discrepancies with a
	// charge seq below p.BeforeSeq (0: from the newest), newest first.
	LedgerDiscrepancyList(ctx context.Context, p *LedgerListParams) ([]*LedgerDiscrepancy, error)
}

// LedgerListParams page Ledger.LedgerDiscrepancyList.
type LedgerListParams struct {
	BeforeSeq int64
	Limit     int
}

// LedgerDiscrepancy is a provider charge with no payment ("no_payment") or
// whose payment failed ("payment_failed"), as the console shows it.
type LedgerDiscrepancy struct {
	ChargeID  string
	ChargeSeq int64
	Kind      string
	Reference string
	// PaymentID, Tenant and PaymentStatus describe the payment, when there
	// is one; PaymentStatus is its status now.
	PaymentID, Tenant, PaymentStatus string
	AmountCents                      int64
	Currency                         string
	ChargedAt, FoundAt               time.Time
}

type ledgerRow struct {
	ChargeID, Kind, Reference        string
	PaymentID, Tenant, PaymentStatus string
	Amount                           string
	Charged, Found, FoundAgo         string
}

type ledgerData struct {
	Enabled bool
	Rows    []ledgerRow
	Err     string
	Next    string
}

// ledgerPage lists the provider charges that match no succeeded payment.
func (c *console) ledgerPage(w http.ResponseWriter, r *http.Request) {
	d := ledgerData{Enabled: c.cfg.Ledger != nil}
	if d.Enabled {
		var before int64
		if v := r.URL.Query().Get("before"); v != "" {
			var err error
			if before, err = strconv.ParseInt(v, 10, 64); err != nil || before <= 0 {
				c.renderError(w, r, http.StatusBadRequest, "Bad request", "The page link is not valid.")
				return
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
		defer cancel()
		list, err := c.cfg.Ledger.LedgerDiscrepancyList(ctx, &LedgerListParams{BeforeSeq: before, Limit: c.cfg.PageSize + 1})
		if err != nil {
			c.cfg.Logger.Error("idem console: listing ledger discrepancies failed", slog.Any("error", err))
			d.Err = "The ledger discrepancies could not be read (see the log)."
		}
		if len(list) > c.cfg.PageSize {
			list = list[:c.cfg.PageSize]
			d.Next = c.cfg.Prefix + "/ledger?" + url.Values{"before": {strconv.FormatInt(list[len(list)-1].ChargeSeq, 10)}}.Encode()
		}
		now := c.cfg.Now()
		for _, x := range list {
			d.Rows = append(d.Rows, ledgerRow{
				ChargeID: x.ChargeID, Kind: x.Kind, Reference: x.Reference,
				PaymentID: x.PaymentID, Tenant: x.Tenant, PaymentStatus: x.PaymentStatus,
				Amount:  strconv.FormatInt(x.AmountCents/100, 10) + "." + twoDigits(x.AmountCents%100) + " " + x.Currency,
				Charged: stamp(x.ChargedAt), Found: stamp(x.FoundAt), FoundAgo: ago(now, x.FoundAt),
			})
		}
	}
	c.render(w, r, http.StatusOK, "ledger", page{Title: "Ledger discrepancies", Nav: "ledger", Data: d})
}

func twoDigits(n int64) string {
	if n < 0 {
		n = -n
	}
	if n < 10 {
		return "0" + strconv.FormatInt(n, 10)
	}
	return strconv.FormatInt(n, 10)
}
