package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idem-dev/idem/outbox"
)

// deliver is the relays' Deliver hook: it charges one payment at the
// provider with the payment's derived key and records the outcome on the
// payment. Event rows (payment.succeeded) go to Config.Events instead.
//
//   - A settled payment is not charged again: the row is done.
//   - A payment whose earlier attempt may have reached the provider (its
//     status is requires_reconciliation, or this is not the first attempt)
//     is first looked up by its key; a charge found settles it, so the
//     provider is never blindly charged again. When none is found the
//     charge is sent, with the same key, which the provider deduplicates.
//   - 2xx: succeeded. A timeout or a dropped connection: the outcome is
//     unknown, the payment requires reconciliation and the row is retried
//     after a backoff (the reconciler may settle it first).
//   - A refusal before any charge (503, a refused connection) is retried
//     with backoff; on the last attempt, and on a permanent refusal (4xx),
//     the payment fails — after one more lookup, and only if no earlier
//     attempt had an unknown outcome (those the reconciler settles).
func (s *Service) deliver(ctx context.Context, m outbox.Message) (outbox.Outcome, error) {
	if m.Topic == TopicPaymentSucceeded {
		return s.publishEvent(ctx, m)
	}
	log := s.log.With("outbox_id", m.ID, "attempt", m.Attempts)
	if m.Topic != topicCharge {
		return outbox.OutcomePermanent, fmt.Errorf("unknown topic %q", m.Topic)
	}
	var msg chargeMessage
	if err := json.Unmarshal(m.Payload, &msg); err != nil || msg.PaymentID == "" {
		return outbox.OutcomePermanent, errors.New("the message names no payment")
	}
	log = log.With("payment_id", msg.PaymentID)
	p, err := s.db.repo.byID(ctx, msg.PaymentID)
	switch {
	case errors.Is(err, errNotFound):
		return outbox.OutcomePermanent, errors.New("the payment does not exist")
	case err != nil:
		return outbox.OutcomeRetry, fmt.Errorf("reading the payment: %w", err)
	case p.settled():
		log.Info("payments: payment already settled, not charging", "status", string(p.Status))
		return outbox.OutcomeDelivered, nil
	}

	if p.Status == StatusRequiresReconciliation || m.Attempts > 1 {
		ch, found, err := s.provider.lookup(ctx, p.providerKey)
		if err != nil {
			// Nothing was sent: try again later, asking first again.
			return outbox.OutcomeRetry, err
		}
		if found {
			log.Info("payments: an earlier attempt had charged", "charge_id", ch.ID)
			return s.succeed(ctx, log, p, ch)
		}
	}

	ch, outcome, err := s.provider.charge(ctx, p)
	switch outcome {
	case outbox.OutcomeDelivered:
		s.crash(CrashAfterCharge)
		return s.succeed(ctx, log, p, ch)
	case outbox.OutcomeUnknown:
		log.Warn("payments: charge outcome unknown, the payment requires reconciliation", "error", err)
		if _, merr := s.db.repo.markUnknown(context.WithoutCancel(ctx), p.ID, s.now()); merr != nil {
			log.Error("payments: marking the payment for reconciliation failed", "error", merr)
		}
		return outbox.OutcomeUnknown, err
	case outbox.OutcomeRetry:
		if m.Attempts < s.cfg.MaxAttempts {
			return outbox.OutcomeRetry, err
		}
	}
	// A permanent refusal, or the last attempt refused.
	return s.giveUp(ctx, log, p, outcome, err)
}

// succeed records the charge on the payment, with its payment.succeeded
// event in the same transaction when the service publishes events. When
// that write fails the
// charge exists but the payment does not say so: the row is retried, and
// the next attempt finds the charge by its key.
func (s *Service) succeed(ctx context.Context, log *slog.Logger, p *Payment, ch *charge) (outbox.Outcome, error) {
	now := s.now()
	changed, err := s.db.repo.markSucceeded(context.WithoutCancel(ctx), s.db.outbox, p.ID, ch.ID, now, s.succeededEvent(p, ch.ID, now))
	if err != nil {
		log.Error("payments: recording the charge failed; the next attempt will find it", "charge_id", ch.ID, "error", err)
		return outbox.OutcomeRetry, fmt.Errorf("recording charge %s: %w", ch.ID, err)
	}
	if changed {
		log.Debug("payments: payment succeeded", "charge_id", ch.ID)
	}
	return outbox.OutcomeDelivered, nil
}

// giveUp ends a payment the provider refused: one more lookup, then failed,
// unless an earlier attempt had an unknown outcome, which the reconciler
// settles.
func (s *Service) giveUp(ctx context.Context, log *slog.Logger, p *Payment, outcome outbox.Outcome, cause error) (outbox.Outcome, error) {
	if errors.Is(cause, outbox.ErrInFlight) {
		// The provider is still running an earlier attempt: the charge may
		// yet commit, so the payment cannot fail; the reconciler settles it.
		log.Warn("payments: giving up while the provider still runs an earlier attempt; the payment requires reconciliation", "error", cause)
		if _, merr := s.db.repo.markUnknown(context.WithoutCancel(ctx), p.ID, s.now()); merr != nil {
			log.Error("payments: marking the payment for reconciliation failed", "error", merr)
		}
		return outbox.OutcomeUnknown, cause
	}
	ch, found, err := s.provider.lookup(ctx, p.providerKey)
	switch {
	case err != nil:
		log.Warn("payments: giving up, but the provider could not be asked; the payment requires reconciliation", "error", err)
		if _, merr := s.db.repo.markUnknown(context.WithoutCancel(ctx), p.ID, s.now()); merr != nil {
			log.Error("payments: marking the payment for reconciliation failed", "error", merr)
		}
		return outcome, cause
	case found:
		log.Info("payments: an earlier attempt had charged", "charge_id", ch.ID)
		return s.succeed(ctx, log, p, ch)
	case p.Status == StatusRequiresReconciliation:
		log.Warn("payments: giving up; an earlier attempt's outcome is unknown, the reconciler settles the payment", "error", cause)
		return outcome, cause
	}
	reason := "the provider refused the charge"
	if outcome == outbox.OutcomeRetry {
		reason = fmt.Sprintf("the provider was unavailable for %d attempts", s.cfg.MaxAttempts)
	}
	if _, err := s.db.repo.markFailed(context.WithoutCancel(ctx), p.ID, reason, s.now()); err != nil {
		log.Error("payments: recording the failure failed; the reconciler settles the payment", "error", err)
	} else {
		log.Warn("payments: payment failed", "reason", reason, "error", cause)
	}
	return outcome, cause
}
