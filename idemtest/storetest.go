// Package idemtest is the conformance suite every idem store runs, and a test
// clock to drive it.
//
// A store's test calls RunStoreTests with a constructor that returns an
// isolated, empty store reading the given Clock:
//
//	func TestStore(t *testing.T) {
//		idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
//			return idemmem.New(&idemmem.Config{Now: clock.Now})
//		})
//	}
//
// The suite is clock-driven: it never sleeps, it moves the Clock. Its times
// and durations are whole seconds, its identities ASCII letters, digits,
// spaces, '-' and '/', so stores may keep millisecond or microsecond times
// and must compare and order identities by bytes (PostgreSQL: COLLATE "C";
// MySQL: VARBINARY, as a case-insensitive or space-padding collation fails
// Reserve/ByteExactIdentities).
//
// Semantics the suite pins down beyond the comments of idemstore.Store:
//
//   - Fenced writes (KeyComplete, KeyRelease, KeyMarkUnknown, KeyDelete,
//     KeyRenew) on a missing record return idemstore.ErrLeaseLost; KeyResolve
//     on a missing record returns idemstore.ErrNotFound.
//   - A lease expires when the clock reaches LockedUntil
//     (idemstore.Record.LeaseExpired); a completed or released record is
//     gone once the clock is past ExpiresAt.
//   - An unknown record (or an in_progress one whose expired lease turns
//     unknown) is never gone: KeyGet and KeyReserve return it, KeyReap
//     leaves it, however far past ExpiresAt the clock is. Settling it
//     restarts its retention (ExpiresAt = now + TTL); only KeyPurge with
//     Force removes it.
//   - KeyReconcileClaim hands each due unknown record to one claimer while
//     its hold lasts (concurrent claimers never share one), never before
//     its LockedUntil plus the claim's Grace, and a new attempt resets the
//     reconciliation state.
//   - Taking over a record keeps CreatedAt, ExpiresAt and RecoveryPoint and
//     starts a new attempt: new token, StartedAt and UpdatedAt now,
//     LockedUntil now+lease, Attempts+1, no response.
//   - KeyList leaves out records past ExpiresAt.
//
// Stores that implement idemstore.TxStore also run the Transactional tests:
// completions and checkpoints commit and roll back with the transaction, are
// fenced, and recovery points survive releases and takeovers. Those tests
// make no other store write while a transaction is open (SQLite has one
// writer), but read with KeyGet, which must not block on it.
//
// Stores that implement idemstore.Waiter also run the Wait tests: KeyWait
// returns at once for a record that is missing or not in progress, returns
// after the record is finished or deleted, and honours its context. The
// Waiter tests are the only ones that wait in real time, each bounded by a
// few seconds.
package idemtest

import (
	"bytes"
	"cmp"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// RunStoreTests runs the conformance suite against the store newStore
// returns. Every subtest calls newStore for an isolated, empty store whose
// clock is clock.Now, and runs in parallel with the others.
func RunStoreTests(t *testing.T, newStore func(t *testing.T, clock *Clock) idemstore.Store) {
	t.Helper()

	setup := func(t *testing.T) *bundle {
		t.Helper()
		// Real wall-clock time, so that stores which also hand expiry to
		// their backend (Redis PEXPIREAT) do not see records born dead.
		clock := NewClock(time.Now().UTC().Truncate(time.Second))
		b := &bundle{
			clock: clock,
			ctx:   t.Context(),
			id: idemstore.Identity{
				Scope:    "tenant-a",
				Endpoint: "POST /v1/payments",
				Key:      "key-1",
			},
		}
		b.store = newStore(t, clock)
		if b.store == nil {
			t.Fatal("newStore returned nil")
		}
		return b
	}

	t.Run("Reserve", func(t *testing.T) {
		t.Parallel()
		testReserve(t, setup)
	})
	t.Run("Complete", func(t *testing.T) {
		t.Parallel()
		testComplete(t, setup)
	})
	t.Run("Fencing", func(t *testing.T) {
		t.Parallel()
		testFencing(t, setup)
	})
	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		testRelease(t, setup)
	})
	t.Run("Unknown", func(t *testing.T) {
		t.Parallel()
		testUnknown(t, setup)
	})
	t.Run("LeaseExpiry", func(t *testing.T) {
		t.Parallel()
		testLeaseExpiry(t, setup)
	})
	t.Run("Renew", func(t *testing.T) {
		t.Parallel()
		testRenew(t, setup)
	})
	t.Run("Delete", func(t *testing.T) {
		t.Parallel()
		testDelete(t, setup)
	})
	t.Run("Resolve", func(t *testing.T) {
		t.Parallel()
		testResolve(t, setup)
	})
	t.Run("Sweep", func(t *testing.T) {
		t.Parallel()
		testSweep(t, setup)
	})
	t.Run("Reap", func(t *testing.T) {
		t.Parallel()
		testReap(t, setup)
	})
	t.Run("List", func(t *testing.T) {
		t.Parallel()
		testList(t, setup)
	})
	t.Run("Retention", func(t *testing.T) {
		t.Parallel()
		testRetention(t, setup)
	})
	t.Run("Purge", func(t *testing.T) {
		t.Parallel()
		testPurge(t, setup)
	})
	t.Run("ReconcileState", func(t *testing.T) {
		t.Parallel()
		testReconcileState(t, setup)
	})
	t.Run("Transactional", func(t *testing.T) {
		t.Parallel()
		testTransactional(t, setup)
	})
	t.Run("Wait", func(t *testing.T) {
		t.Parallel()
		testWait(t, setup)
	})
	t.Run("Encryption", func(t *testing.T) {
		t.Parallel()
		testEncryption(t, setup)
	})
}

type setupFunc func(t *testing.T) *bundle

