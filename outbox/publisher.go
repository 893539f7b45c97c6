package outbox

import "context"

// Publisher sends outbox messages to one downstream and classifies each
// attempt as an Outcome, with m.IdempotencyKey as the downstream's
// deduplication key. Its Publish method is a RelayConfig.Deliver hook:
//
//	relay := outbox.NewRelay(store, &outbox.RelayConfig{Deliver: pub.Publish})
//
// The publishers of the message brokers live in packages of their own, so
// that only a program that uses one depends on its client:
// outbox/outboxnats (NATS JetStream, the key as Nats-Msg-Id) and
// outbox/outboxamqp (RabbitMQ with publisher confirms, the key as the
// message-id property). For HTTP, HTTPOutcome classifies a response.
type Publisher interface {
	// Publish sends m once and reports the outcome as the Relay reads it:
	// OutcomeDelivered once the downstream took it, OutcomeRetry when it
	// certainly did not, OutcomePermanent when it never will, and
	// OutcomeUnknown when it may have.
	Publish(ctx context.Context, m Message) (Outcome, error)
}
