package idemredis

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestStore(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return newTestStore(t, client, clock.Now)
	})
}

func TestStoreCluster(t *testing.T) {
	t.Parallel()
	client := clusterClient(t)
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return newTestStore(t, client, clock.Now)
	})
}

// clients runs f against the shared Redis and against the test cluster.
func clients(t *testing.T, f func(t *testing.T, client redis.UniversalClient)) {
	t.Run("Single", func(t *testing.T) {
		t.Parallel()
		f(t, sharedClient(t))
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		f(t, clusterClient(t))
	})
}

var testID = idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "key-1"}

func reserveParams(token string, les idemstore.State) *idemstore.ReserveParams {
	return &idemstore.ReserveParams{
		Identity:          testID,
		Fingerprint:       "fp",
		Token:             token,
		Lease:             30 * time.Second,
		TTL:               24 * time.Hour,
		LeaseExpiredState: les,
	}
}

// TestZombieCannotOverwrite is the fencing proof: an attempt whose lease
// expired and was taken over (LeaseExpiredState released) cannot overwrite
// the new attempt's result, not even racing it.
func TestZombieCannotOverwrite(t *testing.T) {
	t.Parallel()
	clients(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := t.Context()
		clock := idemtest.NewClock(time.Now().Truncate(time.Second))
		s := newTestStore(t, client, clock.Now)
		const n = 50
		zombieResp := &idemstore.Response{Status: 201, Body: []byte("zombie")}
		newResp := &idemstore.Response{Status: 201, Body: []byte("new")}
		for i := range n {
			id := testID
			id.Key = "key-" + strconv.Itoa(i)
			p := reserveParams("zombie-"+id.Key, idemstore.StateReleased)
			p.Identity = id
			if res, err := s.KeyReserve(ctx, p); err != nil || !res.Reserved {
				t.Fatalf("first reserve: %+v, %v", res, err)
			}
		}
		clock.Advance(31 * time.Second)
		errs := make(chan error, 2*n)
		for i := range n {
			id := testID
			id.Key = "key-" + strconv.Itoa(i)
			p := reserveParams("new-"+id.Key, idemstore.StateReleased)
			p.Identity = id
			res, err := s.KeyReserve(ctx, p)
			if err != nil || !res.Reserved || res.Record.Attempts != 2 {
				t.Fatalf("takeover: %+v, %v", res, err)
			}
			// The zombie and the new attempt finish at the same moment.
			go func() {
				errs <- s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "zombie-" + id.Key, Response: zombieResp})
			}()
			go func() {
				errs <- s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "new-" + id.Key, Response: newResp})
			}()
		}
		lost := 0
		for range 2 * n {
			err := <-errs
			switch {
			case errors.Is(err, idemstore.ErrLeaseLost):
				lost++
			case err != nil:
				t.Fatalf("KeyComplete: %v", err)
			}
		}
		if lost != n {
			t.Fatalf("%d completions lost their lease, want the %d zombies", lost, n)
		}
		for i := range n {
			id := testID
			id.Key = "key-" + strconv.Itoa(i)
			zombie := &idemstore.FinishParams{Identity: id, Token: "zombie-" + id.Key}
			for name, err := range map[string]error{
				"KeyRelease":     s.KeyRelease(ctx, zombie),
				"KeyMarkUnknown": s.KeyMarkUnknown(ctx, zombie),
				"KeyDelete":      s.KeyDelete(ctx, zombie),
				"KeyRenew":       s.KeyRenew(ctx, &idemstore.RenewParams{Identity: id, Token: zombie.Token, Lease: time.Hour}),
				"KeyResolve":     s.KeyResolve(ctx, &idemstore.ResolveParams{Identity: id, Token: zombie.Token, To: idemstore.StateReleased}),
			} {
				if !errors.Is(err, idemstore.ErrLeaseLost) {
					t.Fatalf("zombie %s: %v, want ErrLeaseLost", name, err)
				}
			}
			r, err := s.KeyGet(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if r.State != idemstore.StateCompleted || r.Token != "new-"+id.Key || string(r.Response.Body) != "new" {
				t.Fatalf("record %s: state %s token %s body %q; want the new attempt's result",
					id.Key, r.State, r.Token, r.Response.Body)
			}
		}
	})
}