func testReserve(t *testing.T, setup setupFunc) {
	t.Run("NewKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		now := b.clock.Now()
		p := b.params(b.id)

		r := b.reserveNew(t, p)
		want := &idemstore.Record{
			Identity:          b.id,
			Fingerprint:       testFingerprint,
			State:             idemstore.StateInProgress,
			Token:             p.Token,
			LockedUntil:       now.Add(testLease),
			StartedAt:         now,
			LeaseExpiredState: idemstore.StateUnknown,
			Attempts:          1,
			CreatedAt:         now,
			UpdatedAt:         now,
			ExpiresAt:         now.Add(testTTL),
			TTL:               testTTL,
		}
		requireSameRecord(t, "reserved record", r, want)
		requireSameRecord(t, "KeyGet after reserve", b.get(t, b.id), want)
	})

	t.Run("NewKeyLeaseExpiredStateReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		p.LeaseExpiredState = idemstore.StateReleased
		p.Lease = 5 * time.Second
		p.TTL = time.Hour
		now := b.clock.Now()

		r := b.reserveNew(t, p)
		if r.LeaseExpiredState != idemstore.StateReleased {
			t.Fatalf("LeaseExpiredState = %q, want released", r.LeaseExpiredState)
		}
		if !r.LockedUntil.Equal(now.Add(5*time.Second)) || !r.ExpiresAt.Equal(now.Add(time.Hour)) {
			t.Fatalf("LockedUntil %v ExpiresAt %v, want lease 5s and TTL 1h from %v", r.LockedUntil, r.ExpiresAt, now)
		}
		requireSameRecord(t, "KeyGet after reserve", b.get(t, b.id), r)
	})

	t.Run("ConcurrentNewKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		w := requireOneWinner(t, b.raceReserve(t, b.id, testFingerprint))
		if w.Attempts != 1 {
			t.Fatalf("Attempts = %d, want 1", w.Attempts)
		}
		requireSameRecord(t, "KeyGet after the race", b.get(t, b.id), w)
	})

	t.Run("ExistingWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.reserveNew(t, b.params(b.id))

		b.clock.Advance(5 * time.Second)
		again := b.reserveExisting(t, b.params(b.id))
		requireSameRecord(t, "second reserve of an in_progress record", again, first)
		requireSameRecord(t, "KeyGet after the second reserve", b.get(t, b.id), first)

		b.complete(t, b.id, first.Token, sampleResponse())
		completed := b.get(t, b.id)
		b.clock.Advance(5 * time.Second)
		for range 3 {
			replay := b.reserveExisting(t, b.params(b.id))
			requireSameRecord(t, "reserve of a completed record", replay, completed)
		}
		requireSameRecord(t, "KeyGet after replays", b.get(t, b.id), completed)
	})

	t.Run("ExpiredRecordIsNew", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		p.TTL = time.Hour
		b.reserveNew(t, p)
		b.complete(t, b.id, p.Token, sampleResponse())

		b.clock.Advance(time.Hour + time.Second)
		b.requireNotFound(t, b.id)

		now := b.clock.Now()
		p2 := b.params(b.id)
		p2.Fingerprint = otherFingerprint
		r := b.reserveNew(t, p2)
		requireSameRecord(t, "record reserved after expiry", r, &idemstore.Record{
			Identity:          b.id,
			Fingerprint:       otherFingerprint,
			State:             idemstore.StateInProgress,
			Token:             p2.Token,
			LockedUntil:       now.Add(testLease),
			StartedAt:         now,
			LeaseExpiredState: idemstore.StateUnknown,
			Attempts:          1,
			CreatedAt:         now,
			UpdatedAt:         now,
			ExpiresAt:         now.Add(testTTL),
			TTL:               testTTL,
		})
	})

	t.Run("ExpiredInProgressIsNewOnlyWhenReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		p.TTL = time.Minute
		p.LeaseExpiredState = idemstore.StateReleased
		b.reserveNew(t, p)
		unknown := b.id
		unknown.Key = "turns-unknown"
		pu := b.params(unknown)
		pu.TTL = time.Minute
		b.reserveNew(t, pu)

		b.clock.Advance(time.Minute + time.Second)
		b.requireNotFound(t, b.id)
		r := b.reserveNew(t, b.params(b.id))
		if r.Attempts != 1 {
			t.Fatalf("Attempts = %d, want 1 for a new record", r.Attempts)
		}
		// A lease that turns unknown never expires (see Retention).
		requireState(t, b.reserveExisting(t, b.params(unknown)), idemstore.StateUnknown)
	})

	t.Run("FingerprintMismatch", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name    string
			prepare func(t *testing.T, b *bundle, token string)
			state   idemstore.State
		}{
			{"InProgress", func(*testing.T, *bundle, string) {}, idemstore.StateInProgress},
			{"Completed", func(t *testing.T, b *bundle, token string) {
				b.complete(t, b.id, token, sampleResponse())
			}, idemstore.StateCompleted},
			{"Released", func(t *testing.T, b *bundle, token string) {
				b.release(t, b.id, token)
			}, idemstore.StateReleased},
			{"Unknown", func(t *testing.T, b *bundle, token string) {
				b.markUnknown(t, b.id, token)
			}, idemstore.StateUnknown},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				p := b.params(b.id)
				b.reserveNew(t, p)
				tt.prepare(t, b, p.Token)
				before := b.get(t, b.id)
				requireState(t, before, tt.state)

				b.clock.Advance(time.Second)
				other := b.params(b.id)
				other.Fingerprint = otherFingerprint
				got := b.reserveExisting(t, other)
				requireSameRecord(t, "record returned to another fingerprint", got, before)
				if got.Fingerprint != testFingerprint {
					t.Fatalf("Fingerprint = %q, want the record's own", got.Fingerprint)
				}
				requireSameRecord(t, "KeyGet after the mismatch", b.get(t, b.id), before)
			})
		}
	})

	t.Run("ReleasedNotTakenOverByOtherFingerprint", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		b.release(t, b.id, p.Token)

		results := b.raceReserve(t, b.id, otherFingerprint)
		for i, res := range results {
			if res.Reserved || res.Record.State != idemstore.StateReleased || res.Record.Fingerprint != testFingerprint {
				t.Fatalf("reserve #%d with another fingerprint: Reserved %v state %q fingerprint %q; want the released record",
					i, res.Reserved, res.Record.State, res.Record.Fingerprint)
			}
		}
		// The right fingerprint still takes it over.
		b.reserveNew(t, b.params(b.id))
	})

	t.Run("ScopeIsolation", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := []idemstore.Identity{
			{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "shared"},
			{Scope: "tenant-b", Endpoint: "POST /v1/payments", Key: "shared"},
			{Scope: "", Endpoint: "POST /v1/payments", Key: "shared"},
		}
		testIsolation(t, b, ids)
	})

	t.Run("EndpointIsolation", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := []idemstore.Identity{
			{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "shared"},
			{Scope: "tenant-a", Endpoint: "POST /v1/refunds", Key: "shared"},
			{Scope: "tenant-a", Endpoint: "PATCH /v1/payments", Key: "shared"},
		}
		testIsolation(t, b, ids)
	})

	t.Run("KeyIsolation", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := []idemstore.Identity{
			{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "abc"},
			{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "ABC"},
			{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "abc "},
		}
		testIsolation(t, b, ids)
	})

	t.Run("ByteExactIdentities", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Identities that a case-insensitive or accent-insensitive
		// collation, or one that pads spaces (MySQL's defaults, and
		// MariaDB's utf8mb4_bin), would take for one: each is a record of
		// its own, and they list in byte order.
		base := idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "Order-1"}
		variants := []idemstore.Identity{base}
		for _, key := range []string{"order-1", "ORDER-1", "order-1 ", "Order-1  "} {
			id := base
			id.Key = key
			variants = append(variants, id)
		}
		for _, scope := range []string{"Tenant-A", "tenant-a "} {
			id := base
			id.Scope = scope
			variants = append(variants, id)
		}
		for _, endpoint := range []string{"post /v1/payments", "POST /v1/payments "} {
			id := base
			id.Endpoint = endpoint
			variants = append(variants, id)
		}
		tokens := map[idemstore.Identity]string{}
		for _, id := range variants {
			p := b.params(id)
			r := b.reserveNew(t, p)
			if r.Identity != id {
				t.Fatalf("reserved identity %q, want %q", r.Identity, id)
			}
			tokens[id] = p.Token
		}
		b.complete(t, base, tokens[base], sampleResponse())
		for _, id := range variants {
			r := b.get(t, id)
			if r.Identity != id || r.Token != tokens[id] {
				t.Fatalf("KeyGet(%q) = identity %q token %q, want its own record (token %q)", id, r.Identity, r.Token, tokens[id])
			}
			want := idemstore.StateInProgress
			if id == base {
				want = idemstore.StateCompleted
			}
			requireState(t, r, want)
			if id != base {
				// A reservation of a variant finds the variant's record.
				if got := b.reserveExisting(t, b.params(id)); got.Token != tokens[id] {
					t.Fatalf("KeyReserve(%q) found token %q, want %q", id, got.Token, tokens[id])
				}
			}
		}
		recs, err := b.store.KeyList(b.ctx, &idemstore.ListParams{})
		if err != nil {
			t.Fatalf("KeyList: %v", err)
		}
		want := slices.Clone(variants)
		slices.SortFunc(want, func(x, y idemstore.Identity) int {
			return cmp.Or(strings.Compare(x.Scope, y.Scope), strings.Compare(x.Endpoint, y.Endpoint), strings.Compare(x.Key, y.Key))
		})
		if got := identities(recs); !slices.Equal(got, want) {
			t.Fatalf("KeyList = %q, want byte order %q", got, want)
		}
		recs, err = b.store.KeyList(b.ctx, &idemstore.ListParams{Scope: base.Scope, Endpoint: base.Endpoint})
		if err != nil {
			t.Fatalf("KeyList: %v", err)
		}
		if len(recs) != 5 {
			t.Fatalf("KeyList of scope %q endpoint %q = %q, want the 5 keys of exactly those", base.Scope, base.Endpoint, identities(recs))
		}
	})
}

