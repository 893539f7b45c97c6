package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/msgkey"
)

// Handler processes one message. Its context carries the attempt: in
// transactional mode the driver's TxFromContext returns the transaction
// that commits with the record's completion, and idem.MarkUnknown,
// idem.DerivedKeyFromContext and idem.RunPhases work in it. A handler
// returns nil once the message is processed; an error means it had no
// effect, and the message comes back. A handler whose effect may have
// happened before it failed calls idem.MarkUnknown(ctx) and returns its
// error: the record becomes unknown and the message is never run again
// (see Config.Unknown). The handler neither acks nor rejects the message:
// the Consumer does. A panic marks the record unknown (released in
// transactional mode) and goes on up, as in idem.Guard.Run; the message,
// not acked, comes back when its channel closes.
type Handler func(ctx context.Context, d *amqp.Delivery) error

// Action is what a Consumer does with a message it cannot process now.
type Action int

const (
	// Hold copies the message to the delay queue with Config.HoldDelay and
	// acks it: it comes back after the delay, again and again, so it is
	// processed once the cause goes away.
	Hold Action = iota + 1
	// DeadLetter copies the message to the dead-letter queue with the
	// header x-idem-outcome and acks it.
	DeadLetter
	// RunUnprotected runs the handler without idempotency, at least once
	// as RabbitMQ delivers: for Config.MissingID only.
	RunUnprotected
)