// TestLayout checks that a record's keys and channel share one hash slot,
// and that the record carries a native TTL beyond its retention.
func TestLayout(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	s := newTestStore(t, client, time.Now)
	ctx := t.Context()
	for i := range 200 {
		id := idemstore.Identity{Scope: "s", Endpoint: "e", Key: strconv.Itoa(i)}
		k := s.keysOf(id)
		slot := hashSlot(k.record)
		for _, other := range []string{k.index, k.expiry, k.channel, k.unknown, k.reconcile} {
			if hashSlot(other) != slot {
				t.Fatalf("%s and %s are in different slots", k.record, other)
			}
		}
	}
	// A record whose lease would expire into unknown has no native TTL
	// until it is settled: nothing but a settlement or a purge removes it.
	if _, err := s.KeyReserve(ctx, reserveParams("t1", "")); err != nil {
		t.Fatal(err)
	}
	if ttl, err := client.PTTL(ctx, s.keysOf(testID).record).Result(); err != nil || ttl != -1 {
		t.Fatalf("native TTL of an in-progress record = %v, %v; want none (-1)", ttl, err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1"}); err != nil {
		t.Fatal(err)
	}
	ttl, err := client.PTTL(ctx, s.keysOf(testID).record).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 24*time.Hour-time.Minute || ttl > 24*time.Hour+ttlSlack {
		t.Fatalf("native TTL %v, want the retention plus at most %v", ttl, ttlSlack)
	}
	// One released on expiry has it from the start.
	released := testID
	released.Key = "released-on-expiry"
	pr := reserveParams("t2", idemstore.StateReleased)
	pr.Identity = released
	if _, err := s.KeyReserve(ctx, pr); err != nil {
		t.Fatal(err)
	}
	if ttl, err := client.PTTL(ctx, s.keysOf(released).record).Result(); err != nil || ttl < 24*time.Hour {
		t.Fatalf("native TTL of a record released on expiry = %v, %v; want the retention", ttl, err)
	}
	// Length prefixes keep the identity fields apart.
	a := s.keysOf(idemstore.Identity{Scope: "ab", Endpoint: "c", Key: "d"})
	b := s.keysOf(idemstore.Identity{Scope: "a", Endpoint: "bc", Key: "d"})
	if a.record == b.record {
		t.Fatal("different identities share a key")
	}
}

// hashSlot is Redis Cluster's key slot: CRC16 of the hash tag, mod 16384.
func hashSlot(key string) int {
	if i := indexByte(key, '{'); i >= 0 {
		if j := indexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// TestKeyWait checks that a waiter is woken by a completion published from
// the script, and is not woken without one.
func TestKeyWait(t *testing.T) {
	t.Parallel()
	clients(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := t.Context()
		s := newTestStore(t, client, time.Now)
		if _, err := s.KeyReserve(ctx, reserveParams("t1", "")); err != nil {
			t.Fatal(err)
		}

		// Nothing happens: the wait ends with its context.
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if err := s.KeyWait(short, testID); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("KeyWait without a change = %v, want DeadlineExceeded", err)
		}

		done := make(chan error, 1)
		go func() { done <- s.KeyWait(ctx, testID) }()
		// Complete only once the waiter has subscribed.
		channel := s.keysOf(testID).channel
		deadline, cancel2 := context.WithTimeout(ctx, 10*time.Second)
		defer cancel2()
		err := pollUntil(deadline, func() bool {
			n, err := shardNumSub(deadline, client, channel)
			return err == nil && n > 0
		})
		if err != nil {
			t.Fatalf("the waiter never subscribed: %v", err)
		}
		start := time.Now()
		if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: &idemstore.Response{Status: 200}}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("KeyWait: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("KeyWait was not woken by the completion")
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("KeyWait woke %v after the completion", d)
		}

		// A record that is not in progress does not make anyone wait.
		if err := s.KeyWait(ctx, testID); err != nil {
			t.Fatalf("KeyWait of a completed record: %v", err)
		}
	})
}