// testIsolation reserves every identity in ids and checks that finishing one
// leaves the others alone.
func testIsolation(t *testing.T, b *bundle, ids []idemstore.Identity) {
	t.Helper()
	tokens := make([]string, len(ids))
	for i, id := range ids {
		p := b.params(id)
		tokens[i] = p.Token
		r := b.reserveNew(t, p)
		if r.Identity != id {
			t.Fatalf("reserved identity %+v, want %+v", r.Identity, id)
		}
	}
	b.complete(t, ids[0], tokens[0], sampleResponse())
	b.release(t, ids[1], tokens[1])
	requireState(t, b.get(t, ids[0]), idemstore.StateCompleted)
	requireState(t, b.get(t, ids[1]), idemstore.StateReleased)
	third := b.get(t, ids[2])
	requireState(t, third, idemstore.StateInProgress)
	if third.Token != tokens[2] {
		t.Fatalf("token of %+v = %q, want %q", ids[2], third.Token, tokens[2])
	}
	// A token of one record is worthless on another.
	err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: ids[2], Token: tokens[0], Response: sampleResponse()})
	requireErr(t, "KeyComplete with another record's token", err, idemstore.ErrLeaseLost)
}

func testComplete(t *testing.T, setup setupFunc) {
	t.Run("Replay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		reserved := b.reserveNew(t, p)

		b.clock.Advance(2 * time.Second)
		resp := sampleResponse()
		b.complete(t, b.id, p.Token, resp)

		want := *reserved
		want.State = idemstore.StateCompleted
		want.Response = sampleResponse()
		want.UpdatedAt = b.clock.Now()
		got := b.get(t, b.id)
		// LockedUntil is meaningful in_progress only.
		want.LockedUntil = got.LockedUntil
		requireSameRecord(t, "completed record", got, &want)

		b.clock.Advance(time.Minute)
		replay := b.reserveExisting(t, b.params(b.id))
		requireSameRecord(t, "replayed record", replay, &want)
	})

	t.Run("NotReplayable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{
			Identity: b.id, Token: p.Token, Response: sampleResponse(), NotReplayable: true,
		})
		if err != nil {
			t.Fatalf("KeyComplete: %v", err)
		}
		for _, r := range []*idemstore.Record{b.get(t, b.id), b.reserveExisting(t, b.params(b.id))} {
			requireState(t, r, idemstore.StateCompleted)
			if !r.NotReplayable || r.Response != nil {
				t.Fatalf("NotReplayable %v Response %v, want true and nil", r.NotReplayable, r.Response)
			}
		}
	})

	t.Run("EmptyResponse", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name string
			resp *idemstore.Response
		}{
			{"NilHeaderNilBody", &idemstore.Response{Status: http.StatusNoContent}},
			{"EmptyHeaderEmptyBody", &idemstore.Response{Status: http.StatusOK, Header: http.Header{}, Body: []byte{}}},
			{"HeaderWithEmptyValue", &idemstore.Response{Status: http.StatusAccepted, Header: http.Header{"Etag": {""}}}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				p := b.params(b.id)
				b.reserveNew(t, p)
				b.complete(t, b.id, p.Token, tt.resp)
				r := b.get(t, b.id)
				if r.NotReplayable || r.Response == nil {
					t.Fatalf("NotReplayable %v Response %v, want a stored response", r.NotReplayable, r.Response)
				}
				requireResponse(t, r, tt.resp)
			})
		}
	})

	t.Run("BinaryBody", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		body := make([]byte, 0, 4*256+1<<20)
		for range 4 {
			for c := range 256 {
				body = append(body, byte(c))
			}
		}
		// Invalid UTF-8, NULs and a megabyte of pseudo-random bytes.
		x := uint32(2463534242)
		for range 1 << 20 {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			body = append(body, byte(x))
		}
		resp := &idemstore.Response{
			Status: http.StatusOK,
			Header: http.Header{"Content-Type": {"application/octet-stream"}},
			Body:   body,
		}
		p := b.params(b.id)
		b.reserveNew(t, p)
		b.complete(t, b.id, p.Token, resp)
		r := b.get(t, b.id)
		if !bytes.Equal(r.Response.Body, body) {
			t.Fatalf("binary body of %d bytes came back as %d different bytes", len(body), len(r.Response.Body))
		}
		requireResponse(t, b.reserveExisting(t, b.params(b.id)), resp)
	})

	t.Run("CallersDoNotAlias", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		resp := sampleResponse()
		b.complete(t, b.id, p.Token, resp)

		// Change the caller's response after the call...
		resp.Body[0] = 'X'
		resp.Header.Set("Content-Type", "text/evil")
		resp.Header["Link"][0] = "changed"
		got := b.get(t, b.id)
		requireResponse(t, got, sampleResponse())

		// ...and a record the store handed out.
		got.Response.Body[0] = 'Y'
		got.Response.Header.Set("Location", "/elsewhere")
		got.Response.Header["Link"][1] = "changed"
		requireResponse(t, b.get(t, b.id), sampleResponse())
	})

	t.Run("FromUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		b.markUnknown(t, b.id, p.Token)

		err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: b.id, Token: b.token(), Response: sampleResponse()})
		requireErr(t, "KeyComplete of an unknown record with another token", err, idemstore.ErrLeaseLost)
		requireState(t, b.get(t, b.id), idemstore.StateUnknown)

		// A late but true outcome settles it.
		b.complete(t, b.id, p.Token, sampleResponse())
		r := b.get(t, b.id)
		requireState(t, r, idemstore.StateCompleted)
		requireResponse(t, r, sampleResponse())
	})

	t.Run("WrongToken", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		before := b.reserveNew(t, p)
		err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: b.id, Token: b.token(), Response: sampleResponse()})
		requireErr(t, "KeyComplete with another token", err, idemstore.ErrLeaseLost)
		requireSameRecord(t, "record after a refused completion", b.get(t, b.id), before)
	})

	t.Run("NotFromCompletedOrReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		b.complete(t, b.id, p.Token, sampleResponse())
		before := b.get(t, b.id)
		err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{
			Identity: b.id, Token: p.Token, Response: &idemstore.Response{Status: 500},
		})
		requireErr(t, "second KeyComplete", err, idemstore.ErrLeaseLost)
		requireSameRecord(t, "record after a second completion", b.get(t, b.id), before)

		id2 := b.id
		id2.Key = "key-2"
		p2 := b.params(id2)
		b.reserveNew(t, p2)
		b.release(t, id2, p2.Token)
		err = b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: id2, Token: p2.Token, Response: sampleResponse()})
		requireErr(t, "KeyComplete of a released record", err, idemstore.ErrLeaseLost)
		requireState(t, b.get(t, id2), idemstore.StateReleased)
	})

	t.Run("MissingRecord", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: b.id, Token: b.token(), Response: sampleResponse()})
		requireErr(t, "KeyComplete of a missing record", err, idemstore.ErrLeaseLost)
		b.requireNotFound(t, b.id)
	})
}

