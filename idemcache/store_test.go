package idemcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

func TestConformanceMemLRU(t *testing.T) {
	t.Parallel()
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return New(idemmem.New(&idemmem.Config{Now: clock.Now}), NewLRU(1000, 0), &Config{Now: clock.Now, Logger: discardLogger()})
	})
}

func TestConformanceMemRedis(t *testing.T) {
	t.Parallel()
	client := redisClient(t)
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return New(idemmem.New(&idemmem.Config{Now: clock.Now}), newRedisCache(t, client), &Config{Now: clock.Now, Logger: discardLogger()})
	})
}

// TestConformanceSQLiteLRU runs the suite, transactional tests included,
// through the cache over idemsqlite.
func TestConformanceSQLiteLRU(t *testing.T) {
	t.Parallel()
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return New(openSQLite(t, clock.Now), NewLRU(1000, 0), &Config{Now: clock.Now, Logger: discardLogger()})
	})
}

// TestConformanceDeadCache runs the suite with a cache that always fails and
// is never bypassed: every call falls through to the store.
func TestConformanceDeadCache(t *testing.T) {
	t.Parallel()
	client := deadRedisClient(t)
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return New(idemmem.New(&idemmem.Config{Now: clock.Now}), NewRedis(client, randomPrefix()),
			&Config{Now: clock.Now, Backoff: -1, Logger: discardLogger()})
	})
}

// TestInterfaces checks that the wrapper implements the optional interfaces
// exactly when the wrapped store does.
func TestInterfaces(t *testing.T) {
	t.Parallel()
	type plain struct{ idemstore.Store }
	type waiterOnly struct {
		idemstore.Store
		idemstore.Waiter
	}
	mem := idemmem.New(nil)
	sqlite := openSQLite(t, time.Now)
	for _, tt := range []struct {
		name         string
		inner        idemstore.Store
		waiter, isTx bool
	}{
		{"Plain", plain{mem}, false, false},
		{"Waiter", waiterOnly{mem, mem}, true, false},
		{"TxStore", sqlite, false, true},
		{"TxStoreWaiter", struct {
			idemstore.TxStore
			idemstore.Waiter
		}{sqlite, mem}, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := New(tt.inner, NewLRU(10, 0), nil)
			if _, ok := s.(idemstore.Waiter); ok != tt.waiter {
				t.Errorf("implements Waiter = %v, want %v", ok, tt.waiter)
			}
			if _, ok := s.(idemstore.TxStore); ok != tt.isTx {
				t.Errorf("implements TxStore = %v, want %v", ok, tt.isTx)
			}
			if u := s.(interface{ Unwrap() idemstore.Store }).Unwrap(); u != tt.inner {
				t.Errorf("Unwrap = %T, want the wrapped store", u)
			}
		})
	}
}

// cacheOf returns the *Store inside what New returned, whichever of the
// wrapped store's interfaces it carries.
func cacheOf(t *testing.T, s idemstore.Store) *Store {
	t.Helper()
	switch s := s.(type) {
	case *Store:
		return s
	case *waiterStore:
		return s.Store
	case *txStore:
		return s.Store
	case *txWaiterStore:
		return s.Store
	}
	t.Fatalf("New returned a %T", s)
	return nil
}

// fixture is a counting idemmem store behind a cache, on a test clock.
type fixture struct {
	clock *idemtest.Clock
	inner *countingMem
	cache Cache
	store idemstore.Store
	ctx   context.Context
}

func newFixture(t *testing.T, cache Cache, cfg *Config) *fixture {
	t.Helper()
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	inner := newCountingMem(clock.Now)
	c := Config{Logger: discardLogger()}
	if cfg != nil {
		c = *cfg
	}
	c.Now = clock.Now
	if c.Logger == nil {
		c.Logger = discardLogger()
	}
	return &fixture{clock: clock, inner: inner, cache: cache, store: New(inner, cache, &c), ctx: t.Context()}
}

func (f *fixture) params(fp, token string, ttl time.Duration) *idemstore.ReserveParams {
	return &idemstore.ReserveParams{
		Identity: testID, Fingerprint: fp, Token: token,
		Lease: 30 * time.Second, TTL: ttl, LeaseExpiredState: idemstore.StateUnknown,
	}
}

// completed reserves and completes testID with fingerprint fp1.
func (f *fixture) completed(t *testing.T, ttl time.Duration) {
	t.Helper()
	res, err := f.store.KeyReserve(f.ctx, f.params(fp1, "t0", ttl))
	if err != nil || !res.Reserved {
		t.Fatalf("KeyReserve of a new key: %v (reserved %v)", err, res != nil && res.Reserved)
	}
	if err := f.store.KeyComplete(f.ctx, &idemstore.CompleteParams{Identity: testID, Token: "t0", Response: sampleResponse()}); err != nil {
		t.Fatalf("KeyComplete: %v", err)
	}
}

