package idemmaint

import (
	"context"
	"log/slog"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Default values of the Config fields.
const (
	DefaultSweepInterval     = 10 * time.Second
	DefaultReapInterval      = time.Minute
	DefaultReconcileInterval = 30 * time.Second
	DefaultBatchSize         = 1000
	DefaultScanLimit         = 10000
	DefaultPassTimeout       = 30 * time.Second
	DefaultBatchPause        = 10 * time.Millisecond
	DefaultBackoffBase       = 30 * time.Second
	DefaultBackoffMax        = time.Hour
	DefaultReconcileTimeout  = 5 * time.Second
	DefaultGrace             = time.Minute
)

// Config configures a Maintainer. A nil *Config means all defaults.
type Config struct {
	// SweepInterval is the time between two sweeps of expired leases.
	// Defaults to 10 seconds.
	SweepInterval time.Duration
	// ReapInterval is the time between two reaps of records past their
	// retention. Defaults to 1 minute.
	ReapInterval time.Duration
	// ReconcileInterval is the time between two reconciliation passes.
	// Defaults to 30 seconds.
	ReconcileInterval time.Duration
	// BatchSize bounds the records one store call sweeps, reaps or lists.
	// Defaults to 1000.
	BatchSize int
	// ScanLimit bounds the unknown records one reconciliation pass claims,
	// the ones it lists to count those it left (ReconcileResult.Left), and
	// the in_progress records it inspects to measure
	// Stats.OldestInProgress. Defaults to 10000.
	ScanLimit int
	// PassTimeout bounds each pass of each job; a pass that runs out of time
	// stops and the next one carries on. Defaults to 30 seconds.
	PassTimeout time.Duration
	// BatchPause is the pause between two batches of one background pass,
	// which lets live traffic reach the store between them. Sweep, Reap,
	// Reconcile and RunOnce do not pause. A negative value disables it.
	// Defaults to 10 milliseconds.
	BatchPause time.Duration

	// Reconcile settles one unknown record, typically by asking the
	// downstream whether the operation with the record's derived key
	// happened (idem.DeriveKey). It returns StateCompleted (with the
	// response to replay, or nil for a record that is not replayable) or
	// StateReleased, or an empty Resolution when it cannot tell yet; an
	// error or a panic counts as unresolved, and is stored on the record
	// (Record.ReconcileError) with the next attempt's time. It is called
	// for records the pass claimed in the store, so maintainers sharing a
	// store never ask about the same record at once, from up to
	// ReconcileConcurrency goroutines at once (one by default), with a
	// context that ends after ReconcileTimeout. Defaults to nil: unknown
	// records are only counted (Stats.UnknownBacklog), never resolved.
	Reconcile func(ctx context.Context, rec *idemstore.Record) (Resolution, error)
	// Grace is how long after an unknown record's lease ended
	// (Record.LockedUntil) the reconciler waits before it asks about the
	// record: records inside the grace are not claimed. It must cover the
	// longest time the downstream may still act on a request it was sent
	// (a request still on its way, a handler still running after its
	// attempt gave the lease up): asked earlier, the downstream may answer
	// that the operation never happened when it is about to, and the retry
	// that follows the release runs it a second time. Set it to at least
	// the bound on the handler's downstream call (idem proxy's upstream
	// timeout), and never less than the lease. A negative value disables
	// it. Defaults to 1 minute (DefaultGrace): idem proxy's upstream
	// timeout, and twice the middleware's default lease.
	Grace time.Duration
	// ReconcileBackoff spaces the attempts at an unresolved record; the
	// next attempt's time is kept in the store (Record.ReconcileAfter).
	// Defaults to a Base of 30 seconds and a Max of 1 hour.
	ReconcileBackoff Backoff
	// ReconcileConcurrency is the number of records a pass reconciles at
	// once: Config.Reconcile is called from up to that many goroutines.
	// Defaults to 1.
	ReconcileConcurrency int
	// ReconcileTimeout bounds each call of Config.Reconcile: the call's
	// context ends after it, and a call that runs out is an unresolved
	// attempt. A pass claims only the records it can reconcile in the time
	// it has left even if every call takes all of it: ReconcileConcurrency
	// records for every ReconcileTimeout in nine tenths of that time (the
	// rest is kept for the store's writes); the others stay unclaimed for
	// the next pass or another maintainer, and are counted
	// (ReconcileResult.Left). Defaults to 5 seconds; at most half of
	// PassTimeout (a longer one is cut to it).
	ReconcileTimeout time.Duration

	// Logger receives the maintainer's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock: records' ages and the reconciler's backoff are
	// measured on it (the store has its own clock). Defaults to time.Now.
	Now func() time.Time

	// OnSweep, when set, is called after every sweep pass with the number
	// of records swept and the pass's error. Defaults to nil.
	//
	// The hooks run on the goroutine of the pass, before the next pass of
	// the same job can start: they should return quickly and must not call
	// the Maintainer's pass methods (Sweep, Reap, Reconcile, RunOnce).
	OnSweep func(n int, err error)
	// OnReap, when set, is called after every reap pass with the number of
	// records deleted and the pass's error. Defaults to nil.
	OnReap func(n int, err error)
	// OnReconcile, when set, is called after every reconciliation pass with
	// its result and error. Defaults to nil.
	OnReconcile func(res ReconcileResult, err error)
}

// Backoff is an exponential backoff with jitter: the n-th retry of a record
// waits between half and all of min(Base·2^(n-1), Max).
type Backoff struct {
	// Base is the full delay before the first retry. Defaults to 30 seconds.
	Base time.Duration
	// Max caps the delay. Defaults to 1 hour (or Base, if Base is larger).
	Max time.Duration
}

// withDefaults returns a copy of cfg (which may be nil) with every zero field
// set to its default. It is the only place defaults are applied.
func (cfg *Config) withDefaults() Config {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.ReapInterval <= 0 {
		c.ReapInterval = DefaultReapInterval
	}
	if c.ReconcileInterval <= 0 {
		c.ReconcileInterval = DefaultReconcileInterval
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.ScanLimit <= 0 {
		c.ScanLimit = DefaultScanLimit
	}
	if c.PassTimeout <= 0 {
		c.PassTimeout = DefaultPassTimeout
	}
	switch {
	case c.BatchPause == 0:
		c.BatchPause = DefaultBatchPause
	case c.BatchPause < 0:
		c.BatchPause = 0
	}
	switch {
	case c.Grace == 0:
		c.Grace = DefaultGrace
	case c.Grace < 0:
		c.Grace = 0
	}
	if c.ReconcileBackoff.Base <= 0 {
		c.ReconcileBackoff.Base = DefaultBackoffBase
	}
	if c.ReconcileBackoff.Max <= 0 {
		c.ReconcileBackoff.Max = DefaultBackoffMax
	}
	c.ReconcileBackoff.Max = max(c.ReconcileBackoff.Max, c.ReconcileBackoff.Base)
	if c.ReconcileConcurrency <= 0 {
		c.ReconcileConcurrency = 1
	}
	if c.ReconcileTimeout <= 0 {
		c.ReconcileTimeout = DefaultReconcileTimeout
	}
	c.ReconcileTimeout = min(c.ReconcileTimeout, c.PassTimeout/2)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