func testFencing(t *testing.T, setup setupFunc) {
	// stale runs every fenced write with a token whose lease was taken over
	// and checks that none of them changes the record.
	stale := func(t *testing.T, b *bundle, staleToken string) {
		t.Helper()
		before := b.get(t, b.id)
		fp := &idemstore.FinishParams{Identity: b.id, Token: staleToken}
		requireErr(t, "stale KeyComplete", b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{
			Identity: b.id, Token: staleToken, Response: sampleResponse(),
		}), idemstore.ErrLeaseLost)
		requireErr(t, "stale KeyRelease", b.store.KeyRelease(b.ctx, fp), idemstore.ErrLeaseLost)
		requireErr(t, "stale KeyRenew", b.store.KeyRenew(b.ctx, &idemstore.RenewParams{
			Identity: b.id, Token: staleToken, Lease: time.Hour,
		}), idemstore.ErrLeaseLost)
		requireErr(t, "stale KeyMarkUnknown", b.store.KeyMarkUnknown(b.ctx, fp), idemstore.ErrLeaseLost)
		requireErr(t, "stale KeyDelete", b.store.KeyDelete(b.ctx, fp), idemstore.ErrLeaseLost)
		requireSameRecord(t, "record after stale writes", b.get(t, b.id), before)
	}

	t.Run("AfterLeaseTakeover", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		p.LeaseExpiredState = idemstore.StateReleased
		first := b.reserveNew(t, p)

		b.clock.Advance(testLease + time.Second)
		p2 := b.params(b.id)
		p2.LeaseExpiredState = idemstore.StateReleased
		second := b.reserveNew(t, p2)
		if second.Token != p2.Token || second.Attempts != 2 {
			t.Fatalf("takeover: token %q attempts %d, want %q and 2", second.Token, second.Attempts, p2.Token)
		}
		if !second.CreatedAt.Equal(first.CreatedAt) || !second.ExpiresAt.Equal(first.ExpiresAt) {
			t.Fatalf("takeover changed CreatedAt/ExpiresAt: %v/%v, want %v/%v",
				second.CreatedAt, second.ExpiresAt, first.CreatedAt, first.ExpiresAt)
		}
		stale(t, b, p.Token)

		// The new owner is unaffected and can finish.
		b.complete(t, b.id, p2.Token, sampleResponse())
		requireState(t, b.get(t, b.id), idemstore.StateCompleted)
	})

	t.Run("AfterReleaseTakeover", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		b.release(t, b.id, p.Token)
		p2 := b.params(b.id)
		b.reserveNew(t, p2)
		stale(t, b, p.Token)
		b.release(t, b.id, p2.Token)
		requireState(t, b.get(t, b.id), idemstore.StateReleased)
	})
}

func testRelease(t *testing.T, setup setupFunc) {
	t.Run("ConcurrentReclaim", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		first := b.reserveNew(t, p)

		b.clock.Advance(3 * time.Second)
		b.release(t, b.id, p.Token)
		released := b.get(t, b.id)
		requireState(t, released, idemstore.StateReleased)
		if released.Token != p.Token || released.RecoveryPoint != first.RecoveryPoint {
			t.Fatalf("released record: token %q recovery point %q, want %q and %q",
				released.Token, released.RecoveryPoint, p.Token, first.RecoveryPoint)
		}

		b.clock.Advance(time.Second)
		now := b.clock.Now()
		w := requireOneWinner(t, b.raceReserve(t, b.id, testFingerprint))
		want := *first
		want.Token = w.Token
		want.Attempts = 2
		want.StartedAt = now
		want.UpdatedAt = now
		want.LockedUntil = now.Add(testLease)
		requireSameRecord(t, "re-claimed record", w, &want)
		requireSameRecord(t, "KeyGet after the re-claim", b.get(t, b.id), &want)
	})

	t.Run("FromUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		b.markUnknown(t, b.id, p.Token)
		b.release(t, b.id, p.Token)
		requireState(t, b.get(t, b.id), idemstore.StateReleased)
		r := b.reserveNew(t, b.params(b.id))
		if r.Attempts != 2 {
			t.Fatalf("Attempts = %d, want 2", r.Attempts)
		}
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		p := b.params(b.id)
		b.reserveNew(t, p)
		requireErr(t, "KeyRelease with another token",
			b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: b.id, Token: b.token()}), idemstore.ErrLeaseLost)
		requireState(t, b.get(t, b.id), idemstore.StateInProgress)

		b.complete(t, b.id, p.Token, sampleResponse())
		requireErr(t, "KeyRelease of a completed record",
			b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: b.id, Token: p.Token}), idemstore.ErrLeaseLost)
		requireState(t, b.get(t, b.id), idemstore.StateCompleted)

		missing := b.id
		missing.Key = "missing"
		requireErr(t, "KeyRelease of a missing record",
			b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: missing, Token: p.Token}), idemstore.ErrLeaseLost)
	})
}

