package payments

import (
	"context"
	"fmt"
	"time"
)

// ReconcileResult counts what one reconciliation pass did.
type ReconcileResult struct {
	// Checked is the number of payments looked at.
	Checked int
	// Succeeded and Failed count the payments settled.
	Succeeded, Failed int
	// Unresolved counts the payments left for a later pass: the provider
	// could not be asked, or it has no charge yet while the relay may still
	// send one.
	Unresolved int
}

// maxReconcileBackoff caps the wait between two looks at one payment.
const maxReconcileBackoff = 30 * time.Minute

// ReconcileOnce runs one reconciliation pass over the payments whose
// outcome is open: those that require reconciliation (an attempt timed out
// or lost its connection), and pending ones whose outbox row is no longer
// pending (dead-lettered, e.g. after a relay died during the last attempt).
// It asks the provider for each by the payment's derived key:
//
//   - a charge found: the payment succeeded;
//   - no charge, and the outbox row still pending: the relay will try
//     again (asking first, then sending with the same key); look later;
//   - no charge, the row dead-lettered at least SettleAfter ago: nothing
//     can charge the payment any more, and the provider never did, so it
//     failed;
//   - the provider cannot be asked: look again after a backoff.
//
// A payment is never charged here. The invariant is at most one charge per
// payment in the provider's ledger, and every payment ends succeeded or
// failed.
func (s *Service) ReconcileOnce(ctx context.Context) (ReconcileResult, error) {
	var res ReconcileResult
	now := s.now()
	ps, err := s.db.repo.unsettled(ctx, now, s.cfg.ReconcileBatch)
	if err != nil {
		return res, fmt.Errorf("listing the payments to reconcile: %w", err)
	}
	for _, u := range ps {
		if ctx.Err() != nil {
			break
		}
		res.Checked++
		log := s.log.With("payment_id", u.ID, "status", string(u.Status), "outbox_state", u.outboxState)
		lctx, cancel := context.WithTimeout(ctx, s.cfg.DeliverTimeout)
		ch, found, err := s.provider.lookup(lctx, u.providerKey)
		cancel()
		if err == nil {
			s.crash(CrashMidReconcile)
		}
		// The writes run to their end even when the pass is cancelled.
		wctx := context.WithoutCancel(ctx)
		switch {
		case err != nil:
			res.Unresolved++
			next := now.Add(s.reconcileBackoff(u.reconcileAttempts))
			log.Warn("payments: reconciliation could not ask the provider", "error", err, "next_check", next)
			if derr := s.db.repo.deferReconcile(wctx, u.ID, next); derr != nil {
				log.Error("payments: deferring the reconciliation failed", "error", derr)
			}
		case found:
			now := s.now()
			if _, err := s.db.repo.markSucceeded(wctx, s.db.outbox, u.ID, ch.ID, now, s.succeededEvent(u.Payment, ch.ID, now)); err != nil {
				res.Unresolved++
				log.Error("payments: recording the reconciled charge failed", "charge_id", ch.ID, "error", err)
				continue
			}
			res.Succeeded++
			log.Info("payments: reconciled: the provider has the charge, payment succeeded", "charge_id", ch.ID)
		case u.outboxState == "pending":
			res.Unresolved++
			next := now.Add(s.reconcileBackoff(u.reconcileAttempts))
			log.Info("payments: reconciliation found no charge yet; the relay tries again", "next_check", next)
			if derr := s.db.repo.deferReconcile(wctx, u.ID, next); derr != nil {
				log.Error("payments: deferring the reconciliation failed", "error", derr)
			}
		case now.Sub(u.outboxUpdatedAt) >= s.cfg.SettleAfter:
			const reason = "the provider has no charge for this payment and no attempt is left"
			if _, err := s.db.repo.markFailed(wctx, u.ID, reason, s.now()); err != nil {
				res.Unresolved++
				log.Error("payments: recording the reconciled failure failed", "error", err)
				continue
			}
			res.Failed++
			log.Warn("payments: reconciled: no charge at the provider, payment failed")
		default:
			res.Unresolved++
			next := u.outboxUpdatedAt.Add(s.cfg.SettleAfter)
			if derr := s.db.repo.deferReconcile(wctx, u.ID, next); derr != nil {
				log.Error("payments: deferring the reconciliation failed", "error", derr)
			}
		}
	}
	return res, nil
}

// reconcileBackoff is the wait after the n-th unresolved look at a payment:
// ReconcileInterval·2^n, at most maxReconcileBackoff.
func (s *Service) reconcileBackoff(n int) time.Duration {
	d := s.cfg.ReconcileInterval
	for range n {
		if d >= maxReconcileBackoff/2 {
			return maxReconcileBackoff
		}
		d *= 2
	}
	return min(d, maxReconcileBackoff)
}
