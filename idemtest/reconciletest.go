package idemtest

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// This file pins down what the store keeps for an unknown outcome: it never
// expires while unresolved, its retention restarts when it is settled, only
// a forced KeyPurge removes it, and its reconciliation state
// (KeyReconcileClaim, KeyReconcileFail, KeyBacklog) lives in the store.

// shortTTL is the retention of the records these tests let expire.
const shortTTL = time.Hour

func testRetention(t *testing.T, setup setupFunc) {
	// unknownPast reserves id with shortTTL, marks it unknown and moves the
	// clock past its ExpiresAt. It returns the token.
	unknownPast := func(t *testing.T, b *bundle, id idemstore.Identity) string {
		t.Helper()
		p := b.params(id)
		p.TTL = shortTTL
		b.reserveNew(t, p)
		b.markUnknown(t, id, p.Token)
		b.clock.Advance(2 * shortTTL)
		return p.Token
	}

	t.Run("UnknownNeverExpires", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		unknownPast(t, b, b.id)
		unknown := b.get(t, b.id)
		requireState(t, unknown, idemstore.StateUnknown)
		if unknown.TTL != shortTTL {
			t.Fatalf("TTL = %v, want %v", unknown.TTL, shortTTL)
		}
		if !b.clock.Now().After(unknown.ExpiresAt) {
			t.Fatalf("ExpiresAt %v is not past: the test proves nothing", unknown.ExpiresAt)
		}
		n, err := b.store.KeyReap(b.ctx, &idemstore.ReapParams{})
		if err != nil || n != 0 {
			t.Fatalf("KeyReap = %d, %v; want 0 (an unknown record is never reaped)", n, err)
		}
		for _, res := range b.raceReserve(t, b.id, testFingerprint) {
			if res.Reserved {
				t.Fatal("an unknown record past its ExpiresAt was replaced by a new reservation")
			}
			requireSameRecord(t, "KeyReserve of the unknown record", res.Record, unknown)
		}
		requireSameRecord(t, "KeyGet", b.get(t, b.id), unknown)
		list, err := b.store.KeyList(b.ctx, &idemstore.ListParams{State: idemstore.StateUnknown})
		if err != nil || len(list) != 1 || list[0].Identity != b.id {
			t.Fatalf("KeyList(unknown) = %v, %v; want the record", identities(list), err)
		}
		b.clock.Advance(365 * 24 * time.Hour)
		requireState(t, b.reserveExisting(t, b.params(b.id)), idemstore.StateUnknown)
	})

	t.Run("ExpiredLeaseNeverExpires", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		p.TTL = shortTTL
		b.reserveNew(t, p)
		released := b.id
		released.Key = "released-on-expiry"
		pr := b.params(released)
		pr.TTL = shortTTL
		pr.LeaseExpiredState = idemstore.StateReleased
		b.reserveNew(t, pr)
		b.clock.Advance(2 * shortTTL)

		requireState(t, b.get(t, b.id), idemstore.StateUnknown)
		// A lease that turns released expires as a released record does.
		b.requireNotFound(t, released)
		n, err := b.store.KeyReap(b.ctx, &idemstore.ReapParams{})
		if err != nil || n != 1 {
			t.Fatalf("KeyReap = %d, %v; want 1 (the released one only)", n, err)
		}
		swept, err := b.store.KeySweep(b.ctx, &idemstore.SweepParams{})
		if err != nil || len(swept) != 1 || swept[0].State != idemstore.StateUnknown {
			t.Fatalf("KeySweep = %v, %v; want the record, unknown", identities(swept), err)
		}
		if n, err := b.store.KeyReap(b.ctx, &idemstore.ReapParams{}); err != nil || n != 0 {
			t.Fatalf("KeyReap after the sweep = %d, %v; want 0", n, err)
		}
		requireState(t, b.reserveExisting(t, b.params(b.id)), idemstore.StateUnknown)

		// The late but true outcome settles it and restarts its retention.
		b.clock.Advance(time.Minute)
		b.complete(t, b.id, p.Token, sampleResponse())
		r := b.get(t, b.id)
		requireState(t, r, idemstore.StateCompleted)
		if want := b.clock.Now().Add(shortTTL); !r.ExpiresAt.Equal(want) {
			t.Fatalf("ExpiresAt after the late completion = %v, want %v", r.ExpiresAt, want)
		}
	})

	t.Run("SettleRestartsRetention", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		settle := map[string]func(id idemstore.Identity, token string) error{
			"complete": func(id idemstore.Identity, token string) error {
				return b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: id, Token: token, Response: sampleResponse()})
			},
			"release": func(id idemstore.Identity, token string) error {
				return b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: id, Token: token})
			},
			"resolve-completed": func(id idemstore.Identity, token string) error {
				return b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: id, Token: token, To: idemstore.StateCompleted, Response: sampleResponse()})
			},
			"resolve-released": func(id idemstore.Identity, token string) error {
				return b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: id, Token: token, To: idemstore.StateReleased})
			},
		}
		for name, f := range settle {
			id := b.id
			id.Key = name
			token := unknownPast(t, b, id)
			if err := f(id, token); err != nil {
				t.Fatalf("%s of an unknown record past its ExpiresAt: %v", name, err)
			}
			r := b.get(t, id)
			if r.State == idemstore.StateUnknown {
				t.Fatalf("%s: still unknown", name)
			}
			if want := b.clock.Now().Add(shortTTL); !r.ExpiresAt.Equal(want) {
				t.Fatalf("%s: ExpiresAt = %v, want now + TTL = %v", name, r.ExpiresAt, want)
			}
			// Settled, it expires and is reaped like any other record.
			b.clock.Advance(shortTTL + time.Second)
			b.requireNotFound(t, id)
			if n, err := b.store.KeyReap(b.ctx, &idemstore.ReapParams{}); err != nil || n != 1 {
				t.Fatalf("%s: KeyReap = %d, %v; want 1", name, n, err)
			}
		}
	})

	t.Run("CompleteKeepsRetention", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		first := b.reserveNew(t, p)
		if first.TTL != testTTL {
			t.Fatalf("TTL = %v, want %v", first.TTL, testTTL)
		}
		b.clock.Advance(time.Second)
		b.complete(t, b.id, p.Token, sampleResponse())
		if r := b.get(t, b.id); !r.ExpiresAt.Equal(first.ExpiresAt) {
			t.Fatalf("ExpiresAt = %v, want %v (an attempt that was never unknown keeps its retention)", r.ExpiresAt, first.ExpiresAt)
		}
	})
}