func testUnknown(t *testing.T, setup setupFunc) {
	t.Run("NeverReclaimed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		b.markUnknown(t, b.id, p.Token)
		unknown := b.get(t, b.id)
		requireState(t, unknown, idemstore.StateUnknown)
		if unknown.Token != p.Token {
			t.Fatalf("token %q, want %q", unknown.Token, p.Token)
		}

		for _, step := range []time.Duration{0, testLease, 10 * testLease} {
			b.clock.Advance(step)
			for _, res := range b.raceReserve(t, b.id, testFingerprint) {
				if res.Reserved {
					t.Fatalf("an unknown record was re-claimed %v after it became unknown", step)
				}
				requireSameRecord(t, "unknown record returned by reserve", res.Record, unknown)
			}
		}
		requireSameRecord(t, "KeyGet of the unknown record", b.get(t, b.id), unknown)
	})

	t.Run("MarkOnlyFromInProgress", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := make([]idemstore.Identity, 4)
		tokens := make([]string, 4)
		for i := range ids {
			ids[i] = b.id
			ids[i].Key = []string{"in-progress", "completed", "released", "unknown"}[i]
			p := b.params(ids[i])
			tokens[i] = p.Token
			b.reserveNew(t, p)
		}
		b.complete(t, ids[1], tokens[1], sampleResponse())
		b.release(t, ids[2], tokens[2])
		b.markUnknown(t, ids[3], tokens[3])

		requireErr(t, "KeyMarkUnknown with another token",
			b.store.KeyMarkUnknown(b.ctx, &idemstore.FinishParams{Identity: ids[0], Token: tokens[1]}), idemstore.ErrLeaseLost)
		for i, want := range []idemstore.State{idemstore.StateCompleted, idemstore.StateReleased, idemstore.StateUnknown} {
			id := ids[i+1]
			requireErr(t, "KeyMarkUnknown of a "+string(want)+" record",
				b.store.KeyMarkUnknown(b.ctx, &idemstore.FinishParams{Identity: id, Token: tokens[i+1]}), idemstore.ErrLeaseLost)
			requireState(t, b.get(t, id), want)
		}
		b.clock.Advance(time.Second)
		b.markUnknown(t, ids[0], tokens[0])
		r := b.get(t, ids[0])
		requireState(t, r, idemstore.StateUnknown)
		if !r.UpdatedAt.Equal(b.clock.Now()) {
			t.Fatalf("UpdatedAt = %v, want %v", r.UpdatedAt, b.clock.Now())
		}
	})
}

func testLeaseExpiry(t *testing.T, setup setupFunc) {
	t.Run("UnknownNoTakeover", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		first := b.reserveNew(t, p)

		b.clock.Advance(testLease - time.Second)
		requireState(t, b.get(t, b.id), idemstore.StateInProgress)
		b.reserveExisting(t, b.params(b.id))

		// The lease ends when the clock reaches LockedUntil.
		b.clock.Set(first.LockedUntil)
		got := b.get(t, b.id)
		requireState(t, got, idemstore.StateUnknown)
		if got.Token != p.Token {
			t.Fatalf("token %q, want %q", got.Token, p.Token)
		}

		b.clock.Advance(time.Second)
		for i, res := range b.raceReserve(t, b.id, testFingerprint) {
			if res.Reserved {
				t.Fatalf("reserve #%d took over an expired lease whose LeaseExpiredState is unknown", i)
			}
			if res.Record.State != idemstore.StateUnknown || res.Record.Token != p.Token || res.Record.Attempts != 1 {
				t.Fatalf("reserve #%d: state %q token %q attempts %d, want unknown, %q, 1",
					i, res.Record.State, res.Record.Token, res.Record.Attempts, p.Token)
			}
		}

		// It stays unknown, and is stored so: the lease cannot be renewed.
		b.clock.Advance(10 * testLease)
		requireState(t, b.get(t, b.id), idemstore.StateUnknown)
		requireState(t, b.reserveExisting(t, b.params(b.id)), idemstore.StateUnknown)
		requireErr(t, "KeyRenew of an expired lease turned unknown",
			b.store.KeyRenew(b.ctx, &idemstore.RenewParams{Identity: b.id, Token: p.Token, Lease: time.Hour}), idemstore.ErrLeaseLost)
		requireErr(t, "KeyMarkUnknown of an expired lease turned unknown",
			b.store.KeyMarkUnknown(b.ctx, &idemstore.FinishParams{Identity: b.id, Token: p.Token}), idemstore.ErrLeaseLost)

		// The attempt's late but true outcome still settles it.
		b.complete(t, b.id, p.Token, sampleResponse())
		requireResponse(t, b.reserveExisting(t, b.params(b.id)), sampleResponse())
	})

	t.Run("ReleasedTakeover", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		p.LeaseExpiredState = idemstore.StateReleased
		first := b.reserveNew(t, p)

		b.clock.Advance(testLease - time.Second)
		b.reserveExisting(t, b.params(b.id))
		requireState(t, b.get(t, b.id), idemstore.StateInProgress)

		b.clock.Set(first.LockedUntil)
		requireState(t, b.get(t, b.id), idemstore.StateReleased)

		b.clock.Advance(time.Second)
		now := b.clock.Now()
		w := requireOneWinner(t, b.raceReserve(t, b.id, testFingerprint))
		if w.Attempts != 2 || !w.StartedAt.Equal(now) || !w.LockedUntil.Equal(now.Add(testLease)) {
			t.Fatalf("takeover: attempts %d started %v locked until %v; want 2, %v, %v",
				w.Attempts, w.StartedAt, w.LockedUntil, now, now.Add(testLease))
		}
		if !w.CreatedAt.Equal(first.CreatedAt) || !w.ExpiresAt.Equal(first.ExpiresAt) {
			t.Fatalf("takeover changed CreatedAt/ExpiresAt")
		}
		requireSameRecord(t, "KeyGet after the takeover", b.get(t, b.id), w)
		requireErr(t, "KeyComplete by the expired attempt",
			b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: b.id, Token: p.Token, Response: sampleResponse()}),
			idemstore.ErrLeaseLost)
	})

	t.Run("KeyGetDoesNotTakeOver", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		p.LeaseExpiredState = idemstore.StateReleased
		b.reserveNew(t, p)
		b.clock.Advance(testLease + time.Second)
		for range 3 {
			r := b.get(t, b.id)
			requireState(t, r, idemstore.StateReleased)
			if r.Token != p.Token || r.Attempts != 1 {
				t.Fatalf("KeyGet changed the record: token %q attempts %d", r.Token, r.Attempts)
			}
		}
	})
}