// String returns the action's name as logs show it.
func (a Action) String() string {
	switch a {
	case Hold:
		return "hold"
	case DeadLetter:
		return "dead_letter"
	case RunUnprotected:
		return "run_unprotected"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Default values of the Config fields.
const (
	DefaultHoldDelay      = time.Minute
	DefaultDeliveryLimit  = 20
	DefaultPrefetch       = 16
	DefaultConfirmTimeout = 10 * time.Second
)

// Headers the Consumer reads and writes.
const (
	// HeaderOutcome names why the Consumer dead-lettered a message: an
	// Outcome.
	HeaderOutcome = "x-idem-outcome"
	// HeaderRoutingKey keeps a copy's first routing key, which the
	// fingerprint covers.
	HeaderRoutingKey = "x-idem-routing-key"
	// HeaderReturns counts the returns of a message's earlier copies.
	HeaderReturns = "x-idem-returns"
	// headerDeliveryCount is the quorum queue's count of returns.
	headerDeliveryCount = "x-delivery-count"
)

// Config configures a Consumer. A nil *Config means all defaults.
type Config struct {
	// Guard configures the core (idem.GuardConfig): Lease, TTL,
	// Transactional, StoreTimeout, Wait, Metrics, Tracer, Logger, Clock and
	// the others. Its zero value means idem's defaults.
	Guard idem.GuardConfig
	// MessageID returns the message's id, the record's key; "" means the
	// message has none (see MissingID). An id that is not 1–255 printable
	// ASCII characters (or shorter than Guard.MinKeyLength) is replaced by
	// "sha256:" and its hex SHA-256. Defaults to the message-id property;
	// Header reads a header instead.
	MessageID func(d *amqp.Delivery) string
	// Endpoint names the records of this consumer: messages with the same
	// id under another endpoint are other records. Defaults to
	// "amqp QUEUE".
	Endpoint string
	// MissingID is what becomes of a message without an id: Hold (with
	// HoldDelay), DeadLetter, or RunUnprotected. Defaults to Hold.
	MissingID Action
	// Unknown is what becomes of a message whose record's outcome is
	// unknown, or whose stored outcome fails verification
	// (OutcomeUntrusted): Hold (with HoldDelay) or DeadLetter. It never
	// runs again. Defaults to Hold.
	Unknown Action
	// HoldDelay is the delay of a held message (unknown or untrusted
	// outcome, missing id). Defaults to one minute.
	HoldDelay time.Duration
	// RetryDelay, when positive, is the delay of a message that could not
	// be processed now: its id in progress elsewhere, the store
	// unavailable, a per-scope limit, an outcome that could not be
	// recorded. Defaults to the core's estimate (the remaining work of the
	// attempt in progress; one second for the store; the lease for an
	// outcome not recorded).
	RetryDelay time.Duration
	// DelayQueue is the retry queue that dead-letters back to the work
	// queue. Defaults to QUEUE + ".delay".
	DelayQueue string
	// DeadLetterQueue receives the messages given up. Defaults to
	// QUEUE + ".dead".
	DeadLetterQueue string
	// DeliveryLimit is the work queue's x-delivery-limit (Declare), and the
	// returns the Consumer allows a message across its copies: past it,
	// the message is dead-lettered. Defaults to 20.
	DeliveryLimit int
	// Prefetch is Run's prefetch count, and so the number of messages it
	// processes at once, each in its own goroutine. Defaults to 16.
	Prefetch int
	// ConfirmTimeout bounds the wait for the broker's confirm of a copy.
	// Defaults to 10 seconds.
	ConfirmTimeout time.Duration
}

func (c *Config) withDefaults(queue string) Config {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.MessageID == nil {
		cfg.MessageID = func(d *amqp.Delivery) string { return d.MessageId }
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = "amqp " + queue
	}
	if cfg.MissingID == 0 {
		cfg.MissingID = Hold
	}
	if cfg.Unknown == 0 {
		cfg.Unknown = Hold
	}
	if cfg.HoldDelay <= 0 {
		cfg.HoldDelay = DefaultHoldDelay
	}
	if cfg.DelayQueue == "" {
		cfg.DelayQueue = queue + ".delay"
	}
	if cfg.DeadLetterQueue == "" {
		cfg.DeadLetterQueue = queue + ".dead"
	}
	if cfg.DeliveryLimit <= 0 {
		cfg.DeliveryLimit = DefaultDeliveryLimit
	}
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = DefaultPrefetch
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = DefaultConfirmTimeout
	}
	if cfg.Guard.Lease <= 0 {
		cfg.Guard.Lease = 30 * time.Second
	}
	if cfg.Guard.MinKeyLength <= 0 {
		cfg.Guard.MinKeyLength = 1
	}
	if cfg.Guard.Logger == nil {
		cfg.Guard.Logger = slog.Default()
	}
	return cfg
}

// Header returns a Config.MessageID that reads the header name: a string,
// or bytes, as the id.
func Header(name string) func(d *amqp.Delivery) string {
	return func(d *amqp.Delivery) string {
		switch v := d.Headers[name].(type) {
		case string:
			return v
		case []byte:
			return string(v)
		}
		return ""
	}
}

// Outcome is what a Consumer did with one delivery, as Process reports it
// and its logs name it.
type Outcome string

// The outcomes, with what the message gets.
const (
	OutcomeCompleted        Outcome = "completed"         // the handler ran, its outcome stored: ack
	OutcomeReplayed         Outcome = "replayed"          // the id had completed: ack, the handler did not run
	OutcomeFailed           Outcome = "failed"            // the handler failed: key released, requeue
	OutcomeInProgress       Outcome = "in_progress"       // another consumer runs the id: delay queue
	OutcomeUnknown          Outcome = "unknown"           // an earlier attempt may have had its effect: Config.Unknown
	OutcomeMissingID        Outcome = "missing_id"        // the message has no id: Config.MissingID
	OutcomeKeyReused        Outcome = "key_reused"        // the id came with another message: dead letter
	OutcomeStoreUnavailable Outcome = "store_unavailable" // the store failed before the handler: delay queue
	OutcomeTooManyKeys      Outcome = "too_many_keys"     // a per-scope limit refused the id: delay queue
	OutcomeNotRecorded      Outcome = "not_recorded"      // the handler ran, its outcome not stored: delay queue, never acked as done
	// OutcomeUntrusted: the id completed, but its stored outcome failed
	// verification (idem.ErrResponseUntrusted: it does not authenticate,
	// or GuardConfig.EncryptionRequired refuses it): it never runs again
	// and is held or dead-lettered as Config.Unknown says (an operator
	// looks at the record), logged as an error.
	OutcomeUntrusted     Outcome = "untrusted"
	OutcomeDeliveryLimit Outcome = "delivery_limit" // returned more often than DeliveryLimit: dead letter
)

// Consumer runs a Handler at most once per message id of one queue. It is
// safe for concurrent use: one Consumer may serve many goroutines and
// channels.
type Consumer struct {
	guard   *idem.Guard
	handler Handler
	cfg     Config
	log     *slog.Logger
	conn    *amqp.Connection
	queue   string
	pub     *confirmer
}

// New returns a Consumer of queue on conn that runs h on store. conn
// carries the copies to the delay and dead-letter queues, on channels of
// the Consumer's own in confirm mode. A nil cfg means all defaults (see
// Config). Like idem.NewGuard, it panics when cfg.Guard.Transactional is set
// and store does not implement idemstore.TxStore.
func New(conn *amqp.Connection, queue string, store idemstore.Store, h Handler, cfg *Config) *Consumer {
	c := cfg.withDefaults(queue)
	return &Consumer{
		guard:   idem.NewGuard(store, &c.Guard),
		handler: h,
		cfg:     c,
		log:     c.Guard.Logger,
		conn:    conn,
		queue:   queue,
		pub:     &confirmer{conn: conn},
	}
}

// Close closes the Consumer's publishing channels. The connection stays
// open: it is the caller's.
func (c *Consumer) Close() error { return c.pub.close() }

// Process runs the handler for d at most once per message id, then acks,
// requeues, delays or dead-letters d as the package documentation says,
// and reports what it did. d must come from a channel with manual acks. Its
// error is the handler's, the core's refusal (an *idem.Error), or the
// failure to settle d with the broker; it has been logged. ctx bounds the
// reservation and the copies, and is the handler's parent; the outcome is
// stored even when ctx ends while the handler runs.
func (c *Consumer) Process(ctx context.Context, d *amqp.Delivery) (Outcome, error) {
	dl := delivery{c: c, d: d, returns: returns(d)}
	if dl.returns > c.cfg.DeliveryLimit {
		return dl.settle(ctx, OutcomeDeliveryLimit, errDeliveryLimit, slog.LevelError,
			"idemamqp: message returned more often than the delivery limit; dead-lettered", c.deadLetter)
	}
	id := c.cfg.MessageID(d)
	if id == "" {
		return dl.missingID(ctx)
	}
	dl.id = idemstore.Identity{Endpoint: c.cfg.Endpoint, Key: c.key(id)}

	var handlerErr error
	_, replayed, err := c.guard.Run(ctx, idem.Call{
		Identity:    dl.id,
		Fingerprint: idem.FingerprintBytes(routingKey(d), d.Body),
	}, func(ctx context.Context) (idem.Result, error) {
		if err := c.handler(ctx, d); err != nil {
			handlerErr = err
			return idem.Result{}, err
		}
		return idem.Result{Status: 200}, nil
	})
	if handlerErr != nil {
		// The core released the key (or marked it unknown when the
		// handler said so); the redelivery decides again.
		return dl.settle(ctx, OutcomeFailed, handlerErr, slog.LevelInfo, "idemamqp: handler failed; requeued", requeue)
	}
	if err == nil {
		if replayed {
			return dl.settle(ctx, OutcomeReplayed, nil, slog.LevelDebug, "idemamqp: id already processed; acked without running", ack)
		}
		return dl.settle(ctx, OutcomeCompleted, nil, slog.LevelDebug, "idemamqp: processed", ack)
	}
	var ie *idem.Error
	if !errors.As(err, &ie) {
		// An invalid key, which c.key rules out.
		return dl.settle(ctx, OutcomeMissingID, err, slog.LevelError, "idemamqp: message id refused; held", c.delay(c.cfg.HoldDelay))
	}
	switch ie.Kind {
	case idem.ErrNotReplayable:
		// Completed without a stored result: processed all the same.
		return dl.settle(ctx, OutcomeReplayed, nil, slog.LevelDebug, "idemamqp: id already processed; acked without running", ack)
	case idem.ErrInProgress:
		return dl.settle(ctx, OutcomeInProgress, err, slog.LevelInfo, "idemamqp: id in progress elsewhere; to the delay queue", c.delay(c.retryDelay(ie.RetryAfter)))
	case idem.ErrOutcomeUnknown:
		if c.cfg.Unknown == DeadLetter {
			return dl.settle(ctx, OutcomeUnknown, err, slog.LevelWarn, "idemamqp: outcome of an earlier attempt unknown; not run again, dead-lettered", c.deadLetter)
		}
		return dl.settle(ctx, OutcomeUnknown, err, slog.LevelWarn, "idemamqp: outcome of an earlier attempt unknown; not run again, held until it is settled", c.delay(c.cfg.HoldDelay))
	case idem.ErrResponseUntrusted:
		if c.cfg.Unknown == DeadLetter {
			return dl.settle(ctx, OutcomeUntrusted, err, slog.LevelError, "idemamqp: stored outcome of the id failed verification; not run again, dead-lettered", c.deadLetter)
		}
		return dl.settle(ctx, OutcomeUntrusted, err, slog.LevelError, "idemamqp: stored outcome of the id failed verification; not run again, held until an operator settles it", c.delay(c.cfg.HoldDelay))
	case idem.ErrKeyReused:
		return dl.settle(ctx, OutcomeKeyReused, err, slog.LevelError, "idemamqp: message id reused with another message; dead-lettered", c.deadLetter)
	case idem.ErrTooManyKeys:
		return dl.settle(ctx, OutcomeTooManyKeys, err, slog.LevelInfo, "idemamqp: per-scope limit; to the delay queue", c.delay(c.retryDelay(ie.RetryAfter)))
	case idem.ErrNotRecorded:
		// The handler's effect happened but is not on record. The record
		// stays in progress until its lease ends, then turns unknown, so
		// the copy, back after the lease, never runs the handler again.
		return dl.settle(ctx, OutcomeNotRecorded, err, slog.LevelError, "idemamqp: handler ran but its outcome was not recorded; to the delay queue", c.delay(c.retryDelay(c.cfg.Guard.Lease)))
	}
	// ErrStoreUnavailable: the core logged the store's error.
	return dl.settle(ctx, OutcomeStoreUnavailable, err, slog.LevelWarn, "idemamqp: store unavailable; to the delay queue", c.delay(c.retryDelay(ie.RetryAfter)))
}

// missingID disposes of a message without an id as Config.MissingID says.
func (dl *delivery) missingID(ctx context.Context) (Outcome, error) {
	c := dl.c
	if m := c.cfg.Guard.Metrics; m != nil {
		m.Decision(c.cfg.Endpoint, "", idem.DecisionInvalid)
	}
	switch c.cfg.MissingID {
	case DeadLetter:
		return dl.settle(ctx, OutcomeMissingID, errMissingID, slog.LevelError, "idemamqp: message without id; dead-lettered", c.deadLetter)
	case RunUnprotected:
		if err := c.handler(ctx, dl.d); err != nil {
			return dl.settle(ctx, OutcomeFailed, err, slog.LevelInfo, "idemamqp: handler failed on a message without id (unprotected); requeued", requeue)
		}
		return dl.settle(ctx, OutcomeCompleted, nil, slog.LevelDebug, "idemamqp: message without id processed unprotected", ack)
	}
	return dl.settle(ctx, OutcomeMissingID, errMissingID, slog.LevelWarn, "idemamqp: message without id; held", c.delay(c.cfg.HoldDelay))
}

var (
	errMissingID     = errors.New("idemamqp: message without id")
	errDeliveryLimit = errors.New("idemamqp: delivery limit exceeded")
)

// A settler settles a delivery with the broker for outcome o.
type settler func(ctx context.Context, d *amqp.Delivery, o Outcome) error

func ack(_ context.Context, d *amqp.Delivery, _ Outcome) error { return d.Ack(false) }

func requeue(_ context.Context, d *amqp.Delivery, _ Outcome) error { return d.Nack(false, true) }

// delay returns the settler that copies the message to the delay queue
// with delay as its expiration, then acks it; when the copy fails it
// requeues the message instead.
func (c *Consumer) delay(delay time.Duration) settler {
	return func(ctx context.Context, d *amqp.Delivery, _ Outcome) error {
		ms := max(delay.Milliseconds(), 1)
		if err := c.publishCopy(ctx, c.cfg.DelayQueue, d, strconv.FormatInt(ms, 10), nil); err != nil {
			return errors.Join(fmt.Errorf("copying to the delay queue %s: %w", c.cfg.DelayQueue, err), d.Nack(false, true))
		}
		return d.Ack(false)
	}
}

// deadLetter copies the message to the dead-letter queue with the outcome
// in x-idem-outcome, then acks it; when the copy fails it rejects the
// message, which the work queue's dead-lettering then sends to the same
// place (with the x-death reason "rejected").
func (c *Consumer) deadLetter(ctx context.Context, d *amqp.Delivery, o Outcome) error {
	if err := c.publishCopy(ctx, c.cfg.DeadLetterQueue, d, "", amqp.Table{HeaderOutcome: string(o)}); err != nil {
		return errors.Join(fmt.Errorf("copying to the dead-letter queue %s: %w", c.cfg.DeadLetterQueue, err), d.Reject(false))
	}
	return d.Ack(false)
}

// publishCopy publishes a copy of d to queue (through the default
// exchange) and waits for the broker's confirm.
func (c *Consumer) publishCopy(ctx context.Context, queue string, d *amqp.Delivery, expiration string, extra amqp.Table) error {
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	delete(h, headerDeliveryCount)
	h[HeaderReturns] = int64(returns(d))
	h[HeaderRoutingKey] = routingKey(d)
	for k, v := range extra {
		h[k] = v
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ConfirmTimeout)
	defer cancel()
	return c.pub.publish(ctx, "", queue, amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      expiration,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          d.UserId,
		AppId:           d.AppId,
		Body:            d.Body,
	})
}