func shardNumSub(ctx context.Context, client redis.UniversalClient, channel string) (int64, error) {
	var m map[string]int64
	var err error
	if c, ok := client.(*redis.ClusterClient); ok {
		// PUBSUB SHARDNUMSUB is answered by the channel's shard.
		node, nerr := c.MasterForKey(ctx, channel)
		if nerr != nil {
			return 0, nerr
		}
		m, err = node.PubSubShardNumSub(ctx, channel).Result()
	} else {
		m, err = client.PubSubShardNumSub(ctx, channel).Result()
	}
	return m[channel], err
}

// privateRedis starts a redis-server of the test's own on a free port, and
// stops it at the end of the test.
func privateRedis(t *testing.T, port int) *redisProcess {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Unavailable(t, "redis-server is not on PATH: cannot start a private Redis")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	p, err := startRedis(ctx, t.TempDir(), port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	return p
}

// TestOutage kills the store's Redis: calls fail promptly with an error that
// is none of the sentinels, and work again once Redis is back on the port.
func TestOutage(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	p := privateRedis(t, port)
	client := redis.NewClient(&redis.Options{
		Addr:         p.addr,
		DialTimeout:  200 * time.Millisecond,
		ReadTimeout:  200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond,
		PoolTimeout:  200 * time.Millisecond,
		MaxRetries:   -1,
	})
	t.Cleanup(func() { client.Close() })
	clock := idemtest.NewClock(time.Now().Truncate(time.Second))
	s := New(client, &Config{Now: clock.Now})
	ctx := t.Context()

	if res, err := s.KeyReserve(ctx, reserveParams("t1", "")); err != nil || !res.Reserved {
		t.Fatalf("KeyReserve: %+v, %v", res, err)
	}
	p.kill()

	calls := map[string]func(ctx context.Context) error{
		"KeyReserve": func(ctx context.Context) error {
			_, err := s.KeyReserve(ctx, reserveParams("t2", ""))
			return err
		},
		"KeyGet": func(ctx context.Context) error {
			_, err := s.KeyGet(ctx, testID)
			return err
		},
		"KeyComplete": func(ctx context.Context) error {
			return s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: &idemstore.Response{Status: 200}})
		},
		"KeyRelease": func(ctx context.Context) error {
			return s.KeyRelease(ctx, &idemstore.FinishParams{Identity: testID, Token: "t1"})
		},
		"KeySweep": func(ctx context.Context) error {
			_, err := s.KeySweep(ctx, &idemstore.SweepParams{})
			return err
		},
		"KeyReap": func(ctx context.Context) error {
			_, err := s.KeyReap(ctx, &idemstore.ReapParams{})
			return err
		},
		"KeyList": func(ctx context.Context) error {
			_, err := s.KeyList(ctx, &idemstore.ListParams{})
			return err
		},
		"KeyWait": func(ctx context.Context) error {
			return s.KeyWait(ctx, testID)
		},
	}
	for name, call := range calls {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		err := call(ctx)
		cancel()
		if err == nil {
			t.Fatalf("%s with Redis down succeeded", name)
		}
		for _, sentinel := range []error{idemstore.ErrNotFound, idemstore.ErrLeaseLost, idemstore.ErrInvalidState, context.DeadlineExceeded} {
			if errors.Is(err, sentinel) {
				t.Fatalf("%s with Redis down: %v, want an unavailability error", name, err)
			}
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%s with Redis down took %v", name, d)
		}
	}

	// Back on the same port (empty: it kept nothing), with an empty script
	// cache: EVALSHA falls back to EVAL.
	privateRedis(t, port)
	if res, err := s.KeyReserve(ctx, reserveParams("t3", "")); err != nil || !res.Reserved {
		t.Fatalf("KeyReserve after the restart: %+v, %v", res, err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t3", Response: &idemstore.Response{Status: 200}}); err != nil {
		t.Fatalf("KeyComplete after the restart: %v", err)
	}
}

