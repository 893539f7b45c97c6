package payments

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reconciliation both ways. ReconcileOnce asks the provider about the
// payments the service knows; ReconcileLedgerOnce reads the provider's
// ledger and asks the service about each charge, by its reference (the
// payment's id), to find what the first direction cannot see:
//
//   - a charge with no payment (DiscrepancyNoPayment): money taken for
//     nothing the service knows of;
//   - a charge whose payment failed (DiscrepancyPaymentFailed): money taken,
//     customer told no.
//
// Each is kept once per charge in payments_ledger_discrepancies, logged
// when first found, counted (LedgerDiscrepancyCounts, the metric
// idem_payments_ledger_discrepancies{kind}) and listed in the console. The
// ledger is read in pages (GET /charges?after=SEQ&limit=N) from a
// watermark kept in the database, so a restarted or another process goes
// on where the last pass stopped. The watermark never passes a charge that
// could still change its verdict: one whose payment is not settled yet
// (pending or requires_reconciliation; the first direction settles it), or
// one younger than Config.LedgerGrace (a charge with a lower seq may still
// be committing at the provider). Those are looked at again on the next
// pass.

// The kinds of LedgerDiscrepancy.
const (
	DiscrepancyNoPayment     = "no_payment"
	DiscrepancyPaymentFailed = "payment_failed"
)

// DiscrepancyKinds lists every discrepancy kind.
var DiscrepancyKinds = []string{DiscrepancyNoPayment, DiscrepancyPaymentFailed}

// LedgerDiscrepancy is a charge of the provider's ledger that matches no
// succeeded payment.
type LedgerDiscrepancy struct {
	ChargeID  string
	ChargeSeq int64
	// Kind is DiscrepancyNoPayment or DiscrepancyPaymentFailed.
	Kind string
	// Reference is the charge's reference, the payment's id when the
	// service made the charge.
	Reference string
	// PaymentID and Tenant name the failed payment; empty for no_payment.
	PaymentID, Tenant string
	// PaymentStatus is the payment's status now (it may have changed since);
	// empty when there is no payment.
	PaymentStatus Status
	AmountCents   int64
	Currency      string
	ChargedAt     time.Time
	FoundAt       time.Time
	// ResolvedAt and ResolvedBy are set once an operator marked the
	// discrepancy handled (ResolveLedgerDiscrepancy); zero while it is open.
	ResolvedAt time.Time
	ResolvedBy string
}

// LedgerResult counts what one pass of ReconcileLedgerOnce did.
type LedgerResult struct {
	// Checked is the number of charges looked at: those read for the
	// first time and those held by an earlier pass.
	Checked int
	// Reported counts the discrepancies found for the first time.
	Reported int
	// Held counts the charges the watermark waits for after the pass:
	// their payment is not settled yet, or they are younger than
	// LedgerGrace. The next pass looks at them again.
	Held int
	// Watermark is the seq up to which the ledger is checked, after the
	// pass.
	Watermark int64
}

// maxLedgerPages bounds the pages of the ledger one pass reads.
const maxLedgerPages = 10

// ledgerRepo keeps the provider-side reconciliation's state.
type ledgerRepo interface {
	// ledgerWatermark returns the seq up to which the ledger was checked.
	ledgerWatermark(ctx context.Context) (int64, error)
	// ledgerAdvance moves the watermark to seq, never back.
	ledgerAdvance(ctx context.Context, seq int64, now time.Time) error
	// ledgerReport keeps d unless its charge is known; it reports whether
	// d is new.
	ledgerReport(ctx context.Context, d *LedgerDiscrepancy) (bool, error)
	// ledgerList returns at most limit discrepancies with a charge seq
	// below before, newest charge first.
	ledgerList(ctx context.Context, before int64, limit int) ([]*LedgerDiscrepancy, error)
	// ledgerCounts returns the number of open discrepancies of each kind.
	ledgerCounts(ctx context.Context) (map[string]int, error)
	// ledgerPayments returns the payments with the ids, by id, in one
	// query; ids without a payment are missing from the map.
	ledgerPayments(ctx context.Context, ids []string) (map[string]*Payment, error)
	// ledgerResolve marks the open discrepancy of the charge handled; it
	// reports whether one was open.
	ledgerResolve(ctx context.Context, chargeID, by string, now time.Time) (bool, error)
}