func testRenew(t *testing.T, setup setupFunc) {
	t.Run("Extends", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		first := b.reserveNew(t, p)

		b.clock.Advance(20 * time.Second)
		err := b.store.KeyRenew(b.ctx, &idemstore.RenewParams{Identity: b.id, Token: p.Token, Lease: testLease})
		if err != nil {
			t.Fatalf("KeyRenew: %v", err)
		}
		r := b.get(t, b.id)
		if want := b.clock.Now().Add(testLease); !r.LockedUntil.Equal(want) {
			t.Fatalf("LockedUntil = %v, want %v (now + lease)", r.LockedUntil, want)
		}
		if r.Attempts != 1 || r.Token != p.Token || !r.StartedAt.Equal(first.StartedAt) {
			t.Fatalf("KeyRenew changed the attempt: %+v", r)
		}

		// Past the original lease the record is still live.
		b.clock.Advance(20 * time.Second)
		requireState(t, b.get(t, b.id), idemstore.StateInProgress)
		b.reserveExisting(t, b.params(b.id))
		requireState(t, b.get(t, b.id), idemstore.StateInProgress)

		// A shorter renewal shortens it: the lease is from now.
		if err := b.store.KeyRenew(b.ctx, &idemstore.RenewParams{Identity: b.id, Token: p.Token, Lease: 5 * time.Second}); err != nil {
			t.Fatalf("KeyRenew: %v", err)
		}
		if got, want := b.get(t, b.id).LockedUntil, b.clock.Now().Add(5*time.Second); !got.Equal(want) {
			t.Fatalf("LockedUntil = %v, want %v", got, want)
		}
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		requireErr(t, "KeyRenew with another token",
			b.store.KeyRenew(b.ctx, &idemstore.RenewParams{Identity: b.id, Token: b.token(), Lease: testLease}), idemstore.ErrLeaseLost)

		b.complete(t, b.id, p.Token, sampleResponse())
		requireErr(t, "KeyRenew of a completed record",
			b.store.KeyRenew(b.ctx, &idemstore.RenewParams{Identity: b.id, Token: p.Token, Lease: testLease}), idemstore.ErrLeaseLost)
		requireState(t, b.get(t, b.id), idemstore.StateCompleted)

		missing := b.id
		missing.Key = "missing"
		requireErr(t, "KeyRenew of a missing record",
			b.store.KeyRenew(b.ctx, &idemstore.RenewParams{Identity: missing, Token: p.Token, Lease: testLease}), idemstore.ErrLeaseLost)
		b.requireNotFound(t, missing)
	})
}

func testDelete(t *testing.T, setup setupFunc) {
	t.Run("Removes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		if err := b.store.KeyDelete(b.ctx, &idemstore.FinishParams{Identity: b.id, Token: p.Token}); err != nil {
			t.Fatalf("KeyDelete: %v", err)
		}
		b.requireNotFound(t, b.id)

		// The corrected request may reuse the key, even with another body.
		p2 := b.params(b.id)
		p2.Fingerprint = otherFingerprint
		r := b.reserveNew(t, p2)
		if r.Attempts != 1 || r.Fingerprint != otherFingerprint {
			t.Fatalf("reserve after delete: attempts %d fingerprint %q, want a new record", r.Attempts, r.Fingerprint)
		}
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.params(b.id)
		b.reserveNew(t, p)
		requireErr(t, "KeyDelete with another token",
			b.store.KeyDelete(b.ctx, &idemstore.FinishParams{Identity: b.id, Token: b.token()}), idemstore.ErrLeaseLost)
		requireState(t, b.get(t, b.id), idemstore.StateInProgress)

		b.complete(t, b.id, p.Token, sampleResponse())
		requireErr(t, "KeyDelete of a completed record",
			b.store.KeyDelete(b.ctx, &idemstore.FinishParams{Identity: b.id, Token: p.Token}), idemstore.ErrLeaseLost)
		requireState(t, b.get(t, b.id), idemstore.StateCompleted)

		id2 := b.id
		id2.Key = "key-2"
		p2 := b.params(id2)
		b.reserveNew(t, p2)
		b.markUnknown(t, id2, p2.Token)
		requireErr(t, "KeyDelete of an unknown record",
			b.store.KeyDelete(b.ctx, &idemstore.FinishParams{Identity: id2, Token: p2.Token}), idemstore.ErrLeaseLost)
		requireState(t, b.get(t, id2), idemstore.StateUnknown)

		missing := b.id
		missing.Key = "missing"
		requireErr(t, "KeyDelete of a missing record",
			b.store.KeyDelete(b.ctx, &idemstore.FinishParams{Identity: missing, Token: p.Token}), idemstore.ErrLeaseLost)
	})
}

func testResolve(t *testing.T, setup setupFunc) {
	// unknownRecord reserves b.id and marks it unknown; it returns the token.
	unknownRecord := func(t *testing.T, b *bundle) string {
		t.Helper()
		p := b.params(b.id)
		b.reserveNew(t, p)
		b.markUnknown(t, b.id, p.Token)
		return p.Token
	}

	t.Run("ToCompleted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		token := unknownRecord(t, b)
		b.clock.Advance(time.Minute)
		err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{
			Identity: b.id, Token: token, To: idemstore.StateCompleted, Response: sampleResponse(),
		})
		if err != nil {
			t.Fatalf("KeyResolve: %v", err)
		}
		r := b.get(t, b.id)
		requireState(t, r, idemstore.StateCompleted)
		requireResponse(t, r, sampleResponse())
		if r.NotReplayable || !r.UpdatedAt.Equal(b.clock.Now()) {
			t.Fatalf("NotReplayable %v UpdatedAt %v, want false and %v", r.NotReplayable, r.UpdatedAt, b.clock.Now())
		}
		requireResponse(t, b.reserveExisting(t, b.params(b.id)), sampleResponse())
	})

	t.Run("ToCompletedWithoutResponse", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		token := unknownRecord(t, b)
		err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: b.id, Token: token, To: idemstore.StateCompleted})
		if err != nil {
			t.Fatalf("KeyResolve: %v", err)
		}
		r := b.get(t, b.id)
		requireState(t, r, idemstore.StateCompleted)
		if !r.NotReplayable || r.Response != nil {
			t.Fatalf("NotReplayable %v Response %v, want true and nil", r.NotReplayable, r.Response)
		}
	})

	t.Run("ToReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		token := unknownRecord(t, b)
		err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: b.id, Token: token, To: idemstore.StateReleased})
		if err != nil {
			t.Fatalf("KeyResolve: %v", err)
		}
		requireState(t, b.get(t, b.id), idemstore.StateReleased)
		w := requireOneWinner(t, b.raceReserve(t, b.id, testFingerprint))
		if w.Attempts != 2 {
			t.Fatalf("Attempts = %d, want 2", w.Attempts)
		}
	})

	t.Run("WrongToken", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		unknownRecord(t, b)
		before := b.get(t, b.id)
		for _, to := range []idemstore.State{idemstore.StateCompleted, idemstore.StateReleased} {
			err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: b.id, Token: b.token(), To: to, Response: sampleResponse()})
			requireErr(t, "KeyResolve with a stale token", err, idemstore.ErrLeaseLost)
		}
		requireSameRecord(t, "record after refused resolutions", b.get(t, b.id), before)
	})

	t.Run("NotUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := make([]idemstore.Identity, 3)
		tokens := make([]string, 3)
		for i := range ids {
			ids[i] = b.id
			ids[i].Key = []string{"in-progress", "completed", "released"}[i]
			p := b.params(ids[i])
			tokens[i] = p.Token
			b.reserveNew(t, p)
		}
		b.complete(t, ids[1], tokens[1], sampleResponse())
		b.release(t, ids[2], tokens[2])
		for i, id := range ids {
			before := b.get(t, id)
			for _, to := range []idemstore.State{idemstore.StateCompleted, idemstore.StateReleased} {
				err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: id, Token: tokens[i], To: to, Response: sampleResponse()})
				requireErr(t, "KeyResolve of a "+string(before.State)+" record", err, idemstore.ErrInvalidState)
			}
			requireSameRecord(t, "record after a refused resolution", b.get(t, id), before)
		}
	})

	t.Run("BadTarget", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		token := unknownRecord(t, b)
		for _, to := range []idemstore.State{idemstore.StateInProgress, idemstore.StateUnknown, "", "deleted"} {
			err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: b.id, Token: token, To: to})
			requireErr(t, "KeyResolve to "+string(to), err, idemstore.ErrInvalidState)
		}
		requireState(t, b.get(t, b.id), idemstore.StateUnknown)
	})

	t.Run("MissingRecord", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		err := b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: b.id, Token: b.token(), To: idemstore.StateReleased})
		requireErr(t, "KeyResolve of a missing record", err, idemstore.ErrNotFound)
	})
}