// TestScriptCacheFlushed checks every path after the server lost its
// scripts: the single calls (Store.run) and the pipelined ones (KeySweep,
// KeyReap).
func TestScriptCacheFlushed(t *testing.T) {
	t.Parallel()
	p := privateRedis(t, freePort(t))
	client := redis.NewClient(&redis.Options{Addr: p.addr})
	t.Cleanup(func() { client.Close() })
	clock := idemtest.NewClock(time.Now().Truncate(time.Second))
	s := New(client, &Config{Now: clock.Now})
	ctx := t.Context()
	for i := range 3 {
		p := reserveParams("t"+strconv.Itoa(i), "")
		p.Key = fmt.Sprint(i)
		p.TTL = time.Hour
		if _, err := s.KeyReserve(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	id := func(key string) idemstore.Identity { id := testID; id.Key = key; return id }
	for i, call := range []func() error{
		func() error {
			return s.KeyRenew(ctx, &idemstore.RenewParams{Identity: id("0"), Token: "t0", Lease: 10 * time.Second})
		},
		func() error {
			return s.KeyRelease(ctx, &idemstore.FinishParams{Identity: id("1"), Token: "t1"})
		},
	} {
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := client.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := call(); err != nil {
			t.Fatalf("call %d after SCRIPT FLUSH and FUNCTION FLUSH: %v", i, err)
		}
		if !s.functions.Load() {
			t.Fatalf("call %d after FUNCTION FLUSH: the store stopped calling functions", i)
		}
	}
	clock.Advance(time.Minute)
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	swept, err := s.KeySweep(ctx, &idemstore.SweepParams{})
	if err != nil || len(swept) != 2 { // "1" was released
		t.Fatalf("KeySweep after SCRIPT FLUSH = %d records, %v; want 2", len(swept), err)
	}
	clock.Advance(2 * time.Hour)
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := s.KeyReap(ctx, &idemstore.ReapParams{})
	if err != nil || n != 1 {
		t.Fatalf("KeyReap after SCRIPT FLUSH = %d, %v; want 1 (the swept ones are unknown: never reaped)", n, err)
	}
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if claimed, err := s.KeyReconcileClaim(ctx, &idemstore.ReconcileClaimParams{Hold: time.Minute}); err != nil || len(claimed) != 2 {
		t.Fatalf("KeyReconcileClaim after SCRIPT FLUSH = %d records, %v; want 2", len(claimed), err)
	}
	for _, r := range swept {
		if _, err := s.KeyPurge(ctx, &idemstore.PurgeParams{Identity: r.Identity, Force: true}); err != nil {
			t.Fatalf("KeyPurge: %v", err)
		}
	}
	if keys, err := client.Keys(ctx, "*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("keys left after reaping everything: %v, %v", keys, err)
	}
}

// TestEmptyHeaderRoundTrip covers header encodings the suite does not.
func TestEmptyHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, sharedClient(t), time.Now)
	ctx := t.Context()
	if _, err := s.KeyReserve(ctx, reserveParams("t1", "")); err != nil {
		t.Fatal(err)
	}
	want := http.Header{"X-Multi": {"a", "b"}, "X-Empty": {""}}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: &idemstore.Response{Status: 299, Header: want}}); err != nil {
		t.Fatal(err)
	}
	r, err := s.KeyGet(ctx, testID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Response.Status != 299 || fmt.Sprint(r.Response.Header) != fmt.Sprint(want) || len(r.Response.Body) != 0 {
		t.Fatalf("response %+v", r.Response)
	}
}

