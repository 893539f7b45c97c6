package idemmaint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
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
	// Listed is the number of unknown records the pass listed (at most
	// Config.ScanLimit); Truncated reports that it stopped at that limit.
	Listed    int
	Truncated bool
	// Deferred counts the records skipped because their backoff has not
	// passed yet.
	Deferred int
	// Attempted counts the calls of Config.Reconcile.
	Attempted int
	// Completed and Released count the records settled to each state.
	Completed, Released int
	// Lost counts the records someone else settled, took over or deleted
	// between the listing and the resolution.
	Lost int
	// Unresolved counts the attempts that left the record unknown (no
	// resolution, an error, a panic or an invalid resolution); Errors
	// counts the ones among them that failed.
	Unresolved, Errors int
}

// pendingRecord is the backoff state of an unknown record the reconciler
// could not resolve yet.
type pendingRecord struct {
	// token is the record's token when it was tried: a record with the same
	// identity and another token is another attempt and starts afresh.
	token    string
	attempts int
	next     time.Time
	// seen is the generation of the last pass that listed the record.
	seen uint64
}

// Reconcile runs one reconciliation pass: it lists the unknown records
// (KeyList, BatchSize a page, at most ScanLimit), hands each one whose
// backoff has passed to Config.Reconcile and applies its resolution with
// KeyResolve, fenced on the record's token. Without Config.Reconcile it only
// counts the backlog. The error reports a failed listing or resolution
// (store unavailable) or the pass's timeout; unresolved records are not
// errors, they are counted in the result.
func (m *Maintainer) Reconcile(ctx context.Context) (ReconcileResult, error) {
	return m.reconcile(ctx, 0)
}

func (m *Maintainer) reconcile(parent context.Context, every time.Duration) (res ReconcileResult, err error) {
	m.reconcileMu.Lock()
	defer m.reconcileMu.Unlock()
	ctx, cancel := m.passContext(parent)
	defer cancel()
	m.generation++
	defer func() {
		complete := err == nil && !res.Truncated
		if complete {
			// Forget the records no longer unknown (settled elsewhere, or
			// expired and reaped) so that pending stays bounded.
			for id, p := range m.pending {
				if p.seen != m.generation {
					delete(m.pending, id)
				}
			}
		}
		maxAttempts := 0
		for _, p := range m.pending {
			maxAttempts = max(maxAttempts, p.attempts)
		}
		m.updateStats(func(s *Stats) {
			s.Completed += int64(res.Completed)
			s.Released += int64(res.Released)
			s.Lost += int64(res.Lost)
			s.ReconcileErrors += int64(res.Errors)
			s.Unresolved = len(m.pending)
			s.MaxAttempts = maxAttempts
			if err == nil {
				s.UnknownBacklog = res.Listed - res.Completed - res.Released - res.Lost
				s.UnknownBacklogTruncated = res.Truncated
			}
		})
		m.endPass(parent, "reconcile", res.Completed+res.Released, err, func(s *Stats, now time.Time) { s.LastReconcile = now })
		if m.cfg.OnReconcile != nil {
			m.cfg.OnReconcile(res, err)
		}
	}()

	var after *idemstore.Identity
	for {
		limit := min(m.cfg.BatchSize, m.cfg.ScanLimit-res.Listed)
		page, err := m.store.KeyList(ctx, &idemstore.ListParams{State: idemstore.StateUnknown, After: after, Limit: limit})
		if err != nil {
			return res, fmt.Errorf("idemmaint: listing unknown records: %w", err)
		}
		res.Listed += len(page)
		for _, rec := range page {
			if err := m.reconcileRecord(ctx, rec, &res); err != nil {
				return res, err
			}
		}
		if len(page) < limit {
			return res, nil
		}
		if res.Listed >= m.cfg.ScanLimit {
			res.Truncated = true
			return res, nil
		}
		after = &page[len(page)-1].Identity
		if !pause(ctx, every) {
			return res, fmt.Errorf("idemmaint: listing unknown records: %w", ctx.Err())
		}
	}
}

// reconcileRecord tries to settle one unknown record if it is due. It
// returns an error only when the pass must stop: its context is done, or the
// store failed to apply a resolution.
func (m *Maintainer) reconcileRecord(ctx context.Context, rec *idemstore.Record, res *ReconcileResult) error {
	if m.cfg.Reconcile == nil {
		return nil
	}
	p := m.pending[rec.Identity]
	if p != nil && p.token != rec.Token {
		p = nil // another attempt on the same identity
	}
	if p != nil {
		p.seen = m.generation
		if m.cfg.Now().Before(p.next) {
			res.Deferred++
			return nil
		}
	}
	res.Attempted++
	resolution, err := m.callReconcile(ctx, rec)
	if ctxErr := ctx.Err(); ctxErr != nil {
		// The pass ran out of time or was stopped while the reconciler was
		// asking: its answer does not count against the record.
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
	m.unresolved(rec, p, err, res)
	return nil
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
		delete(m.pending, rec.Identity)
		if r.State == idemstore.StateCompleted {
			res.Completed++
		} else {
			res.Released++
		}
		m.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idemmaint: unknown outcome reconciled", attrs...)
		return nil
	case errors.Is(err, idemstore.ErrLeaseLost), errors.Is(err, idemstore.ErrInvalidState), errors.Is(err, idemstore.ErrNotFound):
		// Someone else (another maintainer, an operator, a late
		// completion) settled the record first, or it expired: its state
		// is theirs, not ours.
		delete(m.pending, rec.Identity)
		res.Lost++
		m.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idemmaint: unknown record already settled elsewhere; resolution dropped",
			append(attrs, slog.String("reason", err.Error()))...)
		return nil
	default:
		return fmt.Errorf("idemmaint: resolving an unknown record: %w", err)
	}
}

// unresolved schedules the next attempt at a record the reconciler could not
// settle, and surfaces it.
func (m *Maintainer) unresolved(rec *idemstore.Record, p *pendingRecord, err error, res *ReconcileResult) {
	if p == nil {
		p = &pendingRecord{token: rec.Token}
		m.pending[rec.Identity] = p
	}
	p.seen = m.generation
	p.attempts++
	delay := m.backoff(p.attempts)
	p.next = m.cfg.Now().Add(delay)
	res.Unresolved++
	attrs := append(recordAttrs(rec),
		slog.Int("attempts", p.attempts),
		slog.Duration("next_attempt_in", delay),
		slog.Time("unknown_since", rec.UpdatedAt))
	msg := "idemmaint: unknown outcome still unresolved"
	if err != nil {
		res.Errors++
		msg = "idemmaint: reconciler failed; unknown outcome unresolved"
		attrs = append(attrs, slog.Any("error", err))
	}
	m.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
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
