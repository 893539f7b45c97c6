// Package outboxnats publishes outbox messages to NATS JetStream: an
// outbox.Publisher whose Publish is a Relay's Deliver hook.
//
// Each message is published to its subject (the topic by default) with
// its payload as the data and its idempotency key in the Nats-Msg-Id
// header, and Publish waits for the stream's acknowledgement. A relay that
// sends a message again (its earlier attempt timed out, or its relay died
// before recording it) sends the same Nats-Msg-Id, which the stream's
// duplicate window (StreamConfig.Duplicates, two minutes by default) drops:
// the acknowledgement then says Duplicate, and the message is delivered
// once. A republish after the window is stored again; a consumer on
// idemnats (its default id is Nats-Msg-Id) still runs it once, as long as
// its record's retention lasts.
//
// Outcomes: the stream's acknowledgement (a duplicate's too) is
// OutcomeDelivered; no stream for the subject, a refusal by the stream (a
// JetStream API error) or a closed connection is OutcomeRetry (nothing was
// stored); a message over the server's payload limit or an invalid subject
// is OutcomePermanent; a timeout or any other error is OutcomeUnknown (the
// stream may have stored it: the relay sends it again with the same id).
package outboxnats

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem/outbox"
)

// Config configures a Publisher. A nil *Config means all defaults.
type Config struct {
	// Subject returns the subject of m. Defaults to m.Topic.
	Subject func(m outbox.Message) string
}

// Publisher publishes outbox messages to JetStream. It is safe for
// concurrent use.
type Publisher struct {
	js      jetstream.JetStream
	subject func(m outbox.Message) string
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a Publisher on js. A nil cfg means all defaults.
func New(js jetstream.JetStream, cfg *Config) *Publisher {
	p := &Publisher{js: js, subject: func(m outbox.Message) string { return m.Topic }}
	if cfg != nil && cfg.Subject != nil {
		p.subject = cfg.Subject
	}
	return p
}

// Publish publishes m with its idempotency key as Nats-Msg-Id and waits
// for the stream's acknowledgement until ctx ends (see the package
// documentation for the outcomes).
func (p *Publisher) Publish(ctx context.Context, m outbox.Message) (outbox.Outcome, error) {
	subject := p.subject(m)
	msg := nats.NewMsg(subject)
	msg.Data = m.Payload
	msg.Header.Set(jetstream.MsgIDHeader, m.IdempotencyKey)
	_, err := p.js.PublishMsg(ctx, msg)
	if err == nil {
		return outbox.OutcomeDelivered, nil
	}
	err = fmt.Errorf("publishing to %s: %w", subject, err)
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return outbox.OutcomeRetry, fmt.Errorf("%w (no stream takes the subject)", err)
	case errors.As(err, &apiErr), errors.Is(err, nats.ErrConnectionClosed):
		return outbox.OutcomeRetry, err
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject):
		return outbox.OutcomePermanent, err
	}
	return outbox.OutcomeUnknown, err
}