// routingKey returns the routing key d was first published with.
func routingKey(d *amqp.Delivery) string {
	if rk, ok := d.Headers[HeaderRoutingKey].(string); ok {
		return rk
	}
	return d.RoutingKey
}

// returns counts the times the broker returned d (or its earlier copies)
// to a queue: its consumer died, or its handler failed.
func returns(d *amqp.Delivery) int {
	return headerInt(d.Headers[headerDeliveryCount]) + headerInt(d.Headers[HeaderReturns])
}

// holds counts the times d went through the delay queue (x-death).
func (c *Consumer) holds(d *amqp.Delivery) int {
	deaths, _ := d.Headers["x-death"].([]any)
	n := 0
	for _, x := range deaths {
		if t, ok := x.(amqp.Table); ok && t["queue"] == c.cfg.DelayQueue {
			n += headerInt(t["count"])
		}
	}
	return n
}

func headerInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case int8:
		return int(n)
	case int16:
		return int(n)
	case int32:
		return int(n)
	case int64:
		return int(n)
	case uint8:
		return int(n)
	case uint16:
		return int(n)
	case uint32:
		return int(n)
	case uint64:
		return int(n)
	}
	return 0
}

// key returns id as the record's key, hashed when the core would refuse it.
func (c *Consumer) key(id string) string {
	return msgkey.Key(id, c.cfg.Guard.MinKeyLength, idem.MaxKeyLength)
}

