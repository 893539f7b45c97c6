package outbox

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Default values of the RelayConfig fields.
const (
	DefaultMaxAttempts    = 8
	DefaultBatchSize      = 100
	DefaultPollInterval   = time.Second
	DefaultPassTimeout    = time.Minute
	DefaultDeliverTimeout = 30 * time.Second
	DefaultStoreTimeout   = 5 * time.Second
	DefaultBackoffBase    = time.Second
	DefaultBackoffMax     = 10 * time.Minute
)

// RelayConfig configures a Relay. Deliver is required.
type RelayConfig struct {
	// Deliver sends one message to the downstream, with m.IdempotencyKey as
	// the downstream's idempotency key, and reports the outcome. Its context
	// ends after DeliverTimeout; it must return by then, or the claim may
	// expire and another relay send the message concurrently (still with
	// the same key). A returned error is logged and stored as the message's
	// last error. Calls are sequential within a relay. Required: it has no
	// default.
	Deliver func(ctx context.Context, m Message) (Outcome, error)
	// OnUnknown, when set, settles an attempt whose outcome was unknown,
	// typically by asking the downstream for the operation by
	// m.IdempotencyKey: OutcomeDelivered if it happened (the message is
	// done), OutcomeRetry if it certainly did not (sent again after a
	// backoff), OutcomePermanent to dead-letter it, OutcomeUnknown if it
	// cannot tell yet (tried again after a backoff). It runs right after the
	// attempt, with a DeliverTimeout of its own. Defaults to nil: an unknown
	// outcome is retried like OutcomeRetry, with the same key.
	OnUnknown func(ctx context.Context, m Message) (Outcome, error)
	// MaxAttempts is the number of attempts after which a message that still
	// fails is dead-lettered. Defaults to 8.
	MaxAttempts int
	// Backoff spaces the attempts. Defaults to a Base of 1 second and a Max
	// of 10 minutes.
	Backoff Backoff
	// BatchSize bounds the messages one pass claims. Defaults to 100.
	BatchSize int
	// PollInterval is the pause between passes that found less than a full
	// batch; Notify cuts it short. Defaults to 1 second.
	PollInterval time.Duration
	// PassTimeout bounds a pass: messages not attempted by then are handed
	// back. A message's claim lasts PassTimeout + StoreTimeout. Defaults to
	// 1 minute.
	PassTimeout time.Duration
	// DeliverTimeout bounds one call of Deliver, and one of OnUnknown.
	// Defaults to 30 seconds, and to PassTimeout when that is shorter.
	DeliverTimeout time.Duration
	// StoreTimeout bounds each write of an outcome, which runs on a context
	// detached from the relay's so that an attempt made is recorded.
	// Defaults to 5 seconds.
	StoreTimeout time.Duration
	// Rand draws the backoff jitter; it is used under the relay's lock.
	// Defaults to the math/rand/v2 global source. Tests pass a seeded one.
	Rand *rand.Rand
	// OnPass, when set, is called after every pass of a started relay with
	// the number of messages attempted and the pass's error. Defaults to nil.
	OnPass func(n int, err error)
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the relay's clock: claims, due times and backoff are computed
	// on it. Defaults to time.Now.
	Now func() time.Time
}

// Backoff is an exponential backoff with full jitter: after the n-th failed
// attempt the message waits a uniformly random duration between zero and
// min(Base·2^(n-1), Max).
type Backoff struct {
	// Base is the cap of the first wait. Defaults to 1 second.
	Base time.Duration
	// Max caps every wait. Defaults to 10 minutes (or Base, if larger).
	Max time.Duration
}

// Cap returns the largest wait after the attempt-th failed attempt:
// min(Base·2^(attempt-1), Max).
func (b Backoff) Cap(attempt int) time.Duration {
	d := b.Base
	for i := 1; i < attempt && d < b.Max; i++ {
		if d > b.Max/2 {
			return b.Max
		}
		d *= 2
	}
	return min(d, b.Max)
}

// withDefaults returns a copy of c with every zero field set to its default.
// It is the only place defaults are applied.
func (c *RelayConfig) withDefaults() RelayConfig {
	var cfg RelayConfig
	if c != nil {
		cfg = *c
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.Backoff.Base <= 0 {
		cfg.Backoff.Base = DefaultBackoffBase
	}
	if cfg.Backoff.Max <= 0 {
		cfg.Backoff.Max = DefaultBackoffMax
	}
	cfg.Backoff.Max = max(cfg.Backoff.Max, cfg.Backoff.Base)
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.PassTimeout <= 0 {
		cfg.PassTimeout = DefaultPassTimeout
	}
	if cfg.DeliverTimeout <= 0 {
		cfg.DeliverTimeout = DefaultDeliverTimeout
	}
	cfg.DeliverTimeout = min(cfg.DeliverTimeout, cfg.PassTimeout)
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}