func testSweep(t *testing.T, setup setupFunc) {
	t.Run("ExpiredLeases", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mk := func(key string, les idemstore.State) (idemstore.Identity, string) {
			id := b.id
			id.Key = key
			p := b.params(id)
			p.LeaseExpiredState = les
			b.reserveNew(t, p)
			return id, p.Token
		}
		toUnknown, _ := mk("to-unknown", idemstore.StateUnknown)
		toReleased, _ := mk("to-released", idemstore.StateReleased)
		completed, ct := mk("completed", idemstore.StateUnknown)
		b.complete(t, completed, ct, sampleResponse())
		unknown, ut := mk("unknown", idemstore.StateUnknown)
		b.markUnknown(t, unknown, ut)

		b.clock.Advance(testLease + time.Second)
		live, _ := mk("live", idemstore.StateUnknown)
		b.clock.Advance(time.Second)
		now := b.clock.Now()

		swept, err := b.store.KeySweep(b.ctx, &idemstore.SweepParams{})
		if err != nil {
			t.Fatalf("KeySweep: %v", err)
		}
		got := map[idemstore.Identity]*idemstore.Record{}
		for _, r := range swept {
			got[r.Identity] = r
		}
		if len(swept) != 2 || got[toUnknown] == nil || got[toReleased] == nil {
			t.Fatalf("KeySweep returned %d records %v, want %q and %q", len(swept), keys(swept), toUnknown.Key, toReleased.Key)
		}
		requireState(t, got[toUnknown], idemstore.StateUnknown)
		requireState(t, got[toReleased], idemstore.StateReleased)
		for id, r := range got {
			requireSameRecord(t, "swept record as returned and as stored", r, b.get(t, id))
			if !r.UpdatedAt.Equal(now) {
				t.Fatalf("swept record UpdatedAt = %v, want %v", r.UpdatedAt, now)
			}
		}
		requireState(t, b.get(t, live), idemstore.StateInProgress)
		requireState(t, b.get(t, completed), idemstore.StateCompleted)
		requireState(t, b.get(t, unknown), idemstore.StateUnknown)

		swept, err = b.store.KeySweep(b.ctx, &idemstore.SweepParams{})
		if err != nil || len(swept) != 0 {
			t.Fatalf("second KeySweep = %v, %v; want nothing", keys(swept), err)
		}
		b.reserveExisting(t, b.params(toUnknown))
		b.reserveNew(t, b.params(toReleased))
	})

	t.Run("Limit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range 5 {
			id := b.id
			id.Key = "key-" + string(rune('a'+i))
			b.reserveNew(t, b.params(id))
		}
		b.clock.Advance(testLease)
		seen := map[idemstore.Identity]bool{}
		for _, want := range []int{2, 2, 1, 0} {
			swept, err := b.store.KeySweep(b.ctx, &idemstore.SweepParams{Limit: 2})
			if err != nil {
				t.Fatalf("KeySweep: %v", err)
			}
			if len(swept) != want {
				t.Fatalf("KeySweep(Limit 2) returned %d records, want %d", len(swept), want)
			}
			for _, r := range swept {
				if seen[r.Identity] {
					t.Fatalf("%q swept twice", r.Key)
				}
				seen[r.Identity] = true
				requireState(t, r, idemstore.StateUnknown)
			}
		}
	})
}

func testReap(t *testing.T, setup setupFunc) {
	t.Run("Expired", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var short, long []idemstore.Identity
		for i, state := range []idemstore.State{
			idemstore.StateCompleted, idemstore.StateInProgress, idemstore.StateUnknown, idemstore.StateReleased,
		} {
			for _, ttl := range []time.Duration{time.Hour, 48 * time.Hour} {
				id := b.id
				id.Key = string(state) + "-" + ttl.String()
				p := b.params(id)
				p.TTL = ttl
				b.reserveNew(t, p)
				switch state {
				case idemstore.StateCompleted:
					b.complete(t, id, p.Token, sampleResponse())
				case idemstore.StateUnknown:
					b.markUnknown(t, id, p.Token)
				case idemstore.StateReleased:
					b.release(t, id, p.Token)
				}
				if ttl == time.Hour {
					short = append(short, id)
				} else {
					long = append(long, id)
				}
			}
			b.clock.Advance(time.Duration(i) * time.Second)
		}

		n, err := b.store.KeyReap(b.ctx, &idemstore.ReapParams{})
		if err != nil || n != 0 {
			t.Fatalf("KeyReap before expiry = %d, %v; want 0", n, err)
		}

		b.clock.Advance(2 * time.Hour)
		// The unknown record and the expired lease that turns unknown are
		// never reaped: only the completed and the released ones.
		gone := []idemstore.Identity{short[0], short[3]}
		kept := []idemstore.Identity{short[1], short[2]}
		total := 0
		for _, want := range []int{1, 1, 0} {
			n, err := b.store.KeyReap(b.ctx, &idemstore.ReapParams{Limit: 1})
			if err != nil {
				t.Fatalf("KeyReap: %v", err)
			}
			if n != want {
				t.Fatalf("KeyReap(Limit 1) = %d, want %d", n, want)
			}
			total += n
		}
		if total != len(gone) {
			t.Fatalf("reaped %d records, want %d", total, len(gone))
		}
		for _, id := range gone {
			b.requireNotFound(t, id)
		}
		for _, id := range kept {
			requireState(t, b.get(t, id), idemstore.StateUnknown)
		}
		for _, id := range long {
			b.get(t, id)
		}
		// A reaped key is new again.
		b.reserveNew(t, b.params(short[0]))
	})

	t.Run("DefaultLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range 7 {
			id := b.id
			id.Key = "key-" + string(rune('a'+i))
			p := b.params(id)
			p.TTL = time.Minute
			b.reserveNew(t, p)
			b.complete(t, id, p.Token, sampleResponse())
		}
		b.clock.Advance(time.Hour)
		n, err := b.store.KeyReap(b.ctx, &idemstore.ReapParams{})
		if err != nil || n != 7 {
			t.Fatalf("KeyReap = %d, %v; want 7", n, err)
		}
	})
}