// ledgerScan is what a process remembers between its ledger passes: how
// far it read, and the charges past the watermark it must look at again.
// A pass reads only the charges it has not read yet and re-checks the held
// ones, so a busy ledger costs each charge one look (and one more per pass
// while it is held), not a re-read of everything after the watermark. A new
// process, or one whose watermark another process moved past its cursor,
// starts from the stored watermark.
type ledgerScan struct {
	mu     sync.Mutex // one pass at a time
	cursor int64      // the last seq read
	held   []*heldCharge
}

// heldCharge is a charge whose verdict may still change, or which is
// younger than LedgerGrace.
type heldCharge struct {
	charge *ledgerCharge
	// final: the verdict will not change (no payment, or a succeeded or
	// failed one, reported when it is a discrepancy); only the grace holds
	// it.
	final bool
}

// maxLedgerHeld bounds the charges a process holds: past it, a pass reads
// no new page until some are released.
const maxLedgerHeld = 10 * maxLedgerPage

// ReconcileLedgerOnce runs one pass of the provider-side reconciliation:
// it looks again at the charges it held, reads the provider's charges it
// has not read yet (from the watermark, in pages), reports every charge
// with no payment or with a failed payment, and moves the watermark up to
// the first charge still held. The reconciler's loop runs it after
// ReconcileOnce.
func (s *Service) ReconcileLedgerOnce(ctx context.Context) (LedgerResult, error) {
	var res LedgerResult
	sc := &s.ledger
	sc.mu.Lock()
	defer sc.mu.Unlock()
	w, err := s.db.repo.ledgerWatermark(ctx)
	if err != nil {
		return res, fmt.Errorf("reading the ledger watermark: %w", err)
	}
	res.Watermark = w
	if sc.cursor < w {
		// The first pass, or another process checked further.
		sc.cursor, sc.held = w, nil
	}
	now := s.now()
	// The writes run to their end even when the pass is cancelled.
	wctx := context.WithoutCancel(ctx)
	var perr error
	var held, recheck []*heldCharge
	for _, h := range sc.held {
		res.Checked++
		switch {
		case !h.final:
			recheck = append(recheck, h)
		case now.Sub(h.charge.CreatedAt) < s.cfg.LedgerGrace:
			held = append(held, h)
		}
	}
	if len(recheck) > 0 {
		charges := make([]*ledgerCharge, len(recheck))
		for i, h := range recheck {
			charges[i] = h.charge
		}
		keep, err := s.checkCharges(wctx, &res, charges, now)
		if err != nil {
			perr, keep = err, recheck
		}
		held = mergeHeld(held, keep)
	}
	limit := min(s.cfg.ReconcileBatch, maxLedgerPage)
	for page := 0; perr == nil && page < maxLedgerPages && len(held) < maxLedgerHeld; page++ {
		pctx, cancel := context.WithTimeout(ctx, s.cfg.DeliverTimeout)
		charges, err := s.provider.page(pctx, sc.cursor, limit)
		cancel()
		if err != nil {
			perr = fmt.Errorf("reading the provider's ledger after %d: %w", sc.cursor, err)
			break
		}
		if len(charges) == 0 {
			break
		}
		res.Checked += len(charges)
		keep, err := s.checkCharges(wctx, &res, charges, now)
		if err != nil {
			perr = err
			break
		}
		held = append(held, keep...)
		sc.cursor = charges[len(charges)-1].Seq
		if len(charges) < limit {
			break
		}
	}
	sc.held = held
	res.Held = len(held)
	next := sc.cursor
	if len(held) > 0 {
		next = held[0].charge.Seq - 1
	}
	return res, s.ledgerAdvance(wctx, &res, next, now, perr)
}

