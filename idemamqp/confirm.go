package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// confirmer publishes with publisher confirms, on a pool of channels of its
// own: each publish has a channel to itself until its confirm, so a
// mandatory message the broker returned (no queue took it) is told apart
// from one that was stored: the broker sends basic.return before the
// confirm, and the client queues it on the channel's return listener before
// it reports the confirm.
type confirmer struct {
	conn   *amqp.Connection
	mu     sync.Mutex
	free   []*confirmChan
	closed bool
}

type confirmChan struct {
	ch      *amqp.Channel
	returns chan amqp.Return
}

// errReturned is the error of a mandatory message no queue took.
var errReturned = errors.New("no queue took the message")

// publish publishes msg to exchange with key (mandatory) and waits for the
// broker's confirm until ctx ends.
func (p *confirmer) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	cc, err := p.get()
	if err != nil {
		return err
	}
	err = cc.publish(ctx, exchange, key, msg)
	if err != nil && !errors.Is(err, errReturned) {
		// The channel may still owe this publish its confirm or return:
		// never reuse it.
		cc.ch.Close()
		return err
	}
	p.put(cc)
	return err
}

func (cc *confirmChan) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("waiting for the broker's confirm: %w", err)
	}
	if !ok {
		return errors.New("the broker refused the message (basic.nack)")
	}
	select {
	case r := <-cc.returns:
		return fmt.Errorf("%w: %s %d %s", errReturned, key, r.ReplyCode, r.ReplyText)
	default:
		return nil
	}
}

func (p *confirmer) get() (*confirmChan, error) {
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
		return nil, errors.New("idemamqp: the consumer is closed")
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("putting a channel in confirm mode: %w", err)
	}
	// One publish at a time per channel: one return at most is pending.
	return &confirmChan{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}, nil
}

func (p *confirmer) put(cc *confirmChan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		cc.ch.Close()
		return
	}
	p.free = append(p.free, cc)
}

func (p *confirmer) close() error {
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
