package idemmaint

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Resolution is what Config.Reconcile decided about an unknown record.
type Resolution struct {
	// State is StateCompleted (the operation happened), StateReleased (it
	// certainly did not: a retry may execute it), or "" when the reconciler
	// cannot tell yet and the record is tried again after a backoff.
	State idemstore.State
	// Response is the response a retry replays when State is
	// StateCompleted. Nil stores the record as not replayable: a retry gets
	// 409 not-replayable.
	Response *idemstore.Response
}

// ReconcileResult counts what one reconciliation pass did.
type ReconcileResult struct {
	// Listed is the number of unknown records the pass claimed from the
	// store (at most Config.ScanLimit, and no more than it could reconcile
	// in its time: see Config.ReconcileTimeout); Truncated reports that it
	// stopped at ScanLimit.
	Listed    int
	Truncated bool
	// Deferred counts the records a claim returned that this pass had
	// already tried (their backoff is shorter than the pass): they are
	// left for the next pass, and the pass ends.
	Deferred int
	// Attempted counts the calls of Config.Reconcile.
	Attempted int
	// Completed and Released count the records settled to each state.
	Completed, Released int
	// Lost counts the records someone else settled, took over or deleted
	// between the claim and the resolution.
	Lost int
	// Unresolved counts the attempts that left the record unknown (no
	// resolution, an error, a panic or an invalid resolution), each of them
	// scheduled again in the store after a backoff; Errors counts the ones
	// among them that failed.
	Unresolved, Errors int
	// MaxAttempts is the most failed attempts any record the pass left
	// unknown has had.
	MaxAttempts int
	// Backlog is the number of unknown records in the store when the pass
	// ended (KeyBacklog), whoever reconciles them; 0 when it could not be
	// counted.
	Backlog int
	// Left counts the due records the pass could not reconcile, for the
	// next pass or another maintainer: those it claimed and neither settled
	// nor scheduled again (the pass was stopped or the store failed; the
	// claim holds them until the pass's time ends), and, when it stopped
	// claiming for lack of time or at ScanLimit, the unknown records due on
	// Config.Now that it found in the store (listing at most ScanLimit
	// unknown records). It does not count the Deferred ones, nor the
	// records inside their Config.Grace.
	Left int
}

// add adds the counts of the records o reconciled to r.
func (r *ReconcileResult) add(o ReconcileResult) {
	r.Attempted += o.Attempted
	r.Completed += o.Completed
	r.Released += o.Released
	r.Lost += o.Lost
	r.Unresolved += o.Unresolved
	r.Errors += o.Errors
	r.MaxAttempts = max(r.MaxAttempts, o.MaxAttempts)
}

// Reconcile runs one reconciliation pass: it sweeps the expired leases
// (Sweep), then claims the unknown records that are due
// (KeyReconcileClaim: BatchSize a batch, at most ScanLimit, and only as
// many as it can reconcile in the time it has left, see
// Config.ReconcileTimeout), hands them to Config.Reconcile,
// ReconcileConcurrency at a time, and applies each resolution with
// KeyResolve, fenced on the record's token, or records the failed attempt
// and its backoff in the store (KeyReconcileFail). The claim holds each
// record until the pass's time ends, so maintainers sharing a store never
// ask about the same record at once, and the state in the store lets any
// of them, or a restarted one, carry on. The due records it could not
// reach are left unclaimed, counted (ReconcileResult.Left) and logged.
// Without Config.Reconcile it only measures the backlog. Every pass ends by
// reading the backlog from the store (KeyBacklog) for Stats. The error
// reports a failed claim, resolution or count (store unavailable) or the
// end of the pass's context; unresolved records are not errors, they are
// counted in the result.
func (m *Maintainer) Reconcile(ctx context.Context) (ReconcileResult, error) {
	return m.reconcile(ctx, 0)
}

