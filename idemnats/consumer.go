package idemnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
// (see Config.Unknown). The handler neither acks nor naks the message: the
// Consumer does. A panic marks the record unknown (released in
// transactional mode) and goes on up, as in idem.Guard.Run; the message,
// not acked, comes back after AckWait.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// Action is what a Consumer does with a message it cannot process now.
type Action int

const (
	// Nak naks the message with Config.HoldDelay: it stays un-acked and
	// JetStream redelivers it, so it is processed once the cause goes away.
	Nak Action = iota + 1
	// Term terminates the message: JetStream stops delivering it to this
	// consumer and publishes a MSG_TERMINATED advisory.
	Term
	// RunUnprotected runs the handler without idempotency, at least once
	// as JetStream delivers: for Config.MissingID only.
	RunUnprotected
)

// String returns the action's name as logs show it.
func (a Action) String() string {
	switch a {
	case Nak:
		return "nak"
	case Term:
		return "term"
	case RunUnprotected:
		return "run_unprotected"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Config configures a Consumer. A nil *Config means all defaults.
type Config struct {
	// Guard configures the core (idem.GuardConfig): Lease, TTL,
	// Transactional, StoreTimeout, Wait, Metrics, Tracer, Logger, Clock and
	// the others. Its zero value means idem's defaults.
	Guard idem.GuardConfig
	// MessageID returns the message's id, the record's key; "" means the
	// message has none (see MissingID). An id that is not 1–255 printable
	// ASCII characters (or shorter than Guard.MinKeyLength) is replaced by
	// "sha256:" and its hex SHA-256. Defaults to the Nats-Msg-Id header.
	MessageID func(msg jetstream.Msg) string
	// Endpoint names the records of this consumer: messages with the same
	// id under another endpoint are other records. Defaults to
	// "nats STREAM/CONSUMER" from each message's metadata, so use durable
	// consumers (an ephemeral consumer's name changes with every instance),
	// or set Endpoint.
	Endpoint string
	// MissingID is what becomes of a message without an id: Nak (with
	// HoldDelay), Term, or RunUnprotected. Defaults to Nak.
	MissingID Action
	// Unknown is what becomes of a message whose record's outcome is
	// unknown, or whose stored outcome fails verification
	// (OutcomeUntrusted): Nak (with HoldDelay) or Term. It never runs
	// again. Defaults to Nak.
	Unknown Action
	// HoldDelay is the redelivery delay of a held message (unknown or
	// untrusted outcome, missing id). Defaults to one minute.
	HoldDelay time.Duration
	// RetryDelay, when positive, is the redelivery delay of a message that
	// could not be processed now: its id in progress elsewhere, the store
	// unavailable, a per-scope limit, an outcome that could not be
	// recorded. Defaults to the core's estimate (the remaining work of the
	// attempt in progress; one second for the store; the lease for an
	// outcome not recorded).
	RetryDelay time.Duration
	// ErrorDelay is the redelivery delay after the handler failed on a
	// message's first delivery. It doubles with each later delivery
	// (the message's NumDelivered) up to MaxErrorDelay, jittered down to
	// half, so that a message that always fails comes back ever more
	// slowly instead of at once (with an unlimited MaxDeliver, for ever,
	// at two store writes a turn), and messages that failed together do
	// not come back together. Defaults to one second; a negative value
	// naks at once, the former default.
	ErrorDelay time.Duration
	// MaxErrorDelay bounds the growth of ErrorDelay. Defaults to five
	// minutes (and to ErrorDelay when that is longer).
	MaxErrorDelay time.Duration
	// MaxDeliver is the consumer's MaxDeliver (jetstream.ConsumerConfig),
	// when it has one: on that delivery a message that would be nak'ed
	// (its handler failed, it is held as unknown or without an id, its id
	// is in progress elsewhere, the store is down) is terminated instead,
	// with the reason, logged as an error and counted (OutcomeMaxDeliveries),
	// where JetStream would stop delivering it without a word. Set it to
	// the consumer's value: a larger one leaves JetStream to drop the
	// message silently. Defaults to 0: unlimited, JetStream's default.
	MaxDeliver int
	// Conn is the connection the messages arrive on. When it is set and
	// its server understands a termination's reason (nats-server 2.10.4 and
	// later; an earlier one ignores such a termination altogether, so the
	// message would come back), the Consumer sends the reason with each
	// termination (TermWithReason) and JetStream puts it in its
	// MSG_TERMINATED advisory. Defaults to none: a plain Term; the reason
	// is in the log.
	Conn *nats.Conn
}

func (c *Config) withDefaults() Config {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.MessageID == nil {
		cfg.MessageID = func(msg jetstream.Msg) string { return msg.Headers().Get(jetstream.MsgIDHeader) }
	}
	if cfg.MissingID == 0 {
		cfg.MissingID = Nak
	}
	if cfg.Unknown == 0 {
		cfg.Unknown = Nak
	}
	if cfg.HoldDelay <= 0 {
		cfg.HoldDelay = time.Minute
	}
	if cfg.ErrorDelay == 0 {
		cfg.ErrorDelay = time.Second
	}
	if cfg.MaxErrorDelay <= 0 {
		cfg.MaxErrorDelay = 5 * time.Minute
	}
	cfg.MaxErrorDelay = max(cfg.MaxErrorDelay, cfg.ErrorDelay)
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

// Outcome is what a Consumer did with one delivery, as Process reports it
// and its logs name it.
type Outcome string

// The outcomes, with what the message gets.
const (
	OutcomeCompleted        Outcome = "completed"         // the handler ran, its outcome stored: ack
	OutcomeReplayed         Outcome = "replayed"          // the id had completed: ack, the handler did not run
	OutcomeFailed           Outcome = "failed"            // the handler failed: key released, nak
	OutcomeInProgress       Outcome = "in_progress"       // another consumer runs the id: nak with delay
	OutcomeUnknown          Outcome = "unknown"           // an earlier attempt may have had its effect: Config.Unknown
	OutcomeMissingID        Outcome = "missing_id"        // the message has no id: Config.MissingID
	OutcomeKeyReused        Outcome = "key_reused"        // the id came with another message: term
	OutcomeStoreUnavailable Outcome = "store_unavailable" // the store failed before the handler: nak with delay
	OutcomeTooManyKeys      Outcome = "too_many_keys"     // a per-scope limit refused the id: nak with delay
	OutcomeNotRecorded      Outcome = "not_recorded"      // the handler ran, its outcome not stored: nak with delay, never acked
	// OutcomeUntrusted: the id completed, but its stored outcome failed
	// verification (idem.ErrResponseUntrusted: it does not authenticate,
	// or GuardConfig.EncryptionRequired refuses it): it never runs again
	// and is held as Config.Unknown says (an operator looks at the
	// record), logged as an error.
	OutcomeUntrusted Outcome = "untrusted"
	// OutcomeMaxDeliveries: the last delivery Config.MaxDeliver allows
	// would have been nak'ed (for any of the reasons above): term with the
	// reason, logged as an error. Process's error is the cause.
	OutcomeMaxDeliveries Outcome = "max_deliveries"
)

// TermMetrics is implemented by a Config.Guard.Metrics that counts the
// messages a Consumer terminates, by endpoint and outcome (key_reused,
// unknown, untrusted, missing_id, max_deliveries); idemprom.Metrics does.
type TermMetrics interface {
	MessageTerminated(endpoint, outcome string)
}

// Consumer runs a Handler at most once per message id. It is safe for
// concurrent use: one Consumer may serve many goroutines and subscriptions.
type Consumer struct {
	guard   *idem.Guard
	handler Handler
	cfg     Config
	log     *slog.Logger
}

// New returns a Consumer that runs h on store. A nil cfg means all
// defaults (see Config). Like idem.NewGuard, it panics when
// cfg.Guard.Transactional is set and store does not implement
// idemstore.TxStore.
func New(store idemstore.Store, h Handler, cfg *Config) *Consumer {
	c := cfg.withDefaults()
	return &Consumer{guard: idem.NewGuard(store, &c.Guard), handler: h, cfg: c, log: c.Guard.Logger}
}

// Handle processes msg (see Process) with a background context. It is a
// jetstream.MessageHandler: pass it to jetstream.Consumer.Consume.
func (c *Consumer) Handle(msg jetstream.Msg) {
	c.Process(context.Background(), msg)
}

// Process runs the handler for msg at most once per message id, then acks,
// naks or terminates msg as the package documentation says, and reports
// what it did. Its error is the handler's, the core's refusal (an
// *idem.Error), or the failure to settle msg with the server; it has been
// logged. ctx bounds the reservation and is the handler's parent; the
// outcome is stored even when ctx ends while the handler runs.
func (c *Consumer) Process(ctx context.Context, msg jetstream.Msg) (Outcome, error) {
	md, err := msg.Metadata()
	if err != nil {
		c.log.Error("idemnats: not a JetStream message; left unsettled", "subject", msg.Subject(), "error", err)
		return "", fmt.Errorf("idemnats: reading the message's metadata: %w", err)
	}
	d := delivery{c: c, msg: msg, md: md, endpoint: c.cfg.Endpoint}
	if d.endpoint == "" {
		d.endpoint = "nats " + md.Stream + "/" + md.Consumer
	}
	id := c.cfg.MessageID(msg)
	if id == "" {
		return d.missingID(ctx)
	}
	d.id = idemstore.Identity{Endpoint: d.endpoint, Key: c.key(id)}

	var handlerErr error
	_, replayed, err := c.guard.Run(ctx, idem.Call{
		Identity:    d.id,
		Fingerprint: idem.FingerprintBytes(msg.Subject(), msg.Data()),
		Heartbeat:   d.inProgress,
	}, func(ctx context.Context) (idem.Result, error) {
		if err := c.handler(ctx, msg); err != nil {
			handlerErr = err
			return idem.Result{}, err
		}
		return idem.Result{Status: 200, Meta: map[string][]string{
			"Nats-Stream-Sequence": {strconv.FormatUint(md.Sequence.Stream, 10)},
		}}, nil
	})
	if handlerErr != nil {
		// The core released the key (or marked it unknown when the
		// handler said so); a redelivery decides again.
		return d.settle(OutcomeFailed, handlerErr, slog.LevelInfo, "idemnats: handler failed; nak for redelivery", nakked(c.errorDelay(d.md.NumDelivered)))
	}
	if err == nil {
		if replayed {
			return d.settle(OutcomeReplayed, nil, slog.LevelDebug, "idemnats: id already processed; acked without running", acked)
		}
		return d.settle(OutcomeCompleted, nil, slog.LevelDebug, "idemnats: processed", acked)
	}
	var ie *idem.Error
	if !errors.As(err, &ie) {
		// An invalid key, which c.key rules out.
		return d.settle(OutcomeMissingID, err, slog.LevelError, "idemnats: message id refused; held", nakked(c.cfg.HoldDelay))
	}
	switch ie.Kind {
	case idem.ErrNotReplayable:
		// Completed without a stored result: processed all the same.
		return d.settle(OutcomeReplayed, nil, slog.LevelDebug, "idemnats: id already processed; acked without running", acked)
	case idem.ErrInProgress:
		return d.settle(OutcomeInProgress, err, slog.LevelInfo, "idemnats: id in progress elsewhere; nak with delay", nakked(c.retryDelay(ie.RetryAfter)))
	case idem.ErrOutcomeUnknown:
		if c.cfg.Unknown == Term {
			return d.settle(OutcomeUnknown, err, slog.LevelWarn, "idemnats: outcome of an earlier attempt unknown; not run again, terminated", terminated)
		}
		return d.settle(OutcomeUnknown, err, slog.LevelWarn, "idemnats: outcome of an earlier attempt unknown; not run again, held until it is settled", nakked(c.cfg.HoldDelay))
	case idem.ErrResponseUntrusted:
		if c.cfg.Unknown == Term {
			return d.settle(OutcomeUntrusted, err, slog.LevelError, "idemnats: stored outcome of the id failed verification; not run again, terminated", terminated)
		}
		return d.settle(OutcomeUntrusted, err, slog.LevelError, "idemnats: stored outcome of the id failed verification; not run again, held until an operator settles it", nakked(c.cfg.HoldDelay))
	case idem.ErrKeyReused:
		return d.settle(OutcomeKeyReused, err, slog.LevelError, "idemnats: message id reused with another message; terminated", terminated)
	case idem.ErrTooManyKeys:
		return d.settle(OutcomeTooManyKeys, err, slog.LevelInfo, "idemnats: per-scope limit; nak with delay", nakked(c.retryDelay(ie.RetryAfter)))
	case idem.ErrNotRecorded:
		// The handler's effect happened but is not on record: never ack.
		// The record stays in progress until its lease ends, then turns
		// unknown, so no redelivery runs the handler again.
		return d.settle(OutcomeNotRecorded, err, slog.LevelError, "idemnats: handler ran but its outcome was not recorded; not acked", nakked(c.retryDelay(c.cfg.Guard.Lease)))
	}
	// ErrStoreUnavailable: the core logged the store's error.
	return d.settle(OutcomeStoreUnavailable, err, slog.LevelWarn, "idemnats: store unavailable; nak with delay", nakked(c.retryDelay(ie.RetryAfter)))
}

// missingID disposes of a message without an id as Config.MissingID says.
func (d *delivery) missingID(ctx context.Context) (Outcome, error) {
	c := d.c
	if m := c.cfg.Guard.Metrics; m != nil {
		m.Decision(d.endpoint, "", idem.DecisionInvalid)
	}
	switch c.cfg.MissingID {
	case Term:
		return d.settle(OutcomeMissingID, errMissingID, slog.LevelError, "idemnats: message without id; terminated", terminated)
	case RunUnprotected:
		if err := c.handler(ctx, d.msg); err != nil {
			return d.settle(OutcomeFailed, err, slog.LevelInfo, "idemnats: handler failed on a message without id (unprotected)", nakked(c.errorDelay(d.md.NumDelivered)))
		}
		return d.settle(OutcomeCompleted, nil, slog.LevelDebug, "idemnats: message without id processed unprotected", acked)
	}
	return d.settle(OutcomeMissingID, errMissingID, slog.LevelWarn, "idemnats: message without id; held", nakked(c.cfg.HoldDelay))
}

var errMissingID = errors.New("idemnats: message without id")

// settlement is what a delivery gets: an ack, a nak with a delay (at once
// for 0), or a termination.
type settlement struct {
	kind  settleKind
	delay time.Duration
}

type settleKind int

const (
	settleAck settleKind = iota
	settleNak
	settleTerm
)

var (
	acked      = settlement{kind: settleAck}
	terminated = settlement{kind: settleTerm}
)

func nakked(delay time.Duration) settlement { return settlement{kind: settleNak, delay: delay} }

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

// errorDelay returns the redelivery delay after the handler failed on the
// delivered-th delivery: ErrorDelay doubled for each delivery before it, at
// most MaxErrorDelay, jittered down to half (0 when ErrorDelay is
// negative).
func (c *Consumer) errorDelay(delivered uint64) time.Duration {
	d := c.cfg.ErrorDelay
	if d < 0 {
		return 0
	}
	for i := uint64(1); i < delivered && d < c.cfg.MaxErrorDelay; i++ {
		if d > c.cfg.MaxErrorDelay/2 {
			d = c.cfg.MaxErrorDelay
			break
		}
		d *= 2
	}
	return d/2 + rand.N(d/2+1)
}

// delivery is one message being processed.
type delivery struct {
	c        *Consumer
	msg      jetstream.Msg
	md       *jetstream.MsgMetadata
	endpoint string
	id       idemstore.Identity
}

// inProgress tells JetStream that the message is still being worked on,
// resetting its AckWait: the lease's heartbeat (idem.Call.Heartbeat).
func (d *delivery) inProgress() {
	if err := d.msg.InProgress(); err != nil {
		d.c.log.Debug("idemnats: telling JetStream the message is in progress failed", "endpoint", d.endpoint,
			"stream_seq", d.md.Sequence.Stream, "key_hash", d.id.LogHash(), "error", err)
	}
}

// last reports whether this is the last delivery Config.MaxDeliver allows.
func (d *delivery) last() bool {
	return d.c.cfg.MaxDeliver > 0 && d.md.NumDelivered >= uint64(d.c.cfg.MaxDeliver)
}

// settle acks, naks or terminates the message as s says, logs what
// happened at level and returns o with err (or the settling's error). A
// nak on the last delivery MaxDeliver allows becomes a termination
// (OutcomeMaxDeliveries). Terminations carry their reason (see
// Config.Conn) and are counted (TermMetrics).
func (d *delivery) settle(o Outcome, err error, level slog.Level, text string, s settlement) (Outcome, error) {
	c := d.c
	var cause Outcome
	if s.kind == settleNak && d.last() {
		cause, o, s = o, OutcomeMaxDeliveries, terminated
		level = slog.LevelError
		text = "idemnats: last delivery the consumer's MaxDeliver allows could not be processed; terminated so that it is not dropped silently"
	}
	var serr error
	switch s.kind {
	case settleAck:
		serr = d.msg.Ack()
	case settleNak:
		if s.delay <= 0 {
			serr = d.msg.Nak()
		} else {
			serr = d.msg.NakWithDelay(s.delay)
		}
	default:
		reason := "idemnats: " + string(o)
		if cause != "" {
			reason = fmt.Sprintf("idemnats: %s on delivery %d, the last MaxDeliver allows", cause, d.md.NumDelivered)
		}
		if c.termReason() {
			serr = d.msg.TermWithReason(reason)
		} else {
			serr = d.msg.Term()
		}
		if tm, ok := c.cfg.Guard.Metrics.(TermMetrics); ok && serr == nil {
			tm.MessageTerminated(d.endpoint, string(o))
		}
	}
	log := c.log
	if serr != nil {
		level = max(level, slog.LevelWarn)
		text += " (settling the message failed; JetStream redelivers it after AckWait)"
	}
	if log.Enabled(context.Background(), level) {
		attrs := []any{"outcome", string(o), "endpoint", d.endpoint,
			"stream_seq", d.md.Sequence.Stream, "num_delivered", d.md.NumDelivered}
		if cause != "" {
			attrs = append(attrs, "cause", string(cause), "max_deliver", c.cfg.MaxDeliver)
		}
		if d.id.Key != "" {
			attrs = append(attrs, "key_hash", d.id.LogHash())
		}
		if err != nil && err != errMissingID {
			attrs = append(attrs, "error", err)
		}
		if serr != nil {
			attrs = append(attrs, "settle_error", serr)
		}
		log.Log(context.Background(), level, text, attrs...)
	}
	if err == nil {
		err = serr
	}
	return o, err
}

// termReason reports whether a termination may carry its reason: the
// server of Config.Conn is nats-server 2.10.4 or later.
func (c *Consumer) termReason() bool {
	return c.cfg.Conn != nil && versionAtLeast(c.cfg.Conn.ConnectedServerVersion(), 2, 10, 4)
}

// versionAtLeast reports whether version ("2.10.4", "v2.11.0-beta") is at
// least major.minor.patch; a version it cannot read is not.
func versionAtLeast(version string, major, minor, patch int) bool {
	version = strings.TrimPrefix(version, "v")
	if i := strings.IndexAny(version, "-+"); i >= 0 {
		version = version[:i]
	}
	parts := strings.Split(version, ".")
	if len(parts) != 3 {
		return false
	}
	var v [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return false
		}
		v[i] = n
	}
	want := [3]int{major, minor, patch}
	for i := range v {
		if v[i] != want[i] {
			return v[i] > want[i]
		}
	}
	return true
}
