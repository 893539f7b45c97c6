// Package outboxamqp publishes outbox messages to RabbitMQ with publisher
// confirms: an outbox.Publisher whose Publish is a Relay's Deliver hook.
//
// Each message is published to Config.Exchange with its topic as the
// routing key (Config.RoutingKey), its payload as the body
// (application/json, persistent), its idempotency key as the message-id
// property and its topic as the type property, mandatory, on a channel in
// confirm mode; Publish returns once the broker confirmed it. RabbitMQ
// does not deduplicate: a relay that sends a message again (its earlier
// attempt's confirm was lost, or its relay died before recording it)
// stores it twice, with the same message-id, and the consumer deduplicates
// on it, as idemamqp does by default.
//
// Outcomes: the broker's confirm is OutcomeDelivered; a message no queue
// took (returned: no binding matched, or the exchange's queue is gone), a
// negative confirm (basic.nack) or a channel that could not be opened is
// OutcomeRetry (nothing was stored); a timeout waiting for the confirm, or
// a connection lost after the message was sent, is OutcomeUnknown (the
// relay sends it again with the same message-id).
package outboxamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem/outbox"
)

// Config configures a Publisher. A nil *Config means all defaults.
type Config struct {
	// Exchange is the exchange the messages are published to. Defaults to
	// "", the default exchange, where the routing key names a queue.
	Exchange string
	// RoutingKey returns the routing key of m. Defaults to m.Topic.
	RoutingKey func(m outbox.Message) string
}

// Publisher publishes outbox messages to RabbitMQ with publisher confirms,
// on a pool of channels of its own. It is safe for concurrent use; Close
// closes its channels.
type Publisher struct {
	conn       *amqp.Connection
	exchange   string
	routingKey func(m outbox.Message) string

	mu     sync.Mutex
	free   []*confirmChan
	closed bool
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a Publisher on conn. A nil cfg means all defaults.
func New(conn *amqp.Connection, cfg *Config) *Publisher {
	p := &Publisher{conn: conn, routingKey: func(m outbox.Message) string { return m.Topic }}
	if cfg != nil {
		p.exchange = cfg.Exchange
		if cfg.RoutingKey != nil {
			p.routingKey = cfg.RoutingKey
		}
	}
	return p
}

// errReturned is the error of a message no queue took.
var errReturned = errors.New("no queue took the message")

// Publish publishes m and waits for the broker's confirm until ctx ends
// (see the package documentation for the outcomes).
func (p *Publisher) Publish(ctx context.Context, m outbox.Message) (outbox.Outcome, error) {
	key := p.routingKey(m)
	cc, err := p.get()
	if err != nil {
		return outbox.OutcomeRetry, err
	}
	dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, p.exchange, key, true, false, amqp.Publishing{
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    m.IdempotencyKey,
		Type:         m.Topic,
		Body:         m.Payload,
	})
	if err != nil {
		cc.ch.Close()
		if errors.Is(err, amqp.ErrClosed) || ctx.Err() != nil {
			// The channel was closed, or ctx had ended: nothing was sent.
			return outbox.OutcomeRetry, fmt.Errorf("publishing to %q with key %s: %w", p.exchange, key, err)
		}
		return outbox.OutcomeUnknown, fmt.Errorf("publishing to %q with key %s: %w", p.exchange, key, err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil || !ok && cc.ch.IsClosed() {
		// The confirm may still come, or never will: the broker may have
		// the message. The channel is not reused.
		cc.ch.Close()
		if err == nil {
			err = errors.New("the channel closed before the broker confirmed")
		}
		return outbox.OutcomeUnknown, fmt.Errorf("waiting for the broker's confirm: %w", err)
	}
	if !ok {
		p.put(cc)
		return outbox.OutcomeRetry, errors.New("the broker refused the message (basic.nack)")
	}
	select {
	case r := <-cc.returns:
		p.put(cc)
		return outbox.OutcomeRetry, fmt.Errorf("%w: exchange %q, routing key %s: %d %s", errReturned, p.exchange, key, r.ReplyCode, r.ReplyText)
	default:
		p.put(cc)
		return outbox.OutcomeDelivered, nil
	}
}

// confirmChan is a channel in confirm mode, used by one Publish at a time,
// so that a returned message is told apart from a stored one: the broker
// sends basic.return before the confirm, and the client queues it on the
// return listener before it reports the confirm.
type confirmChan struct {
	ch      *amqp.Channel
	returns chan amqp.Return
}

func (p *Publisher) get() (*confirmChan, error) {
	p.mu.Lock()
	for len(p.free) > 0 {
		cc := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		if !cc.ch.IsClosed() {
			p.mu.Unlock()
			return cc, nil
		}
	}
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, errors.New("outboxamqp: the publisher is closed")
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("putting a channel in confirm mode: %w", err)
	}
	return &confirmChan{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}, nil
}

func (p *Publisher) put(cc *confirmChan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		cc.ch.Close()
		return
	}
	p.free = append(p.free, cc)
}

// Close closes the Publisher's channels; the connection is the caller's.
// It is safe to call twice.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var errs []error
	for _, cc := range p.free {
		if err := cc.ch.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			errs = append(errs, err)
		}
	}
	p.free = nil
	return errors.Join(errs...)
}
