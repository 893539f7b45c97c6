package idemmaint

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// waitFor receives from ch until ok accepts a value, failing after a
// deadline. Background passes are awaited through their hooks, never by
// sleeping.
func waitFor[T any](t *testing.T, what string, ch <-chan T, ok func(T) bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case v := <-ch:
			if ok(v) {
				return
			}
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// send delivers v unless ch is full: hooks must never block a pass.
func send[T any](ch chan<- T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// TestStartStop runs the three background jobs on a memory store with short
// intervals. It is not parallel, so that goleak sees only its goroutines.
func TestStartStop(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after m.Stop, also on failure
	clock := idemtest.NewClock(t0)
	b := &bundle{store: idemmem.New(&idemmem.Config{Now: clock.Now}), clock: clock, ctx: context.Background(), logs: &logBuffer{}}
	b.spy = &spyStore{Store: b.store}
	for i := range 5 {
		// Released when their lease expires, so that the reaper may delete
		// them (an unknown record is never reaped).
		b.reserve(t, idemstore.ReserveParams{Identity: id(i), TTL: time.Minute, LeaseExpiredState: idemstore.StateReleased})
	}
	b.unknown(t, id(10))
	clock.Advance(testLease)

	swept := make(chan int, 100)
	reaped := make(chan int, 100)
	entered := make(chan struct{}, 1)
	returned := make(chan error, 1)
	m := b.newMaintainer(&Config{
		SweepInterval:     time.Millisecond,
		ReapInterval:      time.Millisecond,
		ReconcileInterval: time.Millisecond,
		BatchSize:         2,
		BatchPause:        time.Millisecond,
		OnSweep:           func(n int, err error) { send(swept, n) },
		OnReap:            func(n int, err error) { send(reaped, n) },
		// The reconciler blocks until the maintainer stops: Start must not
		// wait for it, and Stop must cancel it.
		Reconcile: func(ctx context.Context, rec *idemstore.Record) (Resolution, error) {
			send(entered, struct{}{})
			<-ctx.Done()
			send(returned, ctx.Err())
			return Resolution{}, ctx.Err()
		},
	})

	if err := m.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(m.Stop)
	// Start returned although the reconciler is blocked.
	if err := m.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
	waitFor(t, "the reconciler to be called", entered, func(struct{}) bool { return true })
	// Five expired leases in batches of 2, with a pause between batches.
	waitFor(t, "a sweep of 5 records", swept, func(n int) bool { return n == 5 })
	// Passes repeat: later sweeps find nothing.
	waitFor(t, "an empty sweep", swept, func(n int) bool { return n == 0 })
	clock.Advance(time.Hour)
	waitFor(t, "a reap of the 5 expired records", reaped, func(n int) bool { return n == 5 })

	stopped := make(chan struct{})
	go func() {
		m.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return")
	}
	select {
	case err := <-returned:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the reconciler's context ended with %v, want context.Canceled", err)
		}
	default:
		t.Fatal("Stop returned before the reconciler did")
	}
	m.Stop() // twice is fine
	if err := m.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Fatalf("Start after Stop = %v, want ErrStarted", err)
	}
	if s := m.Stats(); s.Swept != 5 || s.Reaped != 5 || s.PassErrors != 0 || s.ReconcileErrors != 0 || s.Unresolved != 0 {
		t.Fatalf("Stats = %+v; want 5 swept, 5 reaped, no errors (a stopped pass is not one)", s)
	}
	b.logs.requireNoErrors(t)
	b.logs.requireNoRawKeys(t)
}

func TestStopWithoutStart(t *testing.T) {
	t.Parallel()
	m := New(idemmem.New(nil), nil)
	m.Stop()
	m.Stop()
	if err := m.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Fatalf("Start after Stop = %v, want ErrStarted", err)
	}
}

// TestStartContextCanceled: the jobs also end with Start's context.
func TestStartContextCanceled(t *testing.T) {
	t.Parallel()
	passes := make(chan struct{}, 10)
	m := New(idemmem.New(nil), &Config{
		Logger:  slog.New(slog.DiscardHandler),
		OnSweep: func(int, error) { send(passes, struct{}{}) },
	})
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	waitFor(t, "the first sweep", passes, func(struct{}) bool { return true })
	cancel()
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the jobs did not end with Start's context")
	}
	m.Stop()
}

