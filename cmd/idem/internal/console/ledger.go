package console

import (
	"context"
	"errors"
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
	// LedgerDiscrepancyResolve marks the open discrepancy of the charge
	// handled by operator. It returns an error matching
	// ErrNoOpenDiscrepancy when the charge has none open.
	LedgerDiscrepancyResolve(ctx context.Context, chargeID, operator string) error
}

// ErrNoOpenDiscrepancy is returned (wrapped or not) by
// Ledger.LedgerDiscrepancyResolve when the charge has no open discrepancy.
var ErrNoOpenDiscrepancy = errors.New("console: no open ledger discrepancy for this charge")

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
	// ResolvedAt and ResolvedBy are set once an operator marked it
	// handled.
	ResolvedAt time.Time
	ResolvedBy string
}

type ledgerRow struct {
	ChargeID, Kind, Reference        string
	PaymentID, Tenant, PaymentStatus string
	Amount                           string
	Charged, Found, FoundAgo         string
	Resolved, ResolvedBy             string
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
			row := ledgerRow{
				ChargeID: x.ChargeID, Kind: x.Kind, Reference: x.Reference,
				PaymentID: x.PaymentID, Tenant: x.Tenant, PaymentStatus: x.PaymentStatus,
				Amount:  strconv.FormatInt(x.AmountCents/100, 10) + "." + twoDigits(x.AmountCents%100) + " " + x.Currency,
				Charged: stamp(x.ChargedAt), Found: stamp(x.FoundAt), FoundAgo: ago(now, x.FoundAt),
			}
			if !x.ResolvedAt.IsZero() {
				row.Resolved, row.ResolvedBy = stamp(x.ResolvedAt), x.ResolvedBy
			}
			d.Rows = append(d.Rows, row)
		}
	}
	c.render(w, r, http.StatusOK, "ledger", page{Title: "Ledger discrepancies", Nav: "ledger", Flash: flashes[r.URL.Query().Get("done")], Data: d})
}

// ledgerResolve marks a discrepancy handled, with an audit line.
func (c *console) ledgerResolve(w http.ResponseWriter, r *http.Request) {
	back := c.cfg.Prefix + "/ledger"
	if c.cfg.Ledger == nil {
		c.renderError(w, r, http.StatusNotFound, "Not found", "No payments ledger is connected to this console.")
		return
	}
	charge := r.PostForm.Get("charge")
	if charge == "" || len(charge) > 255 {
		c.renderErrorBack(w, r, http.StatusBadRequest, "Bad request", "The charge id is not valid.", back)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout)
	defer cancel()
	operator := sessionFrom(r).operator
	err := c.cfg.Ledger.LedgerDiscrepancyResolve(ctx, charge, operator)
	attrs := []slog.Attr{
		slog.String("action", "ledger_resolve"),
		slog.String("operator", operator),
		slog.String("charge_id", charge),
	}
	switch {
	case err == nil:
		c.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idem console: operator resolved a ledger discrepancy", attrs...)
		http.Redirect(w, r, back+"?done=handled", http.StatusSeeOther)
	case errors.Is(err, ErrNoOpenDiscrepancy):
		c.renderErrorBack(w, r, http.StatusConflict, "Not open", "Nothing was changed: this charge has no open discrepancy (it may have been resolved already).", back)
	default:
		c.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem console: resolving a ledger discrepancy failed", append(attrs, slog.Any("error", err))...)
		c.renderErrorBack(w, r, http.StatusServiceUnavailable, "Ledger unavailable", "Nothing was changed: the database returned an error (see the log).", back)
	}
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
