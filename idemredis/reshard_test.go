package idemredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv/redisproc"
)

// storeCallTimeout is the store-call deadline of the test's calls. The
// middleware's default is 2 s; a loaded CI machine stretches a migration
// past that, so the test gives its calls more, and checks that every
// migration was shorter than it (the claim is about such migrations).
const storeCallTimeout = 10 * time.Second

// TestReshardUnderTraffic moves the slots of a few hot buckets between the
// masters of a private three-master cluster, each migration holding the
// slot half-moved for a while (well under the store-call deadline), while
// two store instances (two clients, as two proxies) race on every key of
// those buckets. Every key is executed exactly once, every call succeeds
// (a moving slot is latency, never an error: none would become a 503), and
// every key ends completed with its response.
func TestReshardUnderTraffic(t *testing.T) {
	t.Parallel()
	cluster := redisproc.StartCluster(t, 3)
	var b [6]byte
	rand.Read(b[:])
	prefix := "idemtest:" + hex.EncodeToString(b[:]) + ":"
	newStore := func() *Store {
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), PoolSize: 32})
		t.Cleanup(func() { client.Close() })
		return New(client, &Config{Prefix: prefix})
	}
	stores := []*Store{newStore(), newStore()}

	// The hot buckets' slots, and keys that fall in them.
	const hotBuckets, keysPerBucket = 4, 150
	var hotSlots []int
	for bucket := range hotBuckets {
		hotSlots = append(hotSlots, hashSlot(stores[0].bucketTag(bucket)))
	}
	var ids []idemstore.Identity
	perBucket := map[int]int{}
	for i := 0; len(ids) < hotBuckets*keysPerBucket; i++ {
		id := idemstore.Identity{Scope: "s", Endpoint: "POST /pay", Key: fmt.Sprintf("k%d", i)}
		slot := hashSlot(stores[0].keysOf(id).record)
		if j := slices.Index(hotSlots, slot); j >= 0 && perBucket[j] < keysPerBucket {
			perBucket[j]++
			ids = append(ids, id)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// The resharder: every hot slot to the next master, round after round,
	// until the traffic is over.
	trafficDone := make(chan struct{})
	var migrations, longestMigration atomic.Int64
	reshardErr := make(chan error, 1)
	go func() {
		defer close(reshardErr)
		for round := 0; ; round++ {
			for _, slot := range hotSlots {
				select {
				case <-trafficDone:
					return
				default:
				}
				from, err := cluster.Owner(ctx, slot)
				if err != nil {
					reshardErr <- err
					return
				}
				began := time.Now()
				if err := cluster.MigrateSlot(ctx, slot, (from+1)%3, 300*time.Millisecond); err != nil {
					reshardErr <- fmt.Errorf("migrating slot %d: %w", slot, err)
					return
				}
				if d := int64(time.Since(began)); d > longestMigration.Load() {
					longestMigration.Store(d)
				}
				migrations.Add(1)
			}
		}
	}()

	var (
		executed = make([]atomic.Int32, len(ids))
		errMu    sync.Mutex
		errs     []error
	)
	fail := func(err error) {
		errMu.Lock()
		errs = append(errs, err)
		errMu.Unlock()
	}
	resp := func(i int) *idemstore.Response {
		return &idemstore.Response{Status: 201, Body: fmt.Appendf(nil, `{"id":%d}`, i)}
	}
	// attempt is one request for key i through store s: reserve, execute
	// and complete when reserved; otherwise the record must be the other
	// instance's in_progress or completed one.
	attempt := func(s *Store, i int, token string) {
		cctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
		defer cancel()
		res, err := s.KeyReserve(cctx, &idemstore.ReserveParams{
			Identity: ids[i], Fingerprint: "fp", Token: token,
			Lease: time.Minute, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown,
		})
		if err != nil {
			fail(fmt.Errorf("reserving key %d: %w", i, err))
			return
		}
		if !res.Reserved {
			if st := res.Record.State; st != idemstore.StateInProgress && st != idemstore.StateCompleted {
				fail(fmt.Errorf("key %d: the other attempt's record is %s", i, st))
			}
			return
		}
		executed[i].Add(1)
		cctx2, cancel2 := context.WithTimeout(ctx, storeCallTimeout)
		defer cancel2()
		if err := s.KeyComplete(cctx2, &idemstore.CompleteParams{Identity: ids[i], Token: token, Response: resp(i)}); err != nil {
			fail(fmt.Errorf("completing key %d: %w", i, err))
		}
	}

	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				var pair sync.WaitGroup
				for j, s := range stores {
					pair.Add(1)
					go func() {
						defer pair.Done()
						attempt(s, i, fmt.Sprintf("t%d-%d", i, j))
					}()
				}
				pair.Wait()
			}
		}()
	}
	// The keys are fed in step with the resharder, so that the traffic
	// spans eight migrations or more.
	const spanMigrations = 8
	for i := range ids {
		for migrations.Load() < int64(i*spanMigrations/len(ids)) {
			select {
			case err := <-reshardErr:
				t.Fatalf("the resharder stopped: %v", err)
			case <-time.After(5 * time.Millisecond):
			}
		}
		work <- i
	}
	close(work)
	wg.Wait()
	close(trafficDone)
	if err := <-reshardErr; err != nil {
		t.Fatal(err)
	}
	longest := time.Duration(longestMigration.Load())
	t.Logf("%d keys, 2 instances, %d migrations in %v (the longest %v); %d calls retried on a moving slot",
		len(ids), migrations.Load(), time.Since(start).Round(time.Millisecond), longest.Round(time.Millisecond),
		stores[0].slotRetries.Load()+stores[1].slotRetries.Load())
	if longest >= storeCallTimeout {
		t.Fatalf("a migration took %v, not shorter than the store-call deadline %v: the machine is too slow for the test's claim", longest, storeCallTimeout)
	}

	for _, err := range errs[:min(len(errs), 10)] {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.Fatalf("%d store calls failed during the reshard; want none", len(errs))
	}
	if migrations.Load() == 0 {
		t.Fatal("no slot moved while the traffic ran: the test proved nothing")
	}
	if stores[0].slotRetries.Load()+stores[1].slotRetries.Load() == 0 {
		t.Fatal("no call met a moving slot: the test proved nothing")
	}
	for i := range ids {
		if n := executed[i].Load(); n != 1 {
			t.Errorf("key %d executed %d times, want once", i, n)
		}
		r, err := stores[i%2].KeyGet(ctx, ids[i])
		if err != nil || r.State != idemstore.StateCompleted || string(r.Response.Body) != string(resp(i).Body) {
			t.Errorf("key %d after the reshard: %+v, %v; want completed with its response", i, r, err)
		}
	}
}