func testList(t *testing.T, setup setupFunc) {
	// populate makes records in two scopes and two endpoints, created one
	// second apart in the order of ids, in various states; it returns the
	// identities in list order and their creation times.
	populate := func(t *testing.T, b *bundle) ([]idemstore.Identity, map[idemstore.Identity]time.Time) {
		t.Helper()
		var ids []idemstore.Identity
		created := map[idemstore.Identity]time.Time{}
		n := 0
		for _, scope := range []string{"scope-a", "scope-b"} {
			for _, endpoint := range []string{"POST /v1/payments", "POST /v1/refunds"} {
				for _, key := range []string{"k1", "k2", "k3"} {
					id := idemstore.Identity{Scope: scope, Endpoint: endpoint, Key: key}
					p := b.params(id)
					b.reserveNew(t, p)
					switch n % 4 {
					case 1:
						b.complete(t, id, p.Token, sampleResponse())
					case 2:
						b.release(t, id, p.Token)
					case 3:
						b.markUnknown(t, id, p.Token)
					}
					created[id] = b.clock.Now()
					ids = append(ids, id)
					b.clock.Advance(time.Second)
					n++
				}
			}
		}
		return ids, created
	}

	list := func(t *testing.T, b *bundle, p *idemstore.ListParams) []*idemstore.Record {
		t.Helper()
		recs, err := b.store.KeyList(b.ctx, p)
		if err != nil {
			t.Fatalf("KeyList(%+v): %v", p, err)
		}
		return recs
	}

	t.Run("Filters", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, created := populate(t, b)
		states := map[idemstore.Identity]idemstore.State{}
		for _, id := range ids {
			states[id] = b.get(t, id).State
		}

		// filter returns the identities of ids that keep(id) accepts.
		filter := func(keep func(id idemstore.Identity) bool) []idemstore.Identity {
			var out []idemstore.Identity
			for _, id := range ids {
				if keep(id) {
					out = append(out, id)
				}
			}
			return out
		}
		cutoff := created[ids[7]]
		for _, tt := range []struct {
			name string
			p    *idemstore.ListParams
			want []idemstore.Identity
		}{
			{"All", &idemstore.ListParams{}, ids},
			{"State", &idemstore.ListParams{State: idemstore.StateCompleted}, filter(func(id idemstore.Identity) bool {
				return states[id] == idemstore.StateCompleted
			})},
			{"Scope", &idemstore.ListParams{Scope: "scope-b"}, filter(func(id idemstore.Identity) bool {
				return id.Scope == "scope-b"
			})},
			{"Endpoint", &idemstore.ListParams{Endpoint: "POST /v1/refunds"}, filter(func(id idemstore.Identity) bool {
				return id.Endpoint == "POST /v1/refunds"
			})},
			{"CreatedBefore", &idemstore.ListParams{CreatedBefore: cutoff}, filter(func(id idemstore.Identity) bool {
				return created[id].Before(cutoff)
			})},
			{"Combined", &idemstore.ListParams{State: idemstore.StateUnknown, Scope: "scope-a", Endpoint: "POST /v1/refunds"},
				filter(func(id idemstore.Identity) bool {
					return states[id] == idemstore.StateUnknown && id.Scope == "scope-a" && id.Endpoint == "POST /v1/refunds"
				})},
			{"Limit", &idemstore.ListParams{Limit: 4}, ids[:4]},
			{"NoMatch", &idemstore.ListParams{Scope: "scope-z"}, nil},
		} {
			recs := list(t, b, tt.p)
			if got := identities(recs); !slices.Equal(got, tt.want) {
				t.Fatalf("%s: KeyList returned %v, want %v", tt.name, got, tt.want)
			}
			for _, r := range recs {
				if r.State != states[r.Identity] || r.Fingerprint != testFingerprint || !r.CreatedAt.Equal(created[r.Identity]) {
					t.Fatalf("%s: listed record %+v does not match the stored one", tt.name, r)
				}
			}
		}
		if len(filter(func(id idemstore.Identity) bool {
			return states[id] == idemstore.StateUnknown && id.Scope == "scope-a" && id.Endpoint == "POST /v1/refunds"
		})) == 0 {
			t.Fatal("test data has no record for the combined filter")
		}
	})

	t.Run("Pagination", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, _ := populate(t, b)
		var got []idemstore.Identity
		var after *idemstore.Identity
		for page := 0; ; page++ {
			if page > len(ids) {
				t.Fatal("pagination does not end")
			}
			recs := list(t, b, &idemstore.ListParams{After: after, Limit: 5})
			if len(recs) > 5 {
				t.Fatalf("page of %d records, want at most 5", len(recs))
			}
			if len(recs) == 0 {
				break
			}
			got = append(got, identities(recs)...)
			last := recs[len(recs)-1].Identity
			after = &last
		}
		if !slices.Equal(got, ids) {
			t.Fatalf("pages gave %v, want %v", got, ids)
		}

		// A cursor between records, and a filter with a cursor.
		after = &idemstore.Identity{Scope: "scope-a", Endpoint: "POST /v1/refunds", Key: "k15"}
		recs := list(t, b, &idemstore.ListParams{After: after, Scope: "scope-a"})
		if got, want := identities(recs), ids[4:6]; !slices.Equal(got, want) {
			t.Fatalf("KeyList after %v = %v, want %v", *after, got, want)
		}
	})

	t.Run("LeavesOutExpired", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		short := b.id
		short.Key = "short"
		p := b.params(short)
		p.TTL = time.Minute
		b.reserveNew(t, p)
		b.complete(t, short, p.Token, sampleResponse())
		b.reserveNew(t, b.params(b.id))
		b.clock.Advance(time.Hour)
		if got := identities(list(t, b, &idemstore.ListParams{})); !slices.Equal(got, []idemstore.Identity{b.id}) {
			t.Fatalf("KeyList = %v, want only %v", got, b.id)
		}
	})

	t.Run("DefaultLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range 105 {
			id := b.id
			id.Key = "key-" + string(rune('a'+i/26)) + string(rune('a'+i%26))
			b.reserveNew(t, b.params(id))
		}
		if n := len(list(t, b, &idemstore.ListParams{})); n != 100 {
			t.Fatalf("KeyList without a limit returned %d records, want 100", n)
		}
	})
}

func identities(recs []*idemstore.Record) []idemstore.Identity {
	var out []idemstore.Identity
	for _, r := range recs {
		out = append(out, r.Identity)
	}
	return out
}

func keys(recs []*idemstore.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Key)
	}
	return out
}
