package payments

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/outbox"
)

// TopicPaymentSucceeded is the outbox topic of the event a payment
// publishes when it succeeds, and its NATS subject or AMQP routing key.
const TopicPaymentSucceeded = "payment.succeeded"

// Event is the payload of a payment.succeeded event (JSON). It is written
// to the outbox in the transaction that marks the payment succeeded, so
// there is one event per succeeded payment, and the relays publish it
// (Config.Events) with its ID as the idempotency key: the Nats-Msg-Id on
// NATS, the message-id on RabbitMQ. A consumer settles each ID once.
type Event struct {
	// ID is derived from the payment's request (its provider key, itself
	// derived from the client's Idempotency-Key): every publish of the
	// event carries the same one.
	ID          string    `json:"id"`
	Type        string    `json:"type"`
	PaymentID   string    `json:"payment_id"`
	Tenant      string    `json:"tenant"`
	CustomerID  string    `json:"customer_id"`
	AmountCents int64     `json:"amount_cents"`
	Currency    string    `json:"currency"`
	ChargeID    string    `json:"charge_id"`
	OccurredAt  time.Time `json:"occurred_at"`
}

// eventKey derives the payment.succeeded event's id from the payment's
// provider key.
func eventKey(providerKey string) string {
	sum := sha256.Sum256([]byte(TopicPaymentSucceeded + "\x00" + providerKey))
	return "evt-" + hex.EncodeToString(sum[:20])
}

// succeededEvent returns the outbox message of p's payment.succeeded event
// with charge chargeID, or nil when the service publishes no events.
func (s *Service) succeededEvent(p *Payment, chargeID string, now time.Time) *outbox.Message {
	if s.cfg.Events == nil {
		return nil
	}
	ev := Event{
		ID:          eventKey(p.providerKey),
		Type:        TopicPaymentSucceeded,
		PaymentID:   p.ID,
		Tenant:      p.tenant,
		CustomerID:  p.CustomerID,
		AmountCents: p.AmountCents,
		Currency:    p.Currency,
		ChargeID:    chargeID,
		OccurredAt:  now,
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		panic(err) // strings, numbers and a time
	}
	return &outbox.Message{Topic: TopicPaymentSucceeded, Payload: payload, IdempotencyKey: ev.ID}
}

// errNoEvents is the error of an event row when the service runs without
// Config.Events.
var errNoEvents = errors.New("the service publishes no events (start it with --events): the event waits, and is dead-lettered after its attempts")

// publishEvent is the relays' Deliver hook for event rows.
func (s *Service) publishEvent(ctx context.Context, m outbox.Message) (outbox.Outcome, error) {
	if s.cfg.Events == nil {
		return outbox.OutcomeRetry, errNoEvents
	}
	o, err := s.cfg.Events.Publish(ctx, m)
	if err != nil {
		err = fmt.Errorf("publishing %s: %w", m.Topic, err)
	}
	return o, err
}