func (m *Maintainer) reconcile(parent context.Context, every time.Duration) (res ReconcileResult, err error) {
	m.reconcileMu.Lock()
	defer m.reconcileMu.Unlock()
	ctx, cancel := m.passContext(parent)
	defer cancel()
	defer func() {
		m.updateStats(func(s *Stats) {
			s.Completed += int64(res.Completed)
			s.Released += int64(res.Released)
			s.Lost += int64(res.Lost)
			s.ReconcileErrors += int64(res.Errors)
			s.ReconcileScheduled += int64(res.Unresolved)
			s.Unresolved = res.Unresolved
			s.MaxAttempts = res.MaxAttempts
			s.ReconcileLeft = res.Left
		})
		m.endPass(parent, "reconcile", res.Completed+res.Released, err, func(s *Stats, now time.Time) { s.LastReconcile = now })
		if m.cfg.OnReconcile != nil {
			m.cfg.OnReconcile(res, err)
		}
	}()
	short, err := m.claimAndReconcile(ctx, every, &res)
	if errors.Is(err, context.Canceled) && parent.Err() != nil {
		return res, err
	}
	var errDue error
	if short {
		var due int
		due, errDue = m.countDue(parent)
		res.Left += due
	}
	if res.Left > 0 {
		m.cfg.Logger.LogAttrs(parent, slog.LevelWarn, "idemmaint: the reconciliation pass left due records for the next pass",
			slog.Int("left", res.Left),
			slog.Int("claimed", res.Listed),
			slog.Int("concurrency", m.cfg.ReconcileConcurrency),
			slog.Duration("reconcile_timeout", m.cfg.ReconcileTimeout))
	}
	backlog, errBacklog := m.measureBacklog(parent)
	res.Backlog = backlog
	return res, errors.Join(err, errDue, errBacklog)
}

// claimAndReconcile claims and reconciles batches of due unknown records.
// short reports that it stopped claiming while records may still be due:
// its time could not cover another record, or it reached ScanLimit.
func (m *Maintainer) claimAndReconcile(ctx context.Context, every time.Duration, res *ReconcileResult) (short bool, err error) {
	if m.cfg.Reconcile == nil {
		return false, nil
	}
	defer func() {
		// Claimed and neither settled nor scheduled again: held until the
		// claim's hold ends, then due again.
		res.Left = res.Listed - res.Deferred - res.Completed - res.Released - res.Lost - res.Unresolved
	}()
	// Claims take records stored as unknown: turn the expired leases
	// unknown first (a sweep pass, logged and counted as such), so that a
	// crashed attempt is reconciled in this pass, not after the sweeper's
	// next interval. Its failure is the sweep's (logged, counted); the
	// claims below report the store's state.
	_, _ = m.sweep(ctx, 0)
	seen := make(map[idemstore.Identity]bool)
	for {
		limit := min(m.cfg.BatchSize, m.cfg.ScanLimit-res.Listed, m.capacity(ctx))
		if limit <= 0 {
			return true, nil
		}
		hold := m.cfg.PassTimeout
		if deadline, ok := ctx.Deadline(); ok {
			hold = time.Until(deadline) // the claim ends with the pass
		}
		batch, err := m.store.KeyReconcileClaim(ctx, &idemstore.ReconcileClaimParams{Limit: limit, Hold: hold, Grace: m.cfg.Grace})
		if err != nil {
			return false, fmt.Errorf("idemmaint: claiming unknown records: %w", err)
		}
		res.Listed += len(batch)
		fresh := make([]*idemstore.Record, 0, len(batch))
		again := false
		for _, rec := range batch {
			if seen[rec.Identity] {
				// Due again within this pass: the next pass asks.
				res.Deferred++
				again = true
				continue
			}
			seen[rec.Identity] = true
			fresh = append(fresh, rec)
		}
		if err := m.reconcileBatch(ctx, fresh, res); err != nil {
			return false, err
		}
		if again || len(batch) < limit {
			return false, nil
		}
		if res.Listed >= m.cfg.ScanLimit {
			res.Truncated = true
			return true, nil
		}
		if !pause(ctx, every) {
			return false, fmt.Errorf("idemmaint: claiming unknown records: %w", ctx.Err())
		}
	}
}

// capacity is the number of records the pass can still reconcile before
// its context ends if every call takes all of ReconcileTimeout:
// ReconcileConcurrency for every ReconcileTimeout in nine tenths of the
// time left; the last tenth is kept for the store's writes.
func (m *Maintainer) capacity(ctx context.Context) int {
	deadline, ok := ctx.Deadline()
	if !ok {
		return m.cfg.BatchSize // passContext always sets one
	}
	rounds := int(time.Until(deadline) / 10 * 9 / m.cfg.ReconcileTimeout)
	return rounds * m.cfg.ReconcileConcurrency
}