// replay reserves testID again and returns the result and how many store
// reservations it took.
func (f *fixture) replay(t *testing.T, fp string) (*idemstore.ReserveResult, int64) {
	t.Helper()
	before := f.inner.reserves.Load()
	res, err := f.store.KeyReserve(f.ctx, f.params(fp, "t-replay", 24*time.Hour))
	if err != nil {
		t.Fatalf("KeyReserve: %v", err)
	}
	return res, f.inner.reserves.Load() - before
}

// requireReplay fails unless res is the completed record of testID with fp1
// and the sample response.
func requireReplay(t *testing.T, res *idemstore.ReserveResult) {
	t.Helper()
	if res.Reserved || res.Record.State != idemstore.StateCompleted || res.Record.Fingerprint != fp1 ||
		res.Record.Response == nil || string(res.Record.Response.Body) != string(sampleResponse().Body) {
		t.Fatalf("replay: Reserved %v, record %+v; want the completed record", res.Reserved, res.Record)
	}
}

func caches(t *testing.T) map[string]func(t *testing.T) Cache {
	return map[string]func(t *testing.T) Cache{
		"LRU":   func(*testing.T) Cache { return NewLRU(100, 0) },
		"Redis": func(t *testing.T) Cache { return newRedisCache(t, redisClient(t)) },
	}
}

// TestReplayFromCache: the first replay asks the store and fills the cache,
// the next ones do not touch the store.
func TestReplayFromCache(t *testing.T) {
	t.Parallel()
	for name, newCache := range caches(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, newCache(t), nil)
			f.completed(t, 24*time.Hour)
			stored, err := f.inner.KeyGet(f.ctx, testID)
			if err != nil {
				t.Fatal(err)
			}

			res, calls := f.replay(t, fp1)
			requireReplay(t, res)
			if calls != 1 {
				t.Fatalf("first replay made %d store reservations, want 1 (the cache was empty)", calls)
			}
			for i := range 5 {
				f.clock.Advance(time.Minute)
				res, calls := f.replay(t, fp1)
				requireReplay(t, res)
				requireSameRecord(t, res.Record, stored)
				if calls != 0 {
					t.Fatalf("replay %d made %d store reservations, want 0 (served from the cache)", i+2, calls)
				}
			}
		})
	}
}

// TestOtherFingerprintAsksStore: a cached record with another fingerprint is
// not answered from the cache; the store returns the record (the middleware
// answers key-reused).
func TestOtherFingerprintAsksStore(t *testing.T) {
	t.Parallel()
	f := newFixture(t, NewLRU(100, 0), nil)
	f.completed(t, 24*time.Hour)
	f.replay(t, fp1) // fills the cache
	for range 3 {
		res, calls := f.replay(t, fp2)
		if calls != 1 {
			t.Fatalf("replay with another fingerprint made %d store reservations, want 1", calls)
		}
		requireReplay(t, res) // the record, with its own fingerprint
	}
}

// TestExpiry: a cached record is never served at or past its ExpiresAt
// (minus the margin); the store decides, and the key is new again.
func TestExpiry(t *testing.T) {
	t.Parallel()
	for name, newCache := range caches(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, newCache(t), &Config{ExpiryMargin: -1})
			f.completed(t, time.Hour)
			f.replay(t, fp1) // fills the cache

			f.clock.Advance(time.Hour - time.Millisecond)
			res, calls := f.replay(t, fp1)
			requireReplay(t, res)
			if calls != 0 {
				t.Fatalf("replay a millisecond before expiry made %d store reservations, want 0", calls)
			}

			f.clock.Advance(time.Millisecond) // at ExpiresAt
			res, calls = f.replay(t, fp1)
			if calls != 1 {
				t.Fatalf("replay at ExpiresAt made %d store reservations, want 1 (the store decides)", calls)
			}
			if !res.Reserved || res.Record.State != idemstore.StateInProgress {
				t.Fatalf("replay at ExpiresAt: Reserved %v state %s; want a new reservation", res.Reserved, res.Record.State)
			}
			if rec, err := f.cache.Get(f.ctx, testID); err != nil || rec != nil {
				t.Fatalf("cache after expiry = %v, %v; want the expired entry dropped", rec, err)
			}
		})
	}
}