// checkCharges compares a page of charges with their payments (one query)
// and reports the discrepancies. It returns the charges to look at again,
// in ledger order.
func (s *Service) checkCharges(ctx context.Context, res *LedgerResult, charges []*ledgerCharge, now time.Time) ([]*heldCharge, error) {
	ids := make([]string, len(charges))
	for i, ch := range charges {
		ids[i] = ch.Reference
	}
	payments, err := s.db.repo.ledgerPayments(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("looking up the payments of %d charges: %w", len(charges), err)
	}
	var held []*heldCharge
	for _, ch := range charges {
		d := &LedgerDiscrepancy{
			ChargeID: ch.ID, ChargeSeq: ch.Seq, Reference: ch.Reference,
			AmountCents: ch.AmountCents, Currency: ch.Currency, ChargedAt: ch.CreatedAt.UTC(), FoundAt: now,
		}
		final := true
		switch p := payments[ch.Reference]; {
		case p == nil:
			d.Kind = DiscrepancyNoPayment
		case p.Status == StatusFailed:
			d.Kind = DiscrepancyPaymentFailed
			d.PaymentID, d.Tenant, d.PaymentStatus = p.ID, p.tenant, p.Status
		case p.Status != StatusSucceeded:
			final = false // the other direction settles it; look again
		}
		if d.Kind != "" {
			added, err := s.db.repo.ledgerReport(ctx, d)
			if err != nil {
				return nil, fmt.Errorf("recording the discrepancy of charge %s: %w", ch.ID, err)
			}
			if added {
				res.Reported++
				s.logDiscrepancy(d)
			}
		}
		if !final || now.Sub(d.ChargedAt) < s.cfg.LedgerGrace {
			held = append(held, &heldCharge{charge: ch, final: final})
		}
	}
	return held, nil
}

// mergeHeld merges two lists of held charges, each in ledger order.
func mergeHeld(a, b []*heldCharge) []*heldCharge {
	out := make([]*heldCharge, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if a[0].charge.Seq < b[0].charge.Seq {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
}

// logDiscrepancy logs a discrepancy found for the first time.
func (s *Service) logDiscrepancy(d *LedgerDiscrepancy) {
	attrs := []any{"kind", d.Kind, "charge_id", d.ChargeID, "charge_seq", d.ChargeSeq, "reference", d.Reference,
		"amount_cents", d.AmountCents, "currency", d.Currency}
	if d.Kind == DiscrepancyNoPayment {
		s.log.Error("payments: ledger: the provider has a charge with no payment", attrs...)
		return
	}
	s.log.Error("payments: ledger: the provider charged a failed payment (money taken, customer told no)",
		append(attrs, "payment_id", d.PaymentID, "tenant", d.Tenant)...)
}

// ledgerAdvance moves the watermark to next when it grew and returns
// cause, joined with the error of the write.
func (s *Service) ledgerAdvance(ctx context.Context, res *LedgerResult, next int64, now time.Time, cause error) error {
	if next <= res.Watermark {
		return cause
	}
	if err := s.db.repo.ledgerAdvance(ctx, next, now); err != nil {
		return errors.Join(cause, fmt.Errorf("moving the ledger watermark: %w", err))
	}
	res.Watermark = next
	return cause
}

// LedgerDiscrepancies returns at most limit discrepancies with a charge seq
// below before (0: from the newest), newest charge first.
func (s *Service) LedgerDiscrepancies(ctx context.Context, before int64, limit int) ([]*LedgerDiscrepancy, error) {
	if before <= 0 {
		before = 1<<63 - 1
	}
	return s.db.repo.ledgerList(ctx, before, limit)
}

// LedgerDiscrepancyCounts returns the number of open discrepancies of each
// kind (every kind of DiscrepancyKinds is present).
func (s *Service) LedgerDiscrepancyCounts(ctx context.Context) (map[string]int, error) {
	counts, err := s.db.repo.ledgerCounts(ctx)
	if err != nil {
		return nil, err
	}
	for _, k := range DiscrepancyKinds {
		counts[k] += 0
	}
	return counts, nil
}

// ErrNoOpenDiscrepancy is returned by ResolveLedgerDiscrepancy when the
// charge has no open discrepancy.
var ErrNoOpenDiscrepancy = errors.New("payments: no open ledger discrepancy for this charge")

// ResolveLedgerDiscrepancy marks the open discrepancy of a charge handled
// by the operator by (refunded, or settled with the customer): it stays
// listed, and is no longer counted.
func (s *Service) ResolveLedgerDiscrepancy(ctx context.Context, chargeID, by string) error {
	ok, err := s.db.repo.ledgerResolve(ctx, chargeID, by, s.now())
	if err != nil {
		return err
	}
	if !ok {
		return ErrNoOpenDiscrepancy
	}
	return nil
}

// LedgerWatermark returns the seq up to which the provider's ledger was
// checked.
func (s *Service) LedgerWatermark(ctx context.Context) (int64, error) {
	return s.db.repo.ledgerWatermark(ctx)
}

// --- the provider's ledger ---

// maxLedgerPage is the largest page the provider serves.
const maxLedgerPage = 1000

// ledgerCharge is a charge of the provider's ledger.
type ledgerCharge struct {
	Seq            int64     `json:"seq"`
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotency_key"`
	AmountCents    int64     `json:"amount_cents"`
	Currency       string    `json:"currency"`
	Reference      string    `json:"reference"`
	CreatedAt      time.Time `json:"created_at"`
}

// page reads at most limit charges after seq after. A page out of order,
// or with a charge at or before after, is an error: it must not move the
// watermark.
func (c *providerClient) page(ctx context.Context, after int64, limit int) ([]*ledgerCharge, error) {
	u := c.base + "/charges?after=" + strconv.FormatInt(after, 10) + "&limit=" + strconv.Itoa(limit)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errLookup, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxProviderAnswer))
		return nil, fmt.Errorf("%w: it answered %s", errLookup, resp.Status)
	}
	var charges []*ledgerCharge
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16*maxProviderAnswer)).Decode(&charges); err != nil {
		return nil, fmt.Errorf("%w: %w", errLookup, err)
	}
	if len(charges) > limit {
		return nil, fmt.Errorf("%w: a page of %d charges, limit %d", errLookup, len(charges), limit)
	}
	prev := after
	for _, ch := range charges {
		if ch == nil || ch.ID == "" || ch.Seq <= prev {
			return nil, fmt.Errorf("%w: the page is not in ledger order after %d", errLookup, after)
		}
		prev = ch.Seq
	}
	return charges, nil
}