func TestRunOnce(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		done := b.reserve(t, idemstore.ReserveParams{Identity: id(1), TTL: time.Hour})
		if err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: id(1), Token: done.Token, Response: paymentResponse()}); err != nil {
			t.Fatalf("KeyComplete: %v", err)
		}
		b.reserve(t, idemstore.ReserveParams{Identity: id(2), LeaseExpiredState: idemstore.StateUnknown})
		b.clock.Advance(2 * time.Hour)
		b.reserve(t, idemstore.ReserveParams{Identity: id(3), Lease: 10 * time.Minute})
		b.clock.Advance(4 * time.Minute)
		b.reserve(t, idemstore.ReserveParams{Identity: id(4), Lease: 10 * time.Minute})
		b.clock.Advance(time.Minute)

		f := &fixed{r: Resolution{State: idemstore.StateCompleted, Response: paymentResponse()}}
		m := b.newMaintainer(&Config{Reconcile: f.reconcile})
		if err := m.RunOnce(b.ctx); err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
		// The lease that expired was swept to unknown and reconciled in
		// the same run; the record past retention was reaped.
		if f.calls() != 1 || f.asked[0].Identity != id(2) {
			t.Fatalf("reconciler asked about %+v, want %v", f.asked, id(2))
		}
		b.requireState(t, id(2), idemstore.StateCompleted)
		if rec, err := b.store.KeyGet(b.ctx, id(1)); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("KeyGet(%v) = %+v, %v; want ErrNotFound after the reap", id(1), rec, err)
		}
		s := m.Stats()
		if s.Swept != 1 || s.Reaped != 1 || s.Completed != 1 || s.UnknownBacklog != 0 || s.PassErrors != 0 {
			t.Fatalf("Stats = %+v", s)
		}
		if s.OldestInProgress != 5*time.Minute {
			t.Fatalf("OldestInProgress = %v, want 5m (id 3's attempt)", s.OldestInProgress)
		}
		now := b.clock.Now()
		if !s.LastSweep.Equal(now) || !s.LastReap.Equal(now) || !s.LastReconcile.Equal(now) {
			t.Fatalf("last pass times %v %v %v, want %v", s.LastSweep, s.LastReap, s.LastReconcile, now)
		}

		// Once no attempt is running, the gauge falls to zero.
		b.clock.Advance(time.Hour)
		if err := m.RunOnce(b.ctx); err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
		if s := m.Stats(); s.OldestInProgress != 0 || s.Swept != 3 || s.UnknownBacklog != 0 {
			t.Fatalf("Stats = %+v; want no attempt in progress and 3 swept", s)
		}
	})
}

// TestRunOnceStoreFailure: a failing job does not stop the others, and its
// error is returned, counted and logged.
func TestRunOnceStoreFailure(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.reserve(t, idemstore.ReserveParams{Identity: id(1)})
		b.clock.Advance(testLease)
		errDown := errors.New("store unavailable")
		b.spy.reapErr = errDown
		f := &fixed{r: Resolution{State: idemstore.StateReleased}}
		m := b.newMaintainer(&Config{Reconcile: f.reconcile})
		if err := m.RunOnce(b.ctx); !errors.Is(err, errDown) {
			t.Fatalf("RunOnce = %v, want the reap error", err)
		}
		b.requireState(t, id(1), idemstore.StateReleased)
		if s := m.Stats(); s.PassErrors != 1 || s.Swept != 1 || s.Released != 1 {
			t.Fatalf("Stats = %+v", s)
		}
		lines := b.logs.lines(t, "pass failed")
		if len(lines) != 1 || lines[0]["level"] != "ERROR" || lines[0]["job"] != "reap" {
			t.Fatalf("want one ERROR line for the reap:\n%s", b.logs)
		}
	})
}

// TestKeyHash checks the log hash against an independent construction: the
// first 16 hex digits of SHA-256 over each of scope, endpoint and key
// prefixed with its length as 8 big-endian bytes.
func TestKeyHash(t *testing.T) {
	t.Parallel()
	want := func(id idemstore.Identity) string {
		var buf []byte
		for _, s := range []string{id.Scope, id.Endpoint, id.Key} {
			buf = binary.BigEndian.AppendUint64(buf, uint64(len(s)))
			buf = append(buf, s...)
		}
		sum := sha256.Sum256(buf)
		return hex.EncodeToString(sum[:])[:16]
	}
	ids := []idemstore.Identity{
		{},
		{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "k1"},
		{Scope: "ab", Endpoint: "c", Key: "d"},
		{Scope: "a", Endpoint: "bc", Key: "d"},
	}
	seen := map[string]bool{}
	for _, id := range ids {
		got := keyHash(id)
		if got != want(id) {
			t.Fatalf("keyHash(%+v) = %s, want %s", id, got, want(id))
		}
		if seen[got] {
			t.Fatalf("keyHash(%+v) = %s collides", id, got)
		}
		seen[got] = true
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := (*Config)(nil).withDefaults()
	if c.SweepInterval != 10*time.Second || c.ReapInterval != time.Minute || c.ReconcileInterval != 30*time.Second ||
		c.BatchSize != 1000 || c.ScanLimit != 10000 || c.PassTimeout != 30*time.Second || c.BatchPause != 10*time.Millisecond ||
		c.ReconcileBackoff != (Backoff{Base: 30 * time.Second, Max: time.Hour}) || c.Grace != time.Minute ||
		c.ReconcileConcurrency != 1 || c.ReconcileTimeout != 5*time.Second ||
		c.Logger == nil || c.Now == nil || c.Reconcile != nil {
		t.Fatalf("defaults = %+v", c)
	}
	c = (&Config{BatchPause: -1, ReconcileBackoff: Backoff{Base: 2 * time.Hour}, Grace: -1}).withDefaults()
	if c.BatchPause != 0 || c.ReconcileBackoff.Max != 2*time.Hour || c.Grace != 0 {
		t.Fatalf("BatchPause %v, backoff %+v, grace %v; want no pause, Max raised to Base and no grace", c.BatchPause, c.ReconcileBackoff, c.Grace)
	}
	c = (&Config{PassTimeout: 4 * time.Second, ReconcileTimeout: time.Minute}).withDefaults()
	if c.ReconcileTimeout != 2*time.Second {
		t.Fatalf("ReconcileTimeout %v; want it cut to half of PassTimeout", c.ReconcileTimeout)
	}
}