// reconcileBatch reconciles the records of one claim on up to
// ReconcileConcurrency goroutines. It returns the first error that stops
// the pass; the records not yet asked about are then not asked about.
func (m *Maintainer) reconcileBatch(ctx context.Context, recs []*idemstore.Record, res *ReconcileResult) error {
	var (
		mu   sync.Mutex
		next int
		stop error
	)
	take := func() *idemstore.Record {
		mu.Lock()
		defer mu.Unlock()
		if stop != nil || next == len(recs) {
			return nil
		}
		next++
		return recs[next-1]
	}
	parts := make([]ReconcileResult, min(m.cfg.ReconcileConcurrency, len(recs)))
	var wg sync.WaitGroup
	for i := range parts {
		wg.Go(func() {
			for rec := take(); rec != nil; rec = take() {
				if err := m.reconcileRecord(ctx, rec, &parts[i]); err != nil {
					mu.Lock()
					stop = cmp.Or(stop, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	for _, p := range parts {
		res.add(p)
	}
	return stop
}

// countDue counts the unknown records that are due (ReconcileAfter at or
// before Config.Now and, with a positive Config.Grace, their lease ended
// that long ago or more, as a claim takes them), listing at most ScanLimit
// unknown records.
func (m *Maintainer) countDue(parent context.Context) (int, error) {
	ctx, cancel := m.passContext(parent)
	defer cancel()
	now := m.cfg.Now()
	graceOver := now.Add(-m.cfg.Grace) // a lease that ended by then is past its grace
	var (
		after  *idemstore.Identity
		due    int
		listed int
	)
	for listed < m.cfg.ScanLimit {
		limit := min(m.cfg.BatchSize, m.cfg.ScanLimit-listed)
		page, err := m.store.KeyList(ctx, &idemstore.ListParams{State: idemstore.StateUnknown, After: after, Limit: limit})
		if err != nil {
			return due, fmt.Errorf("idemmaint: counting the due unknown records: %w", err)
		}
		for _, rec := range page {
			if !rec.ReconcileAfter.After(now) && (m.cfg.Grace <= 0 || !rec.LockedUntil.After(graceOver)) {
				due++
			}
		}
		listed += len(page)
		if len(page) < limit {
			break
		}
		after = &page[len(page)-1].Identity
	}
	return due, nil
}

// measureBacklog reads the unknown backlog from the store into Stats: the
// store's count, so every node reports the same.
func (m *Maintainer) measureBacklog(parent context.Context) (int, error) {
	ctx, cancel := m.passContext(parent)
	defer cancel()
	b, err := m.store.KeyBacklog(ctx)
	if err != nil {
		return 0, fmt.Errorf("idemmaint: counting unknown records: %w", err)
	}
	var age time.Duration
	if !b.OldestUnknownSince.IsZero() {
		age = max(m.cfg.Now().Sub(b.OldestUnknownSince), 0)
	}
	m.updateStats(func(s *Stats) {
		s.UnknownBacklog = b.Unknown
		s.UnknownBacklogTruncated = false
		s.OldestUnknown = age
	})
	return b.Unknown, nil
}

// reconcileRecord tries to settle one claimed unknown record. It returns an
// error only when the pass must stop: its context is done, or the store
// failed to apply a resolution.
func (m *Maintainer) reconcileRecord(ctx context.Context, rec *idemstore.Record, res *ReconcileResult) error {
	res.Attempted++
	call, cancel := context.WithTimeout(ctx, m.cfg.ReconcileTimeout)
	resolution, err := m.callReconcile(call, rec)
	timedOut := errors.Is(call.Err(), context.DeadlineExceeded)
	cancel()
	if err != nil && timedOut && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no resolution within %v: %w", m.cfg.ReconcileTimeout, err)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		// The pass ran out of time or was stopped while the reconciler was
		// asking: its answer does not count against the record, which the
		// claim holds until the hold ends.
		return fmt.Errorf("idemmaint: reconciling: %w", ctxErr)
	}
	if err == nil {
		switch resolution.State {
		case idemstore.StateCompleted, idemstore.StateReleased:
			return m.resolve(ctx, rec, resolution, res)
		case "":
		default:
			err = fmt.Errorf("invalid resolution state %q: want %q, %q or empty", resolution.State, idemstore.StateCompleted, idemstore.StateReleased)
		}
	}
	return m.unresolved(ctx, rec, err, res)
}

// callReconcile calls Config.Reconcile, turning a panic into an error: a
// faulty reconciler must not take the application's process down.
func (m *Maintainer) callReconcile(ctx context.Context, rec *idemstore.Record) (res Resolution, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("reconciler panicked: %v", v)
		}
	}()
	return m.cfg.Reconcile(ctx, rec)
}

// settledElsewhere reports whether err from a fenced write means that
// someone else (another maintainer, an operator, a late completion) settled
// the record first, or it is gone: its state is theirs, not ours.
func settledElsewhere(err error) bool {
	return errors.Is(err, idemstore.ErrLeaseLost) || errors.Is(err, idemstore.ErrInvalidState) || errors.Is(err, idemstore.ErrNotFound)
}

// resolve applies a resolution with KeyResolve, fenced on the record's
// token.
func (m *Maintainer) resolve(ctx context.Context, rec *idemstore.Record, r Resolution, res *ReconcileResult) error {
	err := m.store.KeyResolve(ctx, &idemstore.ResolveParams{
		Identity: rec.Identity,
		Token:    rec.Token,
		To:       r.State,
		Response: r.Response,
	})
	attrs := append(recordAttrs(rec), slog.String("state", string(r.State)))
	switch {
	case err == nil:
		if r.State == idemstore.StateCompleted {
			res.Completed++
		} else {
			res.Released++
		}
		m.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idemmaint: unknown outcome reconciled", attrs...)
		return nil
	case settledElsewhere(err):
		res.Lost++
		m.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idemmaint: unknown record already settled elsewhere; resolution dropped",
			append(attrs, slog.String("reason", err.Error()))...)
		return nil
	default:
		return fmt.Errorf("idemmaint: resolving an unknown record: %w", err)
	}
}

// unresolved records in the store an attempt that could not settle the
// record, with the backoff before the next one, and surfaces it.
func (m *Maintainer) unresolved(ctx context.Context, rec *idemstore.Record, cause error, res *ReconcileResult) error {
	attempts := rec.ReconcileAttempts + 1
	delay := m.backoff(attempts)
	var text string
	if cause != nil {
		text = cause.Error()
	}
	err := m.store.KeyReconcileFail(ctx, &idemstore.ReconcileFailParams{
		Identity: rec.Identity,
		Token:    rec.Token,
		Error:    text,
		Delay:    delay,
	})
	attrs := recordAttrs(rec)
	switch {
	case err == nil:
	case settledElsewhere(err):
		res.Lost++
		m.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idemmaint: unknown record settled elsewhere while it was reconciled", attrs...)
		return nil
	default:
		return fmt.Errorf("idemmaint: recording a reconciliation attempt: %w", err)
	}
	res.Unresolved++
	res.MaxAttempts = max(res.MaxAttempts, attempts)
	attrs = append(attrs,
		slog.Int("attempts", attempts),
		slog.Duration("next_attempt_in", delay),
		slog.Time("unknown_since", rec.UpdatedAt))
	msg := "idemmaint: unknown outcome still unresolved"
	if cause != nil {
		res.Errors++
		msg = "idemmaint: reconciler failed; unknown outcome unresolved"
		attrs = append(attrs, slog.Any("error", cause))
	}
	m.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
	return nil
}

// backoff returns the delay before attempt n+1 at a record after n failed
// attempts: between half and all of min(Base·2^(n-1), Max).
func (m *Maintainer) backoff(n int) time.Duration {
	b := m.cfg.ReconcileBackoff
	d := b.Base
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	half := d / 2
	return half + rand.N(d-half+1)
}

// measure lists the in_progress records (at most ScanLimit) and records the
// age of the oldest in Stats.OldestInProgress.
func (m *Maintainer) measure(parent context.Context) error {
	ctx, cancel := m.passContext(parent)
	defer cancel()
	var (
		after  *idemstore.Identity
		oldest time.Time
		listed int
	)
	for listed < m.cfg.ScanLimit {
		limit := min(m.cfg.BatchSize, m.cfg.ScanLimit-listed)
		page, err := m.store.KeyList(ctx, &idemstore.ListParams{State: idemstore.StateInProgress, After: after, Limit: limit})
		if err != nil {
			err = fmt.Errorf("idemmaint: listing in-progress records: %w", err)
			if parent.Err() == nil {
				m.updateStats(func(s *Stats) { s.PassErrors++ })
				m.cfg.Logger.Error("idemmaint: pass failed", slog.String("job", "measure"), slog.Any("error", err))
			}
			return err
		}
		for _, rec := range page {
			if oldest.IsZero() || rec.StartedAt.Before(oldest) {
				oldest = rec.StartedAt
			}
		}
		listed += len(page)
		if len(page) < limit {
			break
		}
		after = &page[len(page)-1].Identity
	}
	var age time.Duration
	if !oldest.IsZero() {
		age = max(m.cfg.Now().Sub(oldest), 0)
	}
	m.updateStats(func(s *Stats) { s.OldestInProgress = age })
	return nil
}