// TestExpiryMargin: by default a record stops being served from the cache a
// second before its expiry.
func TestExpiryMargin(t *testing.T) {
	t.Parallel()
	f := newFixture(t, NewLRU(100, 0), nil)
	f.completed(t, time.Hour)
	f.replay(t, fp1)
	f.clock.Advance(time.Hour - 2*time.Second)
	if _, calls := f.replay(t, fp1); calls != 0 {
		t.Fatalf("replay 2s before expiry made %d store reservations, want 0", calls)
	}
	f.clock.Advance(time.Second)
	res, calls := f.replay(t, fp1)
	requireReplay(t, res) // the store still has it
	if calls != 1 {
		t.Fatalf("replay 1s before expiry made %d store reservations, want 1 (inside the margin)", calls)
	}
}

// TestOnlyCompletedCached: in_progress, released and unknown records are
// answered by the store every time and never cached.
func TestOnlyCompletedCached(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		finish func(s idemstore.Store, ctx context.Context) error
		state  idemstore.State
	}{
		{"InProgress", func(idemstore.Store, context.Context) error { return nil }, idemstore.StateInProgress},
		{"Unknown", func(s idemstore.Store, ctx context.Context) error {
			return s.KeyMarkUnknown(ctx, &idemstore.FinishParams{Identity: testID, Token: "t0"})
		}, idemstore.StateUnknown},
		{"Released", func(s idemstore.Store, ctx context.Context) error {
			return s.KeyRelease(ctx, &idemstore.FinishParams{Identity: testID, Token: "t0"})
		}, idemstore.StateReleased},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, NewLRU(100, 0), nil)
			if _, err := f.store.KeyReserve(f.ctx, f.params(fp1, "t0", time.Hour)); err != nil {
				t.Fatal(err)
			}
			if err := tt.finish(f.store, f.ctx); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				// Another fingerprint, so a released record is not taken over.
				res, calls := f.replay(t, fp2)
				if calls != 1 || res.Record.State != tt.state {
					t.Fatalf("reserve: %d store reservations, state %s; want 1 and %s", calls, res.Record.State, tt.state)
				}
			}
			if rec, _ := f.cache.Get(f.ctx, testID); rec != nil {
				t.Fatalf("a %s record was cached", tt.state)
			}
		})
	}
}

// TestResolvedCached: an unknown record resolved to completed is cached by
// its first replay.
func TestResolvedCached(t *testing.T) {
	t.Parallel()
	f := newFixture(t, NewLRU(100, 0), nil)
	if _, err := f.store.KeyReserve(f.ctx, f.params(fp1, "t0", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := f.store.KeyMarkUnknown(f.ctx, &idemstore.FinishParams{Identity: testID, Token: "t0"}); err != nil {
		t.Fatal(err)
	}
	if _, calls := f.replay(t, fp1); calls != 1 {
		t.Fatalf("replay of the unknown record made %d store reservations, want 1", calls)
	}
	err := f.store.KeyResolve(f.ctx, &idemstore.ResolveParams{Identity: testID, Token: "t0", To: idemstore.StateCompleted, Response: sampleResponse()})
	if err != nil {
		t.Fatal(err)
	}
	res, calls := f.replay(t, fp1)
	requireReplay(t, res)
	if calls != 1 {
		t.Fatalf("first replay after resolving made %d store reservations, want 1", calls)
	}
	res, calls = f.replay(t, fp1)
	requireReplay(t, res)
	if calls != 0 {
		t.Fatalf("second replay after resolving made %d store reservations, want 0", calls)
	}
}

// TestInvalidate: an out-of-band removal followed by Invalidate reaches the
// store again.
func TestInvalidate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, NewLRU(100, 0), nil)
	f.completed(t, time.Hour)
	f.replay(t, fp1)
	if err := cacheOf(t, f.store).Invalidate(f.ctx, testID); err != nil {
		t.Fatal(err)
	}
	if _, calls := f.replay(t, fp1); calls != 1 {
		t.Fatalf("replay after Invalidate made %d store reservations, want 1", calls)
	}
}

// TestCacheFailure: with a Redis that is not there every replay is answered
// correctly by the store, and a new key still reserves.
func TestCacheFailure(t *testing.T) {
	t.Parallel()
	for _, backoff := range []time.Duration{-1, time.Hour} {
		t.Run(backoff.String(), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, NewRedis(deadRedisClient(t), randomPrefix()), &Config{Backoff: backoff})
			f.completed(t, time.Hour)
			for range 5 {
				res, calls := f.replay(t, fp1)
				requireReplay(t, res)
				if calls != 1 {
					t.Fatalf("replay made %d store reservations, want 1", calls)
				}
			}
			res, err := f.store.KeyReserve(f.ctx, &idemstore.ReserveParams{
				Identity: idemstore.Identity{Key: "new"}, Fingerprint: fp1, Token: "n",
				Lease: time.Minute, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown,
			})
			if err != nil || !res.Reserved {
				t.Fatalf("new key with a dead cache: %v (reserved %v)", err, res != nil && res.Reserved)
			}
		})
	}
}

