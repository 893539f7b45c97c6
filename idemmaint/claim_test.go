package idemmaint

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// inFlight counts the calls of a reconciler running at once.
type inFlight struct {
	mu       sync.Mutex
	now, max int
	calls    int
}

func (f *inFlight) enter() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now++
	f.calls++
	f.max = max(f.max, f.now)
}

func (f *inFlight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now--
}

func (f *inFlight) peak() (peak, calls int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.max, f.calls
}

// TestReconcileClaimsWhatItCanAsk: 50 unknown records and a lookup that
// never answers within its timeout. A pass claims only the records it can
// ask about in its time at its concurrency, even if every call takes all
// of ReconcileTimeout, asks about every one of them (4 at a time), ends
// without a deadline error, and leaves the others unclaimed: another
// maintainer can claim them at once. The result and Stats count them.
func TestReconcileClaimsWhatItCanAsk(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const (
			records     = 50
			concurrency = 4
			// A tenth of the pass, 50 ms a round, is kept for the store's
			// writes: enough under -race on a loaded machine.
			callTimeout = 500 * time.Millisecond
			passTimeout = 5 * time.Second
			// At most this many calls fit in the pass.
			fit = concurrency * int(passTimeout/callTimeout)
		)
		for i := range records {
			b.unknown(t, id(i))
		}
		var flight inFlight
		slow := func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			flight.enter()
			defer flight.leave()
			<-ctx.Done() // the downstream never answers
			return Resolution{}, ctx.Err()
		}
		m := b.newMaintainer(&Config{Reconcile: slow, ReconcileConcurrency: concurrency, ReconcileTimeout: callTimeout,
			PassTimeout: passTimeout, ReconcileBackoff: Backoff{Base: time.Hour}})
		res, err := m.Reconcile(b.ctx)
		if err != nil {
			t.Fatalf("Reconcile = %+v, %v; want no error", res, err)
		}
		t.Logf("claimed %d of %d records: %+v", res.Listed, records, res)
		peak, calls := flight.peak()
		if res.Listed == 0 || res.Listed >= fit || res.Attempted != res.Listed || res.Unresolved != res.Listed || res.Errors != res.Listed ||
			calls != res.Listed {
			t.Fatalf("Reconcile = %+v after %d calls; want fewer than %d claimed, every claimed record asked about once and unresolved", res, calls, fit)
		}
		if peak != concurrency {
			t.Fatalf("%d calls at once at most, want %d", peak, concurrency)
		}
		if res.Left != records-res.Listed || m.Stats().ReconcileLeft != res.Left {
			t.Fatalf("Left = %d, Stats().ReconcileLeft = %d; want the %d records not claimed", res.Left, m.Stats().ReconcileLeft, records-res.Listed)
		}
		if lines := b.logs.lines(t, "left due records for the next pass"); len(lines) != 1 || lines[0]["left"] != float64(res.Left) {
			t.Fatalf("want one line counting the records left:\n%s", b.logs)
		}
		// The records it did not claim are free for another maintainer now.
		rest, err := b.store.KeyReconcileClaim(b.ctx, &idemstore.ReconcileClaimParams{Limit: records, Hold: time.Minute})
		if err != nil || len(rest) != records-res.Listed {
			t.Fatalf("a second claimer got %d records, %v; want the %d left", len(rest), err, records-res.Listed)
		}
		for i := range records {
			if r := b.get(t, id(i)); r.State != idemstore.StateUnknown || r.ReconcileAttempts > 1 {
				t.Fatalf("record %d: %s after %d attempts", i, r.State, r.ReconcileAttempts)
			}
		}
		b.logs.requireNoRawKeys(t)
	})
}

