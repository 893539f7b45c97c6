package idemmaint

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// fixed returns a reconciler that always answers r and records the records
// it was asked about.
type fixed struct {
	mu    sync.Mutex
	asked []*idemstore.Record
	r     Resolution
}

func (f *fixed) reconcile(_ context.Context, rec *idemstore.Record) (Resolution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, rec)
	return f.r, nil
}

func (f *fixed) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.asked)
}

func paymentResponse() *idemstore.Response {
	return &idemstore.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"pay_1"}`),
	}
}

func TestReconcileCompleted(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		unknown := b.unknown(t, id(1))
		b.reserve(t, idemstore.ReserveParams{Identity: id(2)}) // in progress: not the reconciler's
		f := &fixed{r: Resolution{State: idemstore.StateCompleted, Response: paymentResponse()}}
		var hooked []ReconcileResult
		m := b.newMaintainer(&Config{Reconcile: f.reconcile, OnReconcile: func(r ReconcileResult, err error) {
			if err != nil {
				t.Errorf("OnReconcile: %v", err)
			}
			hooked = append(hooked, r)
		}})

		res, err := m.Reconcile(b.ctx)
		if err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
		if want := (ReconcileResult{Listed: 1, Attempted: 1, Completed: 1}); withoutBacklog(res) != want {
			t.Fatalf("Reconcile = %+v, want %+v", res, want)
		}
		if len(f.asked) != 1 || f.asked[0].Identity != id(1) || f.asked[0].Token != unknown.Token || f.asked[0].State != idemstore.StateUnknown {
			t.Fatalf("reconciler asked about %+v, want the unknown record %v with its token", f.asked, id(1))
		}

		rec := b.requireState(t, id(1), idemstore.StateCompleted)
		if rec.Response == nil || rec.Response.Status != http.StatusCreated || string(rec.Response.Body) != `{"id":"pay_1"}` {
			t.Fatalf("resolved record response %+v, want the reconciler's", rec.Response)
		}
		// A retry now replays the reconciled response.
		replay, err := b.store.KeyReserve(b.ctx, &idemstore.ReserveParams{Identity: id(1), Fingerprint: testFingerprint,
			Token: b.token(), Lease: testLease, TTL: testTTL, LeaseExpiredState: idemstore.StateUnknown})
		if err != nil || replay.Reserved || replay.Record.State != idemstore.StateCompleted ||
			replay.Record.Response == nil || string(replay.Record.Response.Body) != `{"id":"pay_1"}` {
			t.Fatalf("retry after reconciliation = %+v, %v; want the stored response replayed", replay, err)
		}
		b.requireState(t, id(2), idemstore.StateInProgress)

		// Nothing is left to do.
		if res, err := m.Reconcile(b.ctx); err != nil || withoutBacklog(res) != (ReconcileResult{}) {
			t.Fatalf("second Reconcile = %+v, %v; want nothing listed", res, err)
		}
		if len(hooked) != 2 || hooked[0].Completed != 1 {
			t.Fatalf("OnReconcile saw %+v", hooked)
		}
		if s := m.Stats(); s.Completed != 1 || s.Unresolved != 0 || s.UnknownBacklog != 0 || s.LastReconcile.IsZero() {
			t.Fatalf("Stats = %+v", s)
		}
		lines := b.logs.lines(t, "reconciled")
		if len(lines) != 1 || lines[0]["level"] != "INFO" {
			t.Fatalf("want one INFO line for the resolution:\n%s", b.logs)
		}
		requireAttrs(t, lines[0], id(1), map[string]any{"state": "completed"})
		b.logs.requireNoRawKeys(t)
		b.logs.requireNoErrors(t)
	})
}

func TestReconcileReleased(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.unknown(t, id(1))
		f := &fixed{r: Resolution{State: idemstore.StateReleased}}
		m := b.newMaintainer(&Config{Reconcile: f.reconcile})
		res, err := m.Reconcile(b.ctx)
		if err != nil || withoutBacklog(res) != (ReconcileResult{Listed: 1, Attempted: 1, Released: 1}) {
			t.Fatalf("Reconcile = %+v, %v", res, err)
		}
		b.requireState(t, id(1), idemstore.StateReleased)
		// The next request executes again.
		b.reserve(t, idemstore.ReserveParams{Identity: id(1)})
		if s := m.Stats(); s.Released != 1 {
			t.Fatalf("Stats = %+v, want Released 1", s)
		}
	})
}

// TestReconcileWaitsGrace: the reconciler never asks about a record before
// its lease ended plus Config.Grace, neither one its handler marked
// unknown under a live lease nor one the sweep turned unknown; it asks at
// the grace's end.
func TestReconcileWaitsGrace(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const grace = 2 * time.Minute
		marked := b.unknown(t, id(1))
		b.clock.Advance(10 * time.Second)
		b.reserve(t, idemstore.ReserveParams{Identity: id(2)}) // expires in progress
		f := &fixed{r: Resolution{State: idemstore.StateReleased}}
		m := b.newMaintainer(&Config{Reconcile: f.reconcile, Grace: grace})
		pass := func(when string, want int) {
			t.Helper()
			if _, err := m.Reconcile(b.ctx); err != nil {
				t.Fatalf("%s: Reconcile: %v", when, err)
			}
			if n := f.calls(); n != want {
				t.Fatalf("%s: the reconciler was asked %d times, want %d", when, n, want)
			}
		}
		pass("at once", 0)
		b.clock.Advance(testLease) // id(2)'s lease is over: the pass sweeps it unknown
		pass("after id(2)'s lease", 0)
		b.requireState(t, id(2), idemstore.StateUnknown)
		swept := b.get(t, id(2))
		b.clock.Set(marked.LockedUntil.Add(grace - time.Millisecond))
		pass("a millisecond before id(1)'s grace ended", 0)
		b.clock.Set(marked.LockedUntil.Add(grace))
		pass("when id(1)'s grace ended", 1)
		b.clock.Set(swept.LockedUntil.Add(grace - time.Millisecond))
		pass("a millisecond before id(2)'s grace ended", 1)
		b.clock.Set(swept.LockedUntil.Add(grace))
		pass("when id(2)'s grace ended", 2)
		if f.asked[0].Identity != id(1) || f.asked[1].Identity != id(2) {
			t.Fatalf("asked about %v then %v, want id(1) then id(2)", f.asked[0].Identity, f.asked[1].Identity)
		}
	})
}

// TestReconcileCompletedNotReplayable: a completed resolution without a
// response stores a record a retry cannot replay, rather than inventing one.
func TestReconcileCompletedNotReplayable(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.unknown(t, id(1))
		f := &fixed{r: Resolution{State: idemstore.StateCompleted}}
		m := b.newMaintainer(&Config{Reconcile: f.reconcile})
		if res, err := m.Reconcile(b.ctx); err != nil || res.Completed != 1 {
			t.Fatalf("Reconcile = %+v, %v", res, err)
		}
		if rec := b.requireState(t, id(1), idemstore.StateCompleted); !rec.NotReplayable {
			t.Fatalf("record %+v: want not replayable", rec)
		}
	})
}

func TestReconcileBackoff(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.unknown(t, id(1))
		var mu sync.Mutex
		calls := 0
		reconcile := func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			switch calls {
			case 1:
				return Resolution{}, errors.New("downstream unavailable")
			case 2:
				return Resolution{}, nil // the downstream does not know yet
			}
			return Resolution{State: idemstore.StateReleased}, nil
		}
		m := b.newMaintainer(&Config{Reconcile: reconcile, ReconcileBackoff: Backoff{Base: 30 * time.Second, Max: time.Hour}})
		pass := func(want ReconcileResult) {
			t.Helper()
			res, err := m.Reconcile(b.ctx)
			if err != nil || withoutBacklog(res) != want {
				t.Fatalf("at +%v: Reconcile = %+v, %v; want %+v", b.clock.Now().Sub(t0), res, err, want)
			}
		}
		attempted := ReconcileResult{Listed: 1, Attempted: 1, Unresolved: 1, MaxAttempts: 2}
		// A record in its backoff is not claimed at all: the store holds
		// it back.
		deferred := ReconcileResult{}

		// Attempt 1 fails; the next is due 15 to 30 seconds later.
		pass(ReconcileResult{Listed: 1, Attempted: 1, Unresolved: 1, Errors: 1, MaxAttempts: 1})
		if r := b.requireState(t, id(1), idemstore.StateUnknown); r.ReconcileAttempts != 1 || r.ReconcileError != "downstream unavailable" {
			t.Fatalf("stored reconcile state %d %q, want 1 and the error", r.ReconcileAttempts, r.ReconcileError)
		}
		if s := m.Stats(); s.Unresolved != 1 || s.MaxAttempts != 1 || s.ReconcileErrors != 1 || s.UnknownBacklog != 1 {
			t.Fatalf("Stats after a failed attempt = %+v", s)
		}
		pass(deferred)
		b.clock.Advance(14 * time.Second)
		pass(deferred)
		b.clock.Advance(16 * time.Second)
		// Attempt 2 cannot tell; the next is due 30 to 60 seconds later.
		pass(attempted)
		b.clock.Advance(29 * time.Second)
		pass(deferred)
		b.clock.Advance(31 * time.Second)
		// Attempt 3 resolves.
		pass(ReconcileResult{Listed: 1, Attempted: 1, Released: 1})
		b.requireState(t, id(1), idemstore.StateReleased)
		if s := m.Stats(); s.Unresolved != 0 || s.MaxAttempts != 0 || s.Released != 1 || s.ReconcileErrors != 1 {
			t.Fatalf("Stats after the resolution = %+v", s)
		}

		warns := b.logs.lines(t, "unresolved")
		if len(warns) != 2 {
			t.Fatalf("%d unresolved log lines, want 2:\n%s", len(warns), b.logs)
		}
		for i, w := range warns {
			if w["level"] != "WARN" {
				t.Fatalf("unresolved line %v at %v, want WARN", w, w["level"])
			}
			requireAttrs(t, w, id(1), map[string]any{"attempts": i + 1})
		}
		if warns[0]["error"] != "downstream unavailable" {
			t.Fatalf("first unresolved line %v: want the reconciler's error", warns[0])
		}
		b.logs.requireNoRawKeys(t)
		b.logs.requireNoErrors(t)
	})
}

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	m := New(nil, &Config{ReconcileBackoff: Backoff{Base: 30 * time.Second, Max: time.Hour}})
	tests := []struct {
		attempts int
		full     time.Duration
	}{
		{1, 30 * time.Second},
		{2, time.Minute},
		{3, 2 * time.Minute},
		{7, 32 * time.Minute},
		{8, time.Hour},
		{1000, time.Hour},
	}
	for _, tt := range tests {
		for range 200 {
			if d := m.backoff(tt.attempts); d < tt.full/2 || d > tt.full {
				t.Fatalf("backoff(%d) = %v, want within [%v, %v]", tt.attempts, d, tt.full/2, tt.full)
			}
		}
	}
	// The jitter spreads retries.
	seen := map[time.Duration]bool{}
	for range 50 {
		seen[m.backoff(3)] = true
	}
	if len(seen) < 10 {
		t.Fatalf("backoff(3) took %d distinct values in 50 draws: no jitter", len(seen))
	}
}

// TestReconcileRaceResolvedElsewhere: while the reconciler asks the
// downstream, an operator resolves the record. The maintainer's resolution
// loses and is dropped, logged at info; the operator's stands.
func TestReconcileRaceResolvedElsewhere(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.unknown(t, id(1))
		reconcile := func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			err := b.store.KeyResolve(ctx, &idemstore.ResolveParams{Identity: rec.Identity, Token: rec.Token, To: idemstore.StateReleased})
			if err != nil {
				t.Errorf("the operator's KeyResolve: %v", err)
			}
			return Resolution{State: idemstore.StateCompleted, Response: paymentResponse()}, nil
		}
		m := b.newMaintainer(&Config{Reconcile: reconcile})
		res, err := m.Reconcile(b.ctx)
		if err != nil || withoutBacklog(res) != (ReconcileResult{Listed: 1, Attempted: 1, Lost: 1}) {
			t.Fatalf("Reconcile = %+v, %v; want the resolution lost", res, err)
		}
		b.requireState(t, id(1), idemstore.StateReleased)
		lines := b.logs.lines(t, "settled elsewhere")
		if len(lines) != 1 || lines[0]["level"] != "INFO" {
			t.Fatalf("want one INFO line for the lost race:\n%s", b.logs)
		}
		b.logs.requireNoErrors(t)
		if s := m.Stats(); s.Lost != 1 || s.Completed != 0 || s.Unresolved != 0 {
			t.Fatalf("Stats = %+v", s)
		}
	})
}

// TestReconcileRaceStaleToken: while the reconciler asks, the record is
// resolved, re-executed by a new attempt and left unknown again, with a new
// token. The stale resolution must not settle the new attempt's record.
func TestReconcileRaceStaleToken(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		first := b.unknown(t, id(1))
		var second *idemstore.Record
		var asked []string
		reconcile := func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			asked = append(asked, rec.Token)
			if second == nil {
				if err := b.store.KeyResolve(ctx, &idemstore.ResolveParams{Identity: rec.Identity, Token: rec.Token, To: idemstore.StateReleased}); err != nil {
					t.Errorf("KeyResolve: %v", err)
				}
				second = b.unknown(t, id(1))
			}
			return Resolution{State: idemstore.StateCompleted, Response: paymentResponse()}, nil
		}
		m := b.newMaintainer(&Config{Reconcile: reconcile})
		res, err := m.Reconcile(b.ctx)
		if err != nil || withoutBacklog(res) != (ReconcileResult{Listed: 1, Attempted: 1, Lost: 1}) {
			t.Fatalf("Reconcile = %+v, %v; want the stale resolution lost", res, err)
		}
		if rec := b.requireState(t, id(1), idemstore.StateUnknown); rec.Token != second.Token || second.Token == first.Token {
			t.Fatalf("record token %q; want the new attempt's %q (first was %q)", rec.Token, second.Token, first.Token)
		}
		// The next pass reconciles the new attempt on its own token.
		res, err = m.Reconcile(b.ctx)
		if err != nil || withoutBacklog(res) != (ReconcileResult{Listed: 1, Attempted: 1, Completed: 1}) {
			t.Fatalf("second Reconcile = %+v, %v", res, err)
		}
		if len(asked) != 2 || asked[0] != first.Token || asked[1] != second.Token {
			t.Fatalf("reconciler asked with tokens %q, want [%q %q]", asked, first.Token, second.Token)
		}
		b.requireState(t, id(1), idemstore.StateCompleted)
		b.logs.requireNoErrors(t)
	})
}

// TestReconcileConcurrentMaintainers runs two maintainers over one store at
// once: every unknown record is settled exactly once, and the loser of each
// race drops its resolution without an error.
func TestReconcileConcurrentMaintainers(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const n = 40
		for i := range n {
			b.unknown(t, id(i))
		}
		var ms [2]*Maintainer
		var results [2]ReconcileResult
		var errs [2]error
		for i := range ms {
			f := &fixed{r: Resolution{State: idemstore.StateCompleted, Response: paymentResponse()}}
			ms[i] = b.newMaintainer(&Config{Reconcile: f.reconcile, BatchSize: 7})
		}
		var wg sync.WaitGroup
		for i := range ms {
			wg.Go(func() { results[i], errs[i] = ms[i].Reconcile(b.ctx) })
		}
		wg.Wait()
		completed := 0
		for i := range ms {
			if errs[i] != nil {
				t.Fatalf("maintainer %d: %v", i, errs[i])
			}
			r := results[i]
			if r.Attempted != r.Completed+r.Lost || r.Unresolved != 0 {
				t.Fatalf("maintainer %d: %+v", i, r)
			}
			completed += r.Completed
		}
		if completed != n {
			t.Fatalf("%d records completed in all, want %d: %+v", completed, n, results)
		}
		for i := range n {
			b.requireState(t, id(i), idemstore.StateCompleted)
		}
		b.logs.requireNoErrors(t)
	})
}

// TestReconcileFaultyReconciler: a panic or an invalid resolution is an
// unresolved attempt, not a crash, and leaves the record unknown.
func TestReconcileFaultyReconciler(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.unknown(t, id(1))
		b.unknown(t, id(2))
		reconcile := func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			if rec.Identity == id(1) {
				panic("reconciler bug")
			}
			return Resolution{State: idemstore.StateInProgress}, nil
		}
		m := b.newMaintainer(&Config{Reconcile: reconcile})
		res, err := m.Reconcile(b.ctx)
		if err != nil || withoutBacklog(res) != (ReconcileResult{Listed: 2, Attempted: 2, Unresolved: 2, Errors: 2, MaxAttempts: 1}) {
			t.Fatalf("Reconcile = %+v, %v", res, err)
		}
		b.requireState(t, id(1), idemstore.StateUnknown)
		b.requireState(t, id(2), idemstore.StateUnknown)
		warns := b.logs.lines(t, "reconciler failed")
		if len(warns) != 2 {
			t.Fatalf("want 2 failure lines:\n%s", b.logs)
		}
		requireAttrs(t, warns[0], id(1), map[string]any{"error": "reconciler panicked: reconciler bug"})
		if s := m.Stats(); s.ReconcileErrors != 2 || s.Unresolved != 2 {
			t.Fatalf("Stats = %+v", s)
		}
	})
}

// TestReconcileStateSurvivesRestart: the backoff and the attempts live in the
// store, so a new Maintainer (a restarted process, another node) carries on
// where the last one stopped; a record someone else settles is not asked
// about again.
func TestReconcileStateSurvivesRestart(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		rec := b.unknown(t, id(1))
		b.unknown(t, id(2))
		f := &fixed{}
		backoff := Backoff{Base: time.Minute, Max: time.Hour}
		m := b.newMaintainer(&Config{Reconcile: f.reconcile, ReconcileBackoff: backoff})
		if res, err := m.Reconcile(b.ctx); err != nil || res.Unresolved != 2 {
			t.Fatalf("Reconcile = %+v, %v", res, err)
		}
		if err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: id(1), Token: rec.Token, To: idemstore.StateReleased}); err != nil {
			t.Fatalf("KeyResolve: %v", err)
		}

		restarted := b.newMaintainer(&Config{Reconcile: f.reconcile, ReconcileBackoff: backoff})
		if res, err := restarted.Reconcile(b.ctx); err != nil || withoutBacklog(res) != (ReconcileResult{}) {
			t.Fatalf("Reconcile by a restarted maintainer within the backoff = %+v, %v; want nothing asked", res, err)
		}
		if res, err := restarted.Reconcile(b.ctx); err != nil || res.Backlog != 1 {
			t.Fatalf("Reconcile = %+v, %v; want a backlog of 1", res, err)
		}
		if s := restarted.Stats(); s.UnknownBacklog != 1 {
			t.Fatalf("Stats = %+v, want a backlog of 1 read from the store", s)
		}
		b.clock.Advance(time.Minute)
		res, err := restarted.Reconcile(b.ctx)
		if err != nil || withoutBacklog(res) != (ReconcileResult{Listed: 1, Attempted: 1, Unresolved: 1, MaxAttempts: 2}) {
			t.Fatalf("Reconcile after the backoff = %+v, %v; want the second attempt at id 2 only", res, err)
		}
		if f.calls() != 3 || f.asked[2].Identity != id(2) || f.asked[2].ReconcileAttempts != 1 {
			t.Fatalf("asked %d times, last about %+v", f.calls(), f.asked[len(f.asked)-1].Identity)
		}
	})
}

// TestReconcileWithoutReconciler counts the backlog, bounded by ScanLimit,
// and touches nothing.
func TestReconcileWithoutReconciler(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		for i := range 7 {
			b.unknown(t, id(i))
		}
		m := b.newMaintainer(&Config{BatchSize: 2, ScanLimit: 5})
		b.clock.Advance(time.Minute)
		res, err := m.Reconcile(b.ctx)
		if err != nil || withoutBacklog(res) != (ReconcileResult{}) {
			t.Fatalf("Reconcile = %+v, %v; want nothing claimed", res, err)
		}
		// The backlog is the store's count, not bounded by ScanLimit.
		if s := m.Stats(); s.UnknownBacklog != 7 || s.UnknownBacklogTruncated || s.OldestUnknown != time.Minute {
			t.Fatalf("Stats = %+v; want a backlog of 7, the oldest a minute old", s)
		}
		for i := range 7 {
			b.requireState(t, id(i), idemstore.StateUnknown)
		}
	})
}

// TestReconcileStoppedWhileAsking: a pass stopped while the reconciler
// asks (Stop, or the caller's context) ends with that error; the attempt
// does not count against the record, which is counted as left.
func TestReconcileStoppedWhileAsking(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.unknown(t, id(1))
		ctx, stop := context.WithCancel(b.ctx)
		defer stop()
		reconcile := func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			stop()
			<-ctx.Done()
			return Resolution{}, ctx.Err()
		}
		m := b.newMaintainer(&Config{Reconcile: reconcile})
		res, err := m.Reconcile(ctx)
		if !errors.Is(err, context.Canceled) || res.Attempted != 1 || res.Unresolved != 0 || res.Left != 1 {
			t.Fatalf("Reconcile = %+v, %v; want the stop, no unresolved attempt, one record left", res, err)
		}
		if s := m.Stats(); s.PassErrors != 0 || s.Unresolved != 0 || s.ReconcileErrors != 0 {
			t.Fatalf("Stats = %+v", s)
		}
		if r := b.requireState(t, id(1), idemstore.StateUnknown); r.ReconcileAttempts != 0 {
			t.Fatalf("the stopped attempt counts against the record: %d attempts", r.ReconcileAttempts)
		}
	})
}

// TestReconcileUnsweptLease: the jobs run independently, so a reconciliation
// pass may come before the sweeper reached an expired lease; it sweeps first
// and reconciles the record in the same pass.
func TestReconcileUnsweptLease(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.reserve(t, idemstore.ReserveParams{Identity: id(1)})
		b.clock.Advance(testLease)
		f := &fixed{r: Resolution{State: idemstore.StateReleased}}
		m := b.newMaintainer(&Config{Reconcile: f.reconcile})
		res, err := m.Reconcile(b.ctx)
		if s := m.Stats(); s.Swept != 1 {
			t.Fatalf("Stats = %+v, want the lease swept by the reconciliation pass", s)
		}
		if err != nil || withoutBacklog(res) != (ReconcileResult{Listed: 1, Attempted: 1, Released: 1}) {
			t.Fatalf("Reconcile = %+v, %v", res, err)
		}
		b.requireState(t, id(1), idemstore.StateReleased)
	})
}

// TestReconcileSeveralMaintainers runs the passes of several maintainers on
// one store at the same time: the store's claims hand every due record to
// one of them, so the reconciler is asked about each record once per pass,
// whichever maintainer asks. Those that settle records settle each once.
func TestReconcileSeveralMaintainers(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const (
			records     = 120
			maintainers = 4
		)
		for i := range records {
			b.unknown(t, id(i))
		}
		var (
			mu    sync.Mutex
			asked = map[idemstore.Identity]int{}
		)
		settle := false
		reconcile := func(_ context.Context, rec *idemstore.Record) (Resolution, error) {
			mu.Lock()
			asked[rec.Identity]++
			mu.Unlock()
			if settle {
				return Resolution{State: idemstore.StateReleased}, nil
			}
			return Resolution{}, errors.New("the downstream does not know yet")
		}
		ms := make([]*Maintainer, maintainers)
		for i := range ms {
			ms[i] = b.newMaintainer(&Config{Reconcile: reconcile, BatchSize: 7, ReconcileBackoff: Backoff{Base: time.Hour, Max: time.Hour}})
		}
		pass := func() []ReconcileResult {
			t.Helper()
			mu.Lock()
			clear(asked)
			mu.Unlock()
			results := make([]ReconcileResult, maintainers)
			errs := make([]error, maintainers)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, m := range ms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					results[i], errs[i] = m.Reconcile(b.ctx)
				}()
			}
			close(start)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			for i := range records {
				if asked[id(i)] != 1 {
					t.Fatalf("record %d asked about %d times in one pass of %d maintainers, want once", i, asked[id(i)], maintainers)
				}
			}
			attempted := 0
			for _, r := range results {
				attempted += r.Attempted
			}
			if attempted != records {
				t.Fatalf("%d attempts in all, want %d: %+v", attempted, records, results)
			}
			return results
		}

		pass()
		for i := range records {
			if r := b.get(t, id(i)); r.State != idemstore.StateUnknown || r.ReconcileAttempts != 1 {
				t.Fatalf("record %d: %s with %d attempts, want unknown with 1", i, r.State, r.ReconcileAttempts)
			}
		}
		b.clock.Advance(time.Hour)
		settle = true
		released := 0
		for _, r := range pass() {
			released += r.Released
			if r.Lost != 0 {
				t.Fatalf("a maintainer lost %d resolutions to another: %+v", r.Lost, r)
			}
		}
		if released != records {
			t.Fatalf("released %d records, want %d", released, records)
		}
		// Each measured the store's backlog as its own pass ended; once all
		// have ended, every one of them reads the same: empty.
		for _, m := range ms {
			if res, err := m.Reconcile(b.ctx); err != nil || withoutBacklog(res) != (ReconcileResult{}) {
				t.Fatalf("Reconcile after all settled = %+v, %v", res, err)
			}
			if s := m.Stats(); s.UnknownBacklog != 0 || s.OldestUnknown != 0 {
				t.Fatalf("Stats = %+v, want an empty backlog", s)
			}
		}
	})
}

// withoutBacklog is r with Backlog zeroed, for tests that compare what a
// pass did; the tests of the backlog check it on its own.
func withoutBacklog(r ReconcileResult) ReconcileResult {
	r.Backlog = 0
	return r
}