// TestCorruptEntry: an entry that does not decode is a cache failure: the
// store answers.
func TestCorruptEntry(t *testing.T) {
	t.Parallel()
	client := redisClient(t)
	cache := newRedisCache(t, client)
	f := newFixture(t, cache, &Config{Backoff: -1})
	f.completed(t, time.Hour)
	if err := client.Set(f.ctx, cache.key(testID), "garbage", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	res, calls := f.replay(t, fp1)
	requireReplay(t, res)
	if calls != 1 {
		t.Fatalf("replay over a corrupt entry made %d store reservations, want 1", calls)
	}
	// The store's answer replaced it.
	if _, calls := f.replay(t, fp1); calls != 0 {
		t.Fatalf("replay after the refill made %d store reservations, want 0", calls)
	}
}

// TestForeignEntry: an entry of another identity (a hash collision, or a
// foreign writer under the prefix) is a miss.
func TestForeignEntry(t *testing.T) {
	t.Parallel()
	client := redisClient(t)
	cache := newRedisCache(t, client)
	f := newFixture(t, cache, nil)
	f.completed(t, time.Hour)
	other := fullRecord()
	other.ExpiresAt = f.clock.Now().Add(time.Hour)
	other.Fingerprint = fp1
	data := encodeRecord(nil, other)
	if err := client.Set(f.ctx, cache.key(testID), data, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	res, calls := f.replay(t, fp1)
	requireReplay(t, res)
	if calls != 1 || res.Record.Identity != testID {
		t.Fatalf("replay over a foreign entry: %d store reservations, identity %+v; want 1 and testID", calls, res.Record.Identity)
	}
}

// TestRedisTTL: the Redis entry expires natively at the record's ExpiresAt.
func TestRedisTTL(t *testing.T) {
	t.Parallel()
	client := redisClient(t)
	cache := newRedisCache(t, client)
	ctx := t.Context()
	rec := fullRecord()
	rec.ExpiresAt = time.Now().Add(time.Hour).Truncate(time.Millisecond).Add(500 * time.Microsecond)
	if err := cache.Set(ctx, rec); err != nil {
		t.Fatal(err)
	}
	at, err := client.PExpireTime(ctx, cache.key(rec.Identity)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := rec.ExpiresAt.Truncate(time.Millisecond); time.UnixMilli(at.Milliseconds()).Compare(want) != 0 {
		t.Fatalf("PEXPIRETIME = %v, want %v", time.UnixMilli(at.Milliseconds()), want)
	}
	got, err := cache.Get(ctx, rec.Identity)
	if err != nil || got == nil {
		t.Fatalf("Get = %v, %v", got, err)
	}
	requireSameRecord(t, got, rec)

	// A record Redis already considers expired is not kept.
	rec.ExpiresAt = time.Now().Add(-time.Minute)
	if err := cache.Set(ctx, rec); err != nil {
		t.Fatalf("Set of an expired record: %v", err)
	}
	if got, err := cache.Get(ctx, rec.Identity); err != nil || got != nil {
		t.Fatalf("Get of an expired record = %v, %v; want a miss", got, err)
	}
}

// failingCache is a Cache that fails every call and counts them.
type failingCache struct{ calls atomic.Int64 }

var errCacheDown = errors.New("cache down")

func (c *failingCache) Get(context.Context, idemstore.Identity) (*idemstore.Record, error) {
	c.calls.Add(1)
	return nil, errCacheDown
}

func (c *failingCache) Set(context.Context, *idemstore.Record) error {
	c.calls.Add(1)
	return errCacheDown
}

func (c *failingCache) Delete(context.Context, idemstore.Identity) error {
	c.calls.Add(1)
	return errCacheDown
}

// TestBackoff: after a failure the cache is bypassed for Backoff; a negative
// Backoff asks it every time; a request whose own context ended does not
// blame the cache.
func TestBackoff(t *testing.T) {
	t.Parallel()
	t.Run("Bypass", func(t *testing.T) {
		t.Parallel()
		cache := &failingCache{}
		f := newFixture(t, cache, &Config{Backoff: time.Hour})
		f.completed(t, time.Hour) // one failing Get
		for range 5 {
			res, _ := f.replay(t, fp1)
			requireReplay(t, res)
		}
		if n := cache.calls.Load(); n != 1 {
			t.Fatalf("cache called %d times, want 1 (bypassed after the first failure)", n)
		}
	})
	t.Run("Never", func(t *testing.T) {
		t.Parallel()
		cache := &failingCache{}
		f := newFixture(t, cache, &Config{Backoff: -1})
		f.completed(t, time.Hour) // a failing Get
		for range 5 {
			res, _ := f.replay(t, fp1)
			requireReplay(t, res)
		}
		// Each replay: a Get, then a Set of the store's answer.
		if n := cache.calls.Load(); n != 11 {
			t.Fatalf("cache called %d times, want 11", n)
		}
	})
	t.Run("CallerCanceled", func(t *testing.T) {
		t.Parallel()
		s := cacheOf(t, New(idemmem.New(nil), &failingCache{}, &Config{Backoff: time.Hour}))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		s.failed(ctx, "get", context.Canceled)
		if s.bypassed() {
			t.Fatal("a canceled caller started a backoff")
		}
		s.failed(t.Context(), "get", errCacheDown)
		if !s.bypassed() {
			t.Fatal("a cache failure did not start a backoff")
		}
	})
}

// TestStaleFill: once a record has expired and the key is used again, a late
// fill that writes the old incarnation back is never served: it is past its
// ExpiresAt.
func TestStaleFill(t *testing.T) {
	t.Parallel()
	for name, newCache := range caches(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, newCache(t), nil)
			f.completed(t, time.Hour)
			old, _ := f.replay(t, fp1) // fills the cache

			// The same request again after expiry is a new incarnation,
			// with a response of its own.
			f.clock.Advance(time.Hour + time.Second)
			res, calls := f.replay(t, fp1)
			if calls != 1 || !res.Reserved {
				t.Fatalf("reserve after expiry: %d store reservations, reserved %v; want a new incarnation", calls, res.Reserved)
			}
			created := res.Record.CreatedAt
			second := &idemstore.Response{Status: 201, Body: []byte(`{"id":"pay_2"}`)}
			if err := f.store.KeyComplete(f.ctx, &idemstore.CompleteParams{Identity: testID, Token: "t-replay", Response: second}); err != nil {
				t.Fatal(err)
			}
			// The slow fill of the old incarnation lands now.
			if err := f.cache.Set(f.ctx, old.Record); err != nil {
				t.Fatal(err)
			}
			for i, wantCalls := range []int64{1, 0} {
				res, calls = f.replay(t, fp1)
				if calls != wantCalls || res.Reserved || string(res.Record.Response.Body) != string(second.Body) || !res.Record.CreatedAt.Equal(created) {
					t.Fatalf("replay %d of the new incarnation: %d store reservations, body %s; want %d and the new incarnation's body",
						i, calls, res.Record.Response.Body, wantCalls)
				}
			}
			// Another request for the key asks the store, which answers
			// the new incarnation.
			if res, calls = f.replay(t, fp2); calls != 1 || res.Record.Fingerprint != fp1 || !res.Record.CreatedAt.Equal(created) {
				t.Fatalf("other request: %d store reservations, record %+v; want the store's new incarnation", calls, res.Record)
			}
		})
	}
}

// TestConcurrentReplays: many goroutines replay at once while the cache
// fills; every one gets the completed record, and afterwards the cache
// answers.
func TestConcurrentReplays(t *testing.T) {
	t.Parallel()
	for name, newCache := range caches(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// A generous cache timeout: a fill that times out on a loaded
			// machine would bypass the cache for a backoff, which is not
			// what this test is about.
			f := newFixture(t, newCache(t), &Config{Timeout: 10 * time.Second})
			f.completed(t, time.Hour)
			const n = 100
			errs := make(chan error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					fp := fp1
					if i%10 == 0 {
						fp = fp2
					}
					res, err := f.store.KeyReserve(f.ctx, f.params(fp, fmt.Sprintf("t%d", i), time.Hour))
					switch {
					case err != nil:
						errs <- err
					case res.Reserved || res.Record.State != idemstore.StateCompleted || res.Record.Fingerprint != fp1:
						errs <- fmt.Errorf("replay %d: reserved %v, record %+v", i, res.Reserved, res.Record)
					}
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			res, calls := f.replay(t, fp1)
			requireReplay(t, res)
			if calls != 0 {
				t.Fatalf("replay after the race made %d store reservations, want 0", calls)
			}
		})
	}
}