func testPurge(t *testing.T, setup setupFunc) {
	purge := func(b *bundle, id idemstore.Identity, token string, force bool) (*idemstore.Record, error) {
		return b.store.KeyPurge(b.ctx, &idemstore.PurgeParams{Identity: id, Token: token, Force: force})
	}

	t.Run("Settled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, st := range []idemstore.State{idemstore.StateCompleted, idemstore.StateReleased} {
			id := b.id
			id.Key = string(st)
			p := b.params(id)
			b.reserveNew(t, p)
			if st == idemstore.StateCompleted {
				b.complete(t, id, p.Token, sampleResponse())
				// Replayed (and so cached, behind a cache) before the
				// purge: the purge must reach every copy.
				b.reserveExisting(t, b.params(id))
			} else {
				b.release(t, id, p.Token)
			}
			_, err := purge(b, id, "other-token", false)
			requireErr(t, "KeyPurge with another token", err, idemstore.ErrLeaseLost)
			r, err := purge(b, id, p.Token, false)
			if err != nil {
				t.Fatalf("KeyPurge of a %s record: %v", st, err)
			}
			if r.Identity != id || r.State != st {
				t.Fatalf("KeyPurge returned %+v %s, want %+v %s", r.Identity, r.State, id, st)
			}
			b.requireNotFound(t, id)
			b.reserveNew(t, b.params(id))
		}
		_, err := purge(b, b.id, "", true)
		requireErr(t, "KeyPurge of a missing record", err, idemstore.ErrNotFound)
	})

	t.Run("UnknownNeedsForce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		p.TTL = shortTTL
		b.reserveNew(t, p)
		_, err := purge(b, b.id, "", false)
		requireErr(t, "KeyPurge of an in_progress record without force", err, idemstore.ErrInvalidState)
		b.markUnknown(t, b.id, p.Token)
		b.clock.Advance(2 * shortTTL)
		_, err = purge(b, b.id, "", false)
		requireErr(t, "KeyPurge of an unknown record without force", err, idemstore.ErrInvalidState)
		requireState(t, b.get(t, b.id), idemstore.StateUnknown)
		r, err := purge(b, b.id, p.Token, true)
		if err != nil || r.State != idemstore.StateUnknown {
			t.Fatalf("KeyPurge(force) = %+v, %v; want the unknown record", r, err)
		}
		b.requireNotFound(t, b.id)
		b.reserveNew(t, b.params(b.id))
	})

	t.Run("ExpiredLeaseNeedsForce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.reserveNew(t, b.params(b.id))
		b.clock.Advance(testLease)
		_, err := purge(b, b.id, "", false)
		requireErr(t, "KeyPurge of an expired lease that turns unknown", err, idemstore.ErrInvalidState)
		if _, err := purge(b, b.id, "", true); err != nil {
			t.Fatalf("KeyPurge(force): %v", err)
		}
		b.requireNotFound(t, b.id)
	})
}