// TestReconcileConcurrently: with quick answers a pass settles every due
// record, ReconcileConcurrency at a time (the first calls wait for one
// another, so the test fails unless they really run at once), and leaves
// nothing.
func TestReconcileConcurrently(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const (
			records     = 50
			concurrency = 3
		)
		for i := range records {
			b.unknown(t, id(i))
		}
		var (
			flight   inFlight
			arrived  sync.WaitGroup
			together = make(chan struct{})
		)
		arrived.Add(concurrency)
		go func() { arrived.Wait(); close(together) }()
		reconcile := func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			flight.enter()
			defer flight.leave()
			if _, calls := flight.peak(); calls <= concurrency {
				arrived.Done()
				select {
				case <-together:
				case <-ctx.Done():
					return Resolution{}, errors.New("the first calls did not run at once")
				}
			}
			return Resolution{State: idemstore.StateReleased}, nil
		}
		m := b.newMaintainer(&Config{Reconcile: reconcile, ReconcileConcurrency: concurrency, BatchSize: 7})
		res, err := m.Reconcile(b.ctx)
		if err != nil || withoutBacklog(res) != (ReconcileResult{Listed: records, Attempted: records, Released: records}) {
			t.Fatalf("Reconcile = %+v, %v; want every record released", res, err)
		}
		if peak, _ := flight.peak(); peak != concurrency {
			t.Fatalf("%d calls at once at most, want %d", peak, concurrency)
		}
		for i := range records {
			b.requireState(t, id(i), idemstore.StateReleased)
		}
	})
}

// TestReconcileOneAtATimeByDefault: without ReconcileConcurrency,
// Config.Reconcile is called from one goroutine at a time, as before.
func TestReconcileOneAtATimeByDefault(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		for i := range 20 {
			b.unknown(t, id(i))
		}
		var flight inFlight
		reconcile := func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			flight.enter()
			defer flight.leave()
			time.Sleep(time.Millisecond) // room for a second call, were there one
			return Resolution{State: idemstore.StateReleased}, nil
		}
		res, err := b.newMaintainer(&Config{Reconcile: reconcile}).Reconcile(b.ctx)
		if err != nil || res.Released != 20 {
			t.Fatalf("Reconcile = %+v, %v", res, err)
		}
		if peak, calls := flight.peak(); peak != 1 || calls != 20 {
			t.Fatalf("%d calls, %d at once at most; want 20, one at a time", calls, peak)
		}
	})
}

// TestReconcileCallTimeout: a reconciler call is bounded by
// ReconcileTimeout; one that runs out is an unresolved attempt with the
// reason, not the end of the pass.
func TestReconcileCallTimeout(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.unknown(t, id(1))
		reconcile := func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			<-ctx.Done()
			return Resolution{}, ctx.Err()
		}
		m := b.newMaintainer(&Config{Reconcile: reconcile, ReconcileTimeout: 100 * time.Millisecond, PassTimeout: 5 * time.Second})
		res, err := m.Reconcile(b.ctx)
		if err != nil || withoutBacklog(res) != (ReconcileResult{Listed: 1, Attempted: 1, Unresolved: 1, Errors: 1, MaxAttempts: 1}) {
			t.Fatalf("Reconcile = %+v, %v; want one unresolved attempt", res, err)
		}
		if r := b.requireState(t, id(1), idemstore.StateUnknown); r.ReconcileError != "no resolution within 100ms: context deadline exceeded" {
			t.Fatalf("ReconcileError = %q", r.ReconcileError)
		}
	})
}

// TestReconcileLeftSkipsGrace: a pass that stops at ScanLimit counts the
// due records it left (ReconcileResult.Left), not the unknown records
// still inside their grace, which no claim may take yet: counting those
// would report a reconciler that keeps up as one that falls behind, after
// every crash.
func TestReconcileLeftSkipsGrace(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const grace = 2 * time.Minute
		b.unknown(t, id(1))
		b.unknown(t, id(2))
		b.clock.Advance(testLease + grace) // id(1) and id(2) are due
		for i := 3; i <= 5; i++ {
			b.unknown(t, id(i)) // inside their grace
		}
		f := &fixed{r: Resolution{State: idemstore.StateReleased}}
		m := b.newMaintainer(&Config{Reconcile: f.reconcile, Grace: grace, ScanLimit: 2, BatchSize: 2})
		res, err := m.Reconcile(b.ctx)
		if err != nil || res.Listed != 2 || res.Released != 2 || !res.Truncated {
			t.Fatalf("Reconcile = %+v, %v; want the 2 due records claimed and released, stopped at ScanLimit", res, err)
		}
		if res.Left != 0 || m.Stats().ReconcileLeft != 0 {
			t.Fatalf("Left = %d, Stats().ReconcileLeft = %d; want 0: the other records are inside their grace", res.Left, m.Stats().ReconcileLeft)
		}
	})
}