// TestUnknownHasNoNativeTTL checks that a record loses its native TTL when
// it turns unknown, however it does (a fenced mark, a reservation that finds
// the lease expired, the sweeper), including a record that had one (marked
// by its attempt, or written by an earlier version that set it at creation).
func TestUnknownHasNoNativeTTL(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	clock := idemtest.NewClock(time.Now().Truncate(time.Second))
	s := newTestStore(t, client, clock.Now)
	ctx := t.Context()
	ids := map[string]idemstore.Identity{}
	for i, how := range []string{"mark", "reserve", "sweep"} {
		id := testID
		id.Key = how
		ids[how] = id
		p := reserveParams("t"+strconv.Itoa(i), idemstore.StateUnknown)
		p.Identity = id
		if _, err := s.KeyReserve(ctx, p); err != nil {
			t.Fatal(err)
		}
		// As a record written before this version: a native TTL from the
		// start.
		if err := client.PExpire(ctx, s.keysOf(id).record, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.KeyMarkUnknown(ctx, &idemstore.FinishParams{Identity: ids["mark"], Token: "t0"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: ids["reserve"], Fingerprint: "fp", Token: "x", Lease: time.Second, TTL: time.Hour}); err != nil || res.Reserved || res.Record.State != idemstore.StateUnknown {
		t.Fatalf("KeyReserve of an expired lease = %+v, %v; want the unknown record", res, err)
	}
	if swept, err := s.KeySweep(ctx, &idemstore.SweepParams{}); err != nil || len(swept) != 1 {
		t.Fatalf("KeySweep = %d records, %v; want 1", len(swept), err)
	}
	for how, id := range ids {
		k := s.keysOf(id)
		if ttl, err := client.PTTL(ctx, k.record).Result(); err != nil || ttl != -1 {
			t.Errorf("%s: native TTL of the unknown record = %v, %v; want none", how, ttl, err)
		}
		if _, err := client.ZScore(ctx, k.unknown, k.member).Result(); err != nil {
			t.Errorf("%s: not in the backlog index: %v", how, err)
		}
		if _, err := client.ZScore(ctx, k.reconcile, k.member).Result(); err != nil {
			t.Errorf("%s: not in the reconcile index: %v", how, err)
		}
	}
	if bl, err := s.KeyBacklog(ctx); err != nil || bl.Unknown != 3 {
		t.Fatalf("KeyBacklog = %+v, %v; want 3", bl, err)
	}
}

// TestFunctionsRefused runs the store as a user that may not call
// functions: it falls back to the scripts (EVALSHA), as on a server before
// Redis 7.
func TestFunctionsRefused(t *testing.T) {
	t.Parallel()
	p := privateRedis(t, freePort(t))
	admin := redis.NewClient(&redis.Options{Addr: p.addr})
	t.Cleanup(func() { admin.Close() })
	ctx := t.Context()
	if err := admin.Do(ctx, "acl", "setuser", "nofunc", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: p.addr, Username: "nofunc", Password: "pw"})
	t.Cleanup(func() { client.Close() })
	s := New(client, nil)
	if res, err := s.KeyReserve(ctx, reserveParams("t", "")); err != nil || !res.Reserved {
		t.Fatalf("KeyReserve: %+v, %v", res, err)
	}
	if s.functions.Load() {
		t.Error("the store still calls functions after NOPERM")
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t", Response: &idemstore.Response{Status: 200}}); err != nil {
		t.Fatalf("KeyComplete: %v", err)
	}
	if r, err := s.KeyGet(ctx, testID); err != nil || r.State != idemstore.StateCompleted {
		t.Fatalf("KeyGet = %+v, %v", r, err)
	}
}

// TestFunctionsOutOfMemory replays a key on a Redis above its maxmemory:
// Redis refuses a function that may write before it runs it, so the store
// runs the script instead, which only reads on a replay; a new key fails.
func TestFunctionsOutOfMemory(t *testing.T) {
	t.Parallel()
	p := privateRedis(t, freePort(t))
	client := redis.NewClient(&redis.Options{Addr: p.addr})
	t.Cleanup(func() { client.Close() })
	ctx := t.Context()
	s := New(client, nil)
	if res, err := s.KeyReserve(ctx, reserveParams("t", "")); err != nil || !res.Reserved {
		t.Fatalf("KeyReserve: %+v, %v", res, err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t", Response: &idemstore.Response{Status: 201}}); err != nil {
		t.Fatalf("KeyComplete: %v", err)
	}
	if err := client.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.KeyReserve(ctx, reserveParams("t2", ""))
	if err != nil || res.Reserved || res.Record.Response == nil || res.Record.Response.Status != 201 {
		t.Fatalf("replay above maxmemory: %+v, %v", res, err)
	}
	p2 := reserveParams("t3", "")
	p2.Key = "other"
	if _, err := s.KeyReserve(ctx, p2); err == nil {
		t.Fatal("a new key above maxmemory was reserved")
	}
	if !s.functions.Load() {
		t.Error("the store stopped calling functions after OOM")
	}
}