func testReconcileState(t *testing.T, setup setupFunc) {
	claim := func(t *testing.T, b *bundle, limit int, hold time.Duration) []*idemstore.Record {
		t.Helper()
		recs, err := b.store.KeyReconcileClaim(b.ctx, &idemstore.ReconcileClaimParams{Limit: limit, Hold: hold})
		if err != nil {
			t.Fatalf("KeyReconcileClaim: %v", err)
		}
		return recs
	}
	// unknowns makes n unknown records, a second apart, and returns their
	// identities and tokens.
	unknowns := func(t *testing.T, b *bundle, n int) ([]idemstore.Identity, map[idemstore.Identity]string) {
		t.Helper()
		ids := make([]idemstore.Identity, n)
		tokens := map[idemstore.Identity]string{}
		for i := range ids {
			ids[i] = b.id
			ids[i].Key = "unknown-" + string(rune('a'+i%26)) + strings.Repeat("z", i/26)
			p := b.params(ids[i])
			b.reserveNew(t, p)
			b.markUnknown(t, ids[i], p.Token)
			tokens[ids[i]] = p.Token
			b.clock.Advance(time.Second)
		}
		return ids, tokens
	}

	t.Run("Claim", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, _ := unknowns(t, b, 3)
		for i, st := range []idemstore.State{idemstore.StateInProgress, idemstore.StateCompleted, idemstore.StateReleased} {
			id := b.id
			id.Key = "other-" + string(st)
			p := b.params(id)
			b.reserveNew(t, p)
			switch i {
			case 1:
				b.complete(t, id, p.Token, sampleResponse())
			case 2:
				b.release(t, id, p.Token)
			}
		}
		fresh := b.get(t, ids[0])
		if !fresh.ReconcileAfter.IsZero() || fresh.ReconcileAttempts != 0 || fresh.ReconcileError != "" {
			t.Fatalf("a new unknown record has reconcile state %v %d %q, want none", fresh.ReconcileAfter, fresh.ReconcileAttempts, fresh.ReconcileError)
		}

		// Which two a claim of two picks is the store's choice (earliest
		// ReconcileAfter first, exactly in SQL; per bucket in Redis): the
		// suite pins down that no record is handed out twice meanwhile.
		first := claim(t, b, 2, time.Minute)
		got := identities(first)
		if len(got) != 2 || got[0] == got[1] || !slices.Contains(ids, got[0]) || !slices.Contains(ids, got[1]) {
			t.Fatalf("first claim = %v, want two of the unknown records %v", got, ids)
		}
		for _, r := range first {
			requireState(t, r, idemstore.StateUnknown)
			if want := b.clock.Now().Add(time.Minute); !r.ReconcileAfter.Equal(want) {
				t.Fatalf("claimed ReconcileAfter = %v, want %v", r.ReconcileAfter, want)
			}
			if g := b.get(t, r.Identity); !g.ReconcileAfter.Equal(r.ReconcileAfter) {
				t.Fatalf("stored ReconcileAfter = %v, want %v", g.ReconcileAfter, r.ReconcileAfter)
			}
		}
		second := identities(claim(t, b, 10, time.Minute))
		if len(second) != 1 || slices.Contains(got, second[0]) || !slices.Contains(ids, second[0]) {
			t.Fatalf("second claim = %v, want only the third unknown record (the others %v are held)", second, got)
		}
		if got := claim(t, b, 10, time.Minute); len(got) != 0 {
			t.Fatalf("third claim = %v, want none", identities(got))
		}
		b.clock.Advance(time.Minute)
		if got := claim(t, b, 0, time.Minute); len(got) != 3 {
			t.Fatalf("claim after the hold = %v, want all 3", identities(got))
		}
	})

	t.Run("ClaimAfterGrace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const grace = time.Minute
		claimGrace := func() []idemstore.Identity {
			t.Helper()
			recs, err := b.store.KeyReconcileClaim(b.ctx, &idemstore.ReconcileClaimParams{Limit: 10, Hold: time.Minute, Grace: grace})
			if err != nil {
				t.Fatalf("KeyReconcileClaim: %v", err)
			}
			return identities(recs)
		}
		// One marked unknown by its handler with its lease still running,
		// one turned unknown by an expired lease that the sweeper found
		// late: each is withheld until its own LockedUntil plus the grace
		// (a millisecond short of it is not enough).
		marked := b.id
		marked.Key = "marked"
		p := b.params(marked)
		b.reserveNew(t, p)
		b.markUnknown(t, marked, p.Token)
		markedUntil := b.get(t, marked).LockedUntil
		b.clock.Advance(20 * time.Second)
		swept := b.id
		swept.Key = "swept"
		b.reserveNew(t, b.params(swept))
		b.clock.Advance(testLease + time.Second)
		if recs, err := b.store.KeySweep(b.ctx, &idemstore.SweepParams{}); err != nil || len(recs) != 1 {
			t.Fatalf("KeySweep = %v, %v; want the swept record", identities(recs), err)
		}
		sweptUntil := b.get(t, swept).LockedUntil
		requireState(t, b.get(t, swept), idemstore.StateUnknown)
		for _, step := range []struct {
			at   time.Time
			want []idemstore.Identity
		}{
			{markedUntil.Add(grace - time.Millisecond), nil},
			{markedUntil.Add(grace), []idemstore.Identity{marked}},
			{sweptUntil.Add(grace - time.Millisecond), nil}, // the marked one is held
			{sweptUntil.Add(grace), []idemstore.Identity{swept}},
		} {
			b.clock.Set(step.at)
			if got := claimGrace(); !slices.Equal(got, step.want) {
				t.Fatalf("claim at %v (marked until %v, swept until %v, grace %v) = %v, want %v",
					step.at, markedUntil, sweptUntil, grace, got, step.want)
			}
		}
		// Without a grace, a record marked unknown is claimed at once,
		// its lease running or not.
		other := b.id
		other.Key = "no-grace"
		po := b.params(other)
		b.reserveNew(t, po)
		b.markUnknown(t, other, po.Token)
		if got := identities(claim(t, b, 10, time.Minute)); len(got) != 1 || got[0] != other {
			t.Fatalf("claim without a grace = %v, want the new unknown record", got)
		}
	})

	t.Run("Fail", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, tokens := unknowns(t, b, 1)
		id := ids[0]
		claimed := claim(t, b, 1, time.Minute)
		if len(claimed) != 1 {
			t.Fatalf("claimed %d records, want 1", len(claimed))
		}
		long := strings.Repeat("é", idemstore.MaxReconcileError)
		err := b.store.KeyReconcileFail(b.ctx, &idemstore.ReconcileFailParams{Identity: id, Token: "other", Error: "x", Delay: time.Hour})
		requireErr(t, "KeyReconcileFail with another token", err, idemstore.ErrLeaseLost)
		before := b.get(t, id)
		for i := 1; i <= 2; i++ {
			err := b.store.KeyReconcileFail(b.ctx, &idemstore.ReconcileFailParams{Identity: id, Token: claimed[0].Token, Error: long, Delay: 5 * time.Minute})
			if err != nil {
				t.Fatalf("KeyReconcileFail: %v", err)
			}
			r := b.get(t, id)
			if r.ReconcileAttempts != i || !r.ReconcileAfter.Equal(b.clock.Now().Add(5*time.Minute)) {
				t.Fatalf("after %d failures: attempts %d, after %v; want %d, %v", i, r.ReconcileAttempts, r.ReconcileAfter, i, b.clock.Now().Add(5*time.Minute))
			}
			if len(r.ReconcileError) > idemstore.MaxReconcileError || !utf8.ValidString(r.ReconcileError) || !strings.HasPrefix(r.ReconcileError, "éé") {
				t.Fatalf("ReconcileError = %q (%d bytes), want a valid prefix of at most %d bytes", r.ReconcileError, len(r.ReconcileError), idemstore.MaxReconcileError)
			}
			// Reconciliation bookkeeping is no change of the outcome.
			if !r.UpdatedAt.Equal(before.UpdatedAt) || !r.ExpiresAt.Equal(before.ExpiresAt) || r.State != idemstore.StateUnknown {
				t.Fatalf("KeyReconcileFail changed UpdatedAt/ExpiresAt/State: %v %v %s", r.UpdatedAt, r.ExpiresAt, r.State)
			}
		}
		if got := claim(t, b, 10, time.Minute); len(got) != 0 {
			t.Fatalf("claim during the backoff = %v, want none", identities(got))
		}
		b.clock.Advance(5 * time.Minute)
		again := claim(t, b, 10, time.Minute)
		if len(again) != 1 || again[0].ReconcileAttempts != 2 {
			t.Fatalf("claim after the backoff = %d records, want 1 with 2 attempts", len(again))
		}

		// Settled, it is neither claimed nor failed; a new attempt starts
		// the reconciliation state afresh.
		if err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: id, Token: tokens[id], To: idemstore.StateReleased}); err != nil {
			t.Fatalf("KeyResolve: %v", err)
		}
		err = b.store.KeyReconcileFail(b.ctx, &idemstore.ReconcileFailParams{Identity: id, Token: tokens[id], Error: "late", Delay: time.Minute})
		requireErr(t, "KeyReconcileFail of a released record", err, idemstore.ErrLeaseLost)
		b.clock.Advance(time.Hour)
		if got := claim(t, b, 10, time.Minute); len(got) != 0 {
			t.Fatalf("claim of a settled record = %v, want none", identities(got))
		}
		r := b.reserveNew(t, b.params(id))
		if !r.ReconcileAfter.IsZero() || r.ReconcileAttempts != 0 || r.ReconcileError != "" {
			t.Fatalf("a new attempt kept the reconcile state %v %d %q", r.ReconcileAfter, r.ReconcileAttempts, r.ReconcileError)
		}
		got := b.get(t, id)
		if !got.ReconcileAfter.IsZero() || got.ReconcileAttempts != 0 || got.ReconcileError != "" {
			t.Fatalf("a new attempt kept the stored reconcile state %v %d %q", got.ReconcileAfter, got.ReconcileAttempts, got.ReconcileError)
		}
	})

	t.Run("ClaimRace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 60
		ids, _ := unknowns(t, b, n)
		var (
			mu     sync.Mutex
			counts = map[idemstore.Identity]int{}
			errs   []error
		)
		const claimers = 20
		testenv.Race(claimers, func(int) {
			for {
				recs, err := b.store.KeyReconcileClaim(b.ctx, &idemstore.ReconcileClaimParams{Limit: 3, Hold: time.Hour})
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, r := range recs {
					counts[r.Identity]++
				}
				mu.Unlock()
				if err != nil || len(recs) == 0 {
					return
				}
			}
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("KeyReconcileClaim: %v", err)
		}
		for _, id := range ids {
			if counts[id] != 1 {
				t.Fatalf("record %s claimed %d times by %d concurrent claimers, want once", id.Key, counts[id], claimers)
			}
		}
		if len(counts) != n {
			t.Fatalf("claimed %d records, want %d", len(counts), n)
		}
	})

	t.Run("Backlog", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		backlog := func() *idemstore.Backlog {
			t.Helper()
			bl, err := b.store.KeyBacklog(b.ctx)
			if err != nil {
				t.Fatalf("KeyBacklog: %v", err)
			}
			return bl
		}
		if bl := backlog(); bl.Unknown != 0 || !bl.OldestUnknownSince.IsZero() {
			t.Fatalf("empty store: backlog %+v, want none", bl)
		}
		start := b.clock.Now()
		ids, tokens := unknowns(t, b, 3)
		// Neither settled records nor in_progress ones count.
		p := b.params(idemstore.Identity{Scope: b.id.Scope, Endpoint: b.id.Endpoint, Key: "busy"})
		b.reserveNew(t, p)
		if bl := backlog(); bl.Unknown != 3 || !bl.OldestUnknownSince.Equal(start) {
			t.Fatalf("backlog %+v, want 3 since %v", bl, start)
		}
		if err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: ids[0], Token: tokens[ids[0]], To: idemstore.StateReleased}); err != nil {
			t.Fatalf("KeyResolve: %v", err)
		}
		if bl := backlog(); bl.Unknown != 2 || !bl.OldestUnknownSince.Equal(start.Add(time.Second)) {
			t.Fatalf("backlog %+v, want 2 since %v", bl, start.Add(time.Second))
		}
		// Past retention, unknown records still count; swept expired
		// leases join them.
		b.clock.Advance(2 * testTTL)
		if _, err := b.store.KeySweep(b.ctx, &idemstore.SweepParams{}); err != nil {
			t.Fatalf("KeySweep: %v", err)
		}
		if bl := backlog(); bl.Unknown != 3 || !bl.OldestUnknownSince.Equal(start.Add(time.Second)) {
			t.Fatalf("backlog after the sweep %+v, want 3 since %v", bl, start.Add(time.Second))
		}
	})
}