// --- SQLite ---

func (r *sqliteRepo) ledgerWatermark(ctx context.Context) (int64, error) {
	var seq int64
	err := r.db.QueryRowContext(ctx, r.q.ledgerWatermark).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return seq, err
}

func (r *sqliteRepo) ledgerAdvance(ctx context.Context, seq int64, now time.Time) error {
	_, err := r.db.ExecContext(ctx, r.q.ledgerAdvance, seq, now.UnixMicro())
	return err
}

func (r *sqliteRepo) ledgerReport(ctx context.Context, d *LedgerDiscrepancy) (bool, error) {
	var id string
	err := r.db.QueryRowContext(ctx, r.q.ledgerReport, d.ChargeID, d.ChargeSeq, d.Kind, d.Reference,
		nullString(d.PaymentID), nullString(d.Tenant), d.AmountCents, d.Currency,
		d.ChargedAt.UnixMicro(), d.FoundAt.UnixMicro()).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (r *sqliteRepo) ledgerList(ctx context.Context, before int64, limit int) ([]*LedgerDiscrepancy, error) {
	rows, err := r.db.QueryContext(ctx, r.q.ledgerList, before, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*LedgerDiscrepancy
	for rows.Next() {
		d := &LedgerDiscrepancy{}
		var paymentID, tenant, resolvedBy, status sql.NullString
		var charged, found int64
		var resolved sql.NullInt64
		if err := rows.Scan(&d.ChargeID, &d.ChargeSeq, &d.Kind, &d.Reference, &paymentID, &tenant,
			&d.AmountCents, &d.Currency, &charged, &found, &resolved, &resolvedBy, &status); err != nil {
			return nil, err
		}
		d.PaymentID, d.Tenant, d.PaymentStatus = paymentID.String, tenant.String, Status(status.String)
		d.ChargedAt, d.FoundAt = time.UnixMicro(charged).UTC(), time.UnixMicro(found).UTC()
		if resolved.Valid {
			d.ResolvedAt, d.ResolvedBy = time.UnixMicro(resolved.Int64).UTC(), resolvedBy.String
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

func (r *sqliteRepo) ledgerCounts(ctx context.Context) (map[string]int, error) {
	rows, err := r.db.QueryContext(ctx, r.q.ledgerCounts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := make(map[string]int)
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			return nil, err
		}
		counts[kind] = n
	}
	return counts, rows.Err()
}

func (r *sqliteRepo) ledgerResolve(ctx context.Context, chargeID, by string, now time.Time) (bool, error) {
	return r.exec(ctx, r.q.ledgerResolve, chargeID, now.UnixMicro(), by)
}

func (r *sqliteRepo) ledgerPayments(ctx context.Context, ids []string) (map[string]*Payment, error) {
	arg, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	rows, err := r.db.QueryContext(ctx, r.q.ledgerPayments, string(arg))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]*Payment, len(ids))
	for rows.Next() {
		p, err := scanSQLite(rows)
		if err != nil {
			return nil, err
		}
		out[p.ID] = p
	}
	return out, rows.Err()
}

func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

// --- PostgreSQL ---

func (r *pgxRepo) ledgerWatermark(ctx context.Context) (int64, error) {
	var seq int64
	err := r.pool.QueryRow(ctx, r.q.ledgerWatermark).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return seq, err
}

func (r *pgxRepo) ledgerAdvance(ctx context.Context, seq int64, now time.Time) error {
	_, err := r.pool.Exec(ctx, r.q.ledgerAdvance, seq, now)
	return err
}

func (r *pgxRepo) ledgerReport(ctx context.Context, d *LedgerDiscrepancy) (bool, error) {
	var id string
	err := r.pool.QueryRow(ctx, r.q.ledgerReport, d.ChargeID, d.ChargeSeq, d.Kind, d.Reference,
		nullString(d.PaymentID), nullString(d.Tenant), d.AmountCents, d.Currency, d.ChargedAt, d.FoundAt).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (r *pgxRepo) ledgerList(ctx context.Context, before int64, limit int) ([]*LedgerDiscrepancy, error) {
	rows, err := r.pool.Query(ctx, r.q.ledgerList, before, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*LedgerDiscrepancy
	for rows.Next() {
		d := &LedgerDiscrepancy{}
		var paymentID, tenant, resolvedBy, status *string
		var resolved *time.Time
		if err := rows.Scan(&d.ChargeID, &d.ChargeSeq, &d.Kind, &d.Reference, &paymentID, &tenant,
			&d.AmountCents, &d.Currency, &d.ChargedAt, &d.FoundAt, &resolved, &resolvedBy, &status); err != nil {
			return nil, err
		}
		if resolved != nil {
			d.ResolvedAt = resolved.UTC()
		}
		if resolvedBy != nil {
			d.ResolvedBy = *resolvedBy
		}
		if paymentID != nil {
			d.PaymentID = *paymentID
		}
		if tenant != nil {
			d.Tenant = *tenant
		}
		if status != nil {
			d.PaymentStatus = Status(*status)
		}
		d.ChargedAt, d.FoundAt = d.ChargedAt.UTC(), d.FoundAt.UTC()
		out = append(out, d)
	}
	return out, rows.Err()
}

func (r *pgxRepo) ledgerResolve(ctx context.Context, chargeID, by string, now time.Time) (bool, error) {
	return r.exec(ctx, r.q.ledgerResolve, chargeID, now, by)
}

func (r *pgxRepo) ledgerPayments(ctx context.Context, ids []string) (map[string]*Payment, error) {
	rows, err := r.pool.Query(ctx, r.q.ledgerPayments, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]*Payment, len(ids))
	for rows.Next() {
		p, err := scanPgx(rows)
		if err != nil {
			return nil, err
		}
		out[p.ID] = p
	}
	return out, rows.Err()
}

func (r *pgxRepo) ledgerCounts(ctx context.Context) (map[string]int, error) {
	rows, err := r.pool.Query(ctx, r.q.ledgerCounts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := make(map[string]int)
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			return nil, err
		}
		counts[kind] = n
	}
	return counts, rows.Err()
}