// retryDelay returns RetryDelay when set, else the core's estimate (at
// least a second).
func (c *Consumer) retryDelay(estimate time.Duration) time.Duration {
	if c.cfg.RetryDelay > 0 {
		return c.cfg.RetryDelay
	}
	return max(estimate, time.Second)
}

// delivery is one message being processed.
type delivery struct {
	c       *Consumer
	d       *amqp.Delivery
	id      idemstore.Identity
	returns int
}

// settle acks, requeues, delays or dead-letters the message with f, logs
// what happened at level and returns o with err and f's error.
func (dl *delivery) settle(ctx context.Context, o Outcome, err error, level slog.Level, text string, f settler) (Outcome, error) {
	serr := f(ctx, dl.d, o)
	c := dl.c
	if serr != nil {
		level = max(level, slog.LevelWarn)
		text += " (settling the message failed; it comes back when its channel closes, or was requeued)"
	}
	if c.log.Enabled(context.Background(), level) {
		attrs := []any{"outcome", string(o), "endpoint", c.cfg.Endpoint, "queue", c.queue,
			"delivery_tag", dl.d.DeliveryTag, "redelivered", dl.d.Redelivered, "returns", dl.returns}
		if o == OutcomeUnknown || o == OutcomeUntrusted || o == OutcomeMissingID {
			attrs = append(attrs, "holds", c.holds(dl.d))
		}
		if dl.id.Key != "" {
			attrs = append(attrs, "key_hash", dl.id.LogHash())
		}
		if err != nil && err != errMissingID && err != errDeliveryLimit {
			attrs = append(attrs, "error", err)
		}
		if serr != nil {
			attrs = append(attrs, "settle_error", serr)
		}
		c.log.Log(context.Background(), level, text, attrs...)
	}
	return o, errors.Join(err, serr)
}
