package idemmaint

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// ErrStarted is returned by Start when the Maintainer was already started or
// stopped: a Maintainer runs once.
var ErrStarted = errors.New("idemmaint: maintainer already started or stopped")

// Maintainer runs the sweeper, the reaper and the reconciler against one
// store, in the background (Start, Stop) or one pass at a time (RunOnce,
// Sweep, Reap, Reconcile). It is safe for concurrent use; passes of the same
// job never overlap.
type Maintainer struct {
	store idemstore.Store
	cfg   Config

	// sweepMu, reapMu and reconcileMu serialise the passes of each job.
	sweepMu, reapMu sync.Mutex
	reconcileMu     sync.Mutex

	statsMu sync.Mutex
	stats   Stats

	runMu   sync.Mutex
	started bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// Stats is a snapshot of a Maintainer's counters and gauges, for metrics.
// Totals count since New; gauges are as of the last pass that measured them.
type Stats struct {
	// Swept counts the expired leases the sweeper settled.
	Swept int64
	// Reaped counts the records the reaper deleted.
	Reaped int64
	// Completed and Released count the unknown records the reconciler
	// settled to each state.
	Completed, Released int64
	// Lost counts resolutions that found the record already settled (or
	// taken over, or gone) by someone else.
	Lost int64
	// ReconcileErrors counts the calls of Config.Reconcile that failed,
	// panicked or returned an invalid resolution.
	ReconcileErrors int64
	// ReconcileScheduled counts the attempts that left a record unknown and
	// scheduled its next attempt, after a backoff, in the store.
	ReconcileScheduled int64
	// PassErrors counts the passes of any job that ended with an error
	// (store unavailable, pass timeout).
	PassErrors int64

	// Unresolved is the number of unknown records the last reconciliation
	// pass tried and could not resolve (waiting for their next attempt).
	Unresolved int
	// MaxAttempts is the most failed attempts any of those records has had.
	MaxAttempts int
	// ReconcileLeft is the number of due unknown records the last
	// reconciliation pass could not reconcile in its time and left for the
	// next pass (ReconcileResult.Left): when it stays above zero, raise
	// Config.ReconcileConcurrency.
	ReconcileLeft int
	// UnknownBacklog is the number of unknown records in the store, counted
	// by the store (KeyBacklog) at the end of the last reconciliation pass:
	// every maintainer on the store reports the same.
	UnknownBacklog int
	// UnknownBacklogTruncated is always false: the backlog is counted in
	// the store, not listed up to a limit. It is kept for compatibility.
	UnknownBacklogTruncated bool
	// OldestUnknown is the age (on Config.Now) of the oldest unknown record
	// in the store, since it turned unknown, as of the last reconciliation
	// pass; zero when there is none.
	OldestUnknown time.Duration
	// OldestInProgress is the age (since StartedAt) of the oldest
	// in_progress record with a live lease, among the first
	// Config.ScanLimit listed; zero when there is none. It is measured
	// after each background reconciliation pass and by RunOnce.
	OldestInProgress time.Duration

	// LastSweep, LastReap and LastReconcile are when the last pass of each
	// job finished, on Config.Now, whether or not it succeeded.
	LastSweep, LastReap, LastReconcile time.Time
}

// New returns a Maintainer for store. cfg may be nil.
func New(store idemstore.Store, cfg *Config) *Maintainer {
	return &Maintainer{
		store: store,
		cfg:   cfg.withDefaults(),
	}
}

// Stats returns a snapshot of the counters and gauges.
func (m *Maintainer) Stats() Stats {
	m.statsMu.Lock()
	defer m.statsMu.Unlock()
	return m.stats
}

// updateStats applies f to the stats under their lock.
func (m *Maintainer) updateStats(f func(s *Stats)) {
	m.statsMu.Lock()
	defer m.statsMu.Unlock()
	f(&m.stats)
}

// Start starts the sweeper, the reaper and the reconciler on goroutines of
// their own and returns at once. Each job runs a pass immediately and then
// every interval, until ctx is done or Stop is called. Start returns
// ErrStarted when called a second time, or after Stop.
func (m *Maintainer) Start(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	if m.started {
		return ErrStarted
	}
	m.started = true
	ctx, m.cancel = context.WithCancel(ctx)
	jobs := []struct {
		every time.Duration
		pass  func(ctx context.Context)
	}{
		{m.cfg.SweepInterval, func(ctx context.Context) { m.sweep(ctx, m.cfg.BatchPause) }},
		{m.cfg.ReapInterval, func(ctx context.Context) { m.reap(ctx, m.cfg.BatchPause) }},
		{m.cfg.ReconcileInterval, func(ctx context.Context) {
			m.reconcile(ctx, m.cfg.BatchPause)
			m.measure(ctx)
		}},
	}
	m.wg.Add(len(jobs))
	for _, j := range jobs {
		go func() {
			defer m.wg.Done()
			m.loop(ctx, j.every, j.pass)
		}()
	}
	return nil
}

// loop runs pass now and then every interval until ctx is done.
func (m *Maintainer) loop(ctx context.Context, every time.Duration, pass func(ctx context.Context)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Stop stops the background jobs and waits until they have returned; a pass
// in flight sees its context canceled. Stop is safe to call more than once,
// concurrently, and without Start; after it, Start returns ErrStarted.
func (m *Maintainer) Stop() {
	m.runMu.Lock()
	m.started = true
	if m.cancel != nil {
		m.cancel()
	}
	m.runMu.Unlock()
	m.wg.Wait()
}

// RunOnce runs one pass of each job, in order: sweep (so leases that just
// expired are reconciled in the same run), reap, reconcile, and the
// measurement of the in_progress records for Stats. It runs every job even
// when one fails and returns their errors joined. It does not pause between
// batches.
func (m *Maintainer) RunOnce(ctx context.Context) error {
	_, errSweep := m.Sweep(ctx)
	_, errReap := m.Reap(ctx)
	_, errReconcile := m.Reconcile(ctx)
	errMeasure := m.measure(ctx)
	return errors.Join(errSweep, errReap, errReconcile, errMeasure)
}

// passContext returns the context of one pass, bounded by PassTimeout.
func (m *Maintainer) passContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, m.cfg.PassTimeout)
}

// pause waits d between two batches of a background pass. It returns false
// when ctx is done first.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
