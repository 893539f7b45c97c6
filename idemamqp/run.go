package idemamqp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Declare declares the queues of a Consumer of queue with cfg on conn
// (see the package documentation), durable, with the arguments it relies
// on: the work queue a quorum queue with x-delivery-limit
// (cfg.DeliveryLimit) that dead-letters at least once
// (x-dead-letter-strategy at-least-once, which needs x-overflow
// reject-publish) to the dead-letter queue; the delay queue a quorum queue
// that dead-letters the same way back to the work queue; the dead-letter
// queue a quorum queue. A nil cfg means all defaults. A queue that exists
// with other arguments is an error (PRECONDITION_FAILED): declare it so
// yourself, or delete it first. Binding the work queue to an exchange is
// the caller's.
func Declare(ctx context.Context, conn *amqp.Connection, queue string, cfg *Config) error {
	c := cfg.withDefaults(queue)
	if v, _ := conn.Properties["version"].(string); !atLeast310(v) {
		return fmt.Errorf("idemamqp: RabbitMQ %s: Declare needs 3.10 or later (quorum queues with at-least-once dead-lettering and message TTL)", v)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("idemamqp: opening a channel: %w", err)
	}
	defer ch.Close()
	deadLetterTo := func(queue string) amqp.Table {
		return amqp.Table{
			amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": queue,
			"x-dead-letter-strategy":    "at-least-once",
			amqp.QueueOverflowArg:       amqp.QueueOverflowRejectPublish,
		}
	}
	work := deadLetterTo(c.DeadLetterQueue)
	work["x-delivery-limit"] = c.DeliveryLimit
	for _, q := range []struct {
		name string
		args amqp.Table
	}{
		{c.DeadLetterQueue, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}},
		{queue, work},
		{c.DelayQueue, deadLetterTo(queue)},
	} {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, q.args); err != nil {
			return fmt.Errorf("idemamqp: declaring queue %s: %w", q.name, err)
		}
	}
	return nil
}

// atLeast310 reports whether the broker's version v is 3.10 or later; an
// unreadable version passes.
func atLeast310(v string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
		return true
	}
	return major > 3 || major == 3 && minor >= 10
}

// Declare declares the Consumer's queues, as Declare does with its queue
// and Config.
func (c *Consumer) Declare(ctx context.Context) error {
	cfg := c.cfg
	return Declare(ctx, c.conn, c.queue, &cfg)
}

// Run consumes the queue on a channel of its own with Config.Prefetch and
// processes each message (Process) in its own goroutine, until ctx ends or
// the channel closes. The messages in flight then finish, on a context
// that ctx's end does not cancel, before Run returns: nil when ctx ended,
// otherwise the reason the channel closed. Reconnecting is the caller's:
// call Run again on a Consumer of the new connection.
func (c *Consumer) Run(ctx context.Context) error {
	ch, err := c.conn.Channel()
	if err != nil {
		return fmt.Errorf("idemamqp: opening a channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("idemamqp: setting the prefetch: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	tag := "idemamqp-" + rand.Text()
	deliveries, err := ch.Consume(c.queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("idemamqp: consuming %s: %w", c.queue, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	inflight := context.WithoutCancel(ctx)
	for {
		select {
		case <-ctx.Done():
			// Stop deliveries; the ones on their way are requeued when the
			// channel closes, once those in flight are settled.
			ch.Cancel(tag, false)
			wg.Wait()
			return nil
		case d, ok := <-deliveries:
			if !ok {
				wg.Wait()
				if e, ok := <-closed; ok && e != nil {
					return fmt.Errorf("idemamqp: the channel closed: %w", e)
				}
				return errors.New("idemamqp: the channel closed")
			}
			wg.Go(func() { c.Process(inflight, &d) })
		}
	}
}
