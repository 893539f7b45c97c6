package idemmaint

import (
	"slices"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

func TestSweepExpiredLeaseToUnknown(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		expired := b.reserve(t, idemstore.ReserveParams{Identity: id(1), LeaseExpiredState: idemstore.StateUnknown})
		b.reserve(t, idemstore.ReserveParams{Identity: id(2), Lease: 10 * time.Minute})
		var hooked []int
		m := b.newMaintainer(&Config{OnSweep: func(n int, err error) {
			if err != nil {
				t.Errorf("OnSweep: %v", err)
			}
			hooked = append(hooked, n)
		}})

		if n, err := m.Sweep(b.ctx); err != nil || n != 0 {
			t.Fatalf("Sweep before the lease expired = %d, %v; want 0, nil", n, err)
		}
		b.clock.Advance(testLease)
		if n, err := m.Sweep(b.ctx); err != nil || n != 1 {
			t.Fatalf("Sweep = %d, %v; want 1, nil", n, err)
		}
		// The sweep wrote: a second pass finds nothing left to settle.
		if n, err := m.Sweep(b.ctx); err != nil || n != 0 {
			t.Fatalf("second Sweep = %d, %v; want 0, nil", n, err)
		}
		rec := b.requireState(t, id(1), idemstore.StateUnknown)
		if rec.Token != expired.Token {
			t.Fatalf("swept record token %q, want %q (the sweep must keep it for fenced resolution)", rec.Token, expired.Token)
		}
		b.requireState(t, id(2), idemstore.StateInProgress)

		if !slices.Equal(hooked, []int{0, 1, 0}) {
			t.Fatalf("OnSweep saw %v, want [0 1 0]", hooked)
		}
		if s := m.Stats(); s.Swept != 1 || !s.LastSweep.Equal(b.clock.Now()) || s.PassErrors != 0 {
			t.Fatalf("Stats = %+v; want Swept 1, LastSweep %v, no errors", s, b.clock.Now())
		}
		lines := b.logs.lines(t, "lease expired")
		if len(lines) != 1 {
			t.Fatalf("%d sweep log lines, want 1:\n%s", len(lines), b.logs)
		}
		if lines[0]["level"] != "WARN" {
			t.Fatalf("sweep to unknown logged at %v, want WARN", lines[0]["level"])
		}
		requireAttrs(t, lines[0], id(1), map[string]any{"state": "unknown", "attempts": 1})
		b.logs.requireNoRawKeys(t)
	})
}

func TestSweepExpiredLeaseToReleased(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		b.reserve(t, idemstore.ReserveParams{Identity: id(1), LeaseExpiredState: idemstore.StateReleased})
		m := b.newMaintainer(nil)
		b.clock.Advance(testLease + time.Second)
		if n, err := m.Sweep(b.ctx); err != nil || n != 1 {
			t.Fatalf("Sweep = %d, %v; want 1, nil", n, err)
		}
		b.requireState(t, id(1), idemstore.StateReleased)
		// A released record is taken over by the next request.
		b.reserve(t, idemstore.ReserveParams{Identity: id(1), LeaseExpiredState: idemstore.StateReleased})

		lines := b.logs.lines(t, "lease expired")
		if len(lines) != 1 || lines[0]["level"] != "INFO" {
			t.Fatalf("want one INFO sweep line, got:\n%s", b.logs)
		}
		requireAttrs(t, lines[0], id(1), map[string]any{"state": "released"})
		b.logs.requireNoRawKeys(t)
	})
}

func TestSweepBatches(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const n = 250
		for i := range n {
			b.reserve(t, idemstore.ReserveParams{Identity: id(i)})
		}
		b.clock.Advance(testLease)
		m := b.newMaintainer(&Config{BatchSize: 100})
		if got, err := m.Sweep(b.ctx); err != nil || got != n {
			t.Fatalf("Sweep = %d, %v; want %d, nil", got, err, n)
		}
		if want := []int{100, 100, 100}; !slices.Equal(b.spy.sweeps, want) {
			t.Fatalf("KeySweep limits %v, want %v (stop at the first short batch)", b.spy.sweeps, want)
		}
		if lines := b.logs.lines(t, "lease expired"); len(lines) != n {
			t.Fatalf("%d sweep log lines, want one per record (%d)", len(lines), n)
		}
	})
}

func TestReap(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const dead = 10000
		b.bulk(t, b.ctx, dead, b.clock.Now(), time.Hour)
		// The rows are records the store reads back like its own.
		for i, want := range []idemstore.State{idemstore.StateCompleted, idemstore.StateReleased, idemstore.StateUnknown} {
			b.requireState(t, id(i), want)
		}
		if rec := b.get(t, id(0)); rec.Response == nil || rec.Response.Status != 201 {
			t.Fatalf("bulk record %v: response %+v, want status 201", id(0), rec.Response)
		}
		// Live records: one completed, one in progress with a fresh lease.
		// The completed one's lease expired long ago, the reaper must not
		// care.
		done := b.reserve(t, idemstore.ReserveParams{Identity: id(dead), TTL: 3 * time.Hour})
		if err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: id(dead), Token: done.Token, Response: &idemstore.Response{Status: 201}}); err != nil {
			t.Fatalf("KeyComplete: %v", err)
		}
		b.clock.Advance(2 * time.Hour)
		b.reserve(t, idemstore.ReserveParams{Identity: id(dead + 1), TTL: time.Hour})

		m := b.newMaintainer(&Config{BatchSize: 1000})
		n, err := m.Reap(b.ctx)
		// One bulk record in three is unknown: never reaped.
		const reapable = dead - dead/3
		if err != nil || n != reapable {
			t.Fatalf("Reap = %d, %v; want %d, nil", n, err, reapable)
		}
		wantLimits := slices.Repeat([]int{1000}, 7)
		wantReaped := append(slices.Repeat([]int{1000}, 6), reapable-6000)
		if !slices.Equal(b.spy.reaps, wantLimits) || !slices.Equal(b.spy.reaped, wantReaped) {
			t.Fatalf("KeyReap calls: limits %v, deleted %v; want limits %v, deleted %v",
				b.spy.reaps, b.spy.reaped, wantLimits, wantReaped)
		}
		b.requireState(t, id(dead), idemstore.StateCompleted)
		b.requireState(t, id(dead+1), idemstore.StateInProgress)
		for _, i := range []int{2, dead / 2, dead - 2} {
			b.requireState(t, id(i), idemstore.StateUnknown)
		}
		for _, i := range []int{0, 1, dead/2 + 1, dead - 1} {
			if rec, err := b.store.KeyGet(b.ctx, id(i)); err == nil {
				t.Fatalf("KeyGet(%v) = %+v after the reap; want ErrNotFound", id(i), rec)
			}
		}
		// The rows are gone, not merely hidden: the next pass finds nothing.
		b.clock.Advance(24 * time.Hour)
		if n, err := m.Reap(b.ctx); err != nil || n != 1 {
			t.Fatalf("Reap a day later = %d, %v; want the completed live record, now expired (the other's lease turned unknown)", n, err)
		}
		b.requireState(t, id(dead+1), idemstore.StateUnknown)
		if s := m.Stats(); s.Reaped != reapable+1 || s.PassErrors != 0 {
			t.Fatalf("Stats = %+v; want Reaped %d and no errors", s, reapable+1)
		}
		if lines := b.logs.lines(t, "reaped"); len(lines) != 2 {
			t.Fatalf("%d reap log lines, want one per pass that deleted:\n%s", len(lines), b.logs)
		}
	})
}
