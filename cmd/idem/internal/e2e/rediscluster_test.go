package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/internal/testenv/redisproc"
)

// bucketSlot is the cluster slot of the record of (scope, endpoint, key) in
// idemredis's key layout: the SHA-256 of the length-prefixed fields picks
// one of 1024 buckets, whose three hex digits are the hash tag. The test
// uses it to send keys into the slots it moves.
func bucketSlot(scope, endpoint, key string) int {
	var buf []byte
	for _, f := range []string{scope, endpoint, key} {
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(f)))
		buf = append(buf, f...)
	}
	sum := sha256.Sum256(buf)
	bucket := int(binary.BigEndian.Uint16(sum[:])) % 1024
	return crc16Slot(fmt.Sprintf("%03x", bucket))
}

// crc16Slot is Redis Cluster's slot of a hash tag: CRC16/XMODEM mod 16384.
func crc16Slot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
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

// TestRedisClusterProxiesUnderReshard runs two `idem proxy` processes on a
// private three-master Redis Cluster through a redis+cluster:// store URL,
// and sends every key to both at once while the test moves the slots that
// hold those keys from master to master, each migration holding its slot
// half-moved for 300 ms (under the proxies' 2 s store timeout). Every key
// reaches the upstream exactly once, every answer is the stored 201 (fresh
// or replayed) or a 409 key-in-use that a retry turns into the replay, and
// no request gets a 503.
func TestRedisClusterProxiesUnderReshard(t *testing.T) {
	t.Parallel()
	cluster := redisproc.StartCluster(t, 3)
	a := cluster.Addrs()
	store := fmt.Sprintf("redis+cluster://%s?addr=%s&addr=%s&prefix=e2e_%s:", a[0], a[1], a[2], randomHex(6))
	up := newUpstream(t, 0, nil)
	var proxies []*proc
	for i := range 2 {
		cmd := exec.Command(idembin.Path(t), "proxy", "--listen", "127.0.0.1:0", "--upstream", up.URL, "--store", store)
		cmd.Env = idembin.Environ()
		proxies = append(proxies, start(t, fmt.Sprintf("proxy-%d", i), cmd))
	}

	// Keys in the slots of three buckets.
	const endpoint = "POST /v1/payments"
	var hot []int
	var keys []string
	for i := 0; len(keys) < 240; i++ {
		key := fmt.Sprintf("reshard-%06d", i)
		slot := bucketSlot("", endpoint, key)
		if !slices.Contains(hot, slot) {
			if len(hot) == 3 {
				continue
			}
			hot = append(hot, slot)
		}
		keys = append(keys, key)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var migrations, longestMigration atomic.Int64
	trafficDone := make(chan struct{})
	reshardErr := make(chan error, 1)
	go func() {
		defer close(reshardErr)
		for {
			for _, slot := range hot {
				select {
				case <-trafficDone:
					return
				default:
				}
				began := time.Now()
				from, err := cluster.Owner(ctx, slot)
				if err == nil {
					err = cluster.MigrateSlot(ctx, slot, (from+1)%3, 300*time.Millisecond)
				}
				if err != nil {
					reshardErr <- fmt.Errorf("moving slot %d: %w", slot, err)
					return
				}
				if d := int64(time.Since(began)); d > longestMigration.Load() {
					longestMigration.Store(d)
				}
				migrations.Add(1)
			}
		}
	}()

	const body = `{"amount":1000,"currency":"EUR"}`
	var (
		mu          sync.Mutex
		problems    []string
		unavailable int
		answers     = map[string][]answer{}
	)
	// send posts key to proxy p until the answer is not 409 key-in-use (the
	// other proxy holds the lease) or 503 store-unavailable (counted), and
	// records every answer.
	send := func(p *proc, key string) {
		for {
			ans := post(ctx, p.URL+"/v1/payments", key, body)
			mu.Lock()
			answers[key] = append(answers[key], ans)
			mu.Unlock()
			if ans.err == nil && ans.status == http.StatusConflict && ans.code == idem.CodeKeyInUse {
				time.Sleep(20 * time.Millisecond) // the other attempt runs on real time
				continue
			}
			if ans.err == nil && ans.status == http.StatusServiceUnavailable && ans.code == idem.CodeStoreUnavailable {
				mu.Lock()
				unavailable++
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if ans.err != nil || ans.status != http.StatusCreated {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("%s via %s: %v", key, p.name, ans))
				mu.Unlock()
			}
			return
		}
	}
	work := make(chan string)
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for key := range work {
				var both sync.WaitGroup
				for _, p := range proxies {
					both.Go(func() { send(p, key) })
				}
				both.Wait()
			}
		})
	}
	// Keys are fed in step with the resharder: the traffic spans six
	// migrations or more.
	for i, key := range keys {
		for migrations.Load() < int64(i*6/len(keys)) {
			select {
			case err := <-reshardErr:
				t.Fatalf("the resharder stopped: %v", err)
			case <-time.After(5 * time.Millisecond):
			}
		}
		work <- key
	}
	close(work)
	wg.Wait()
	close(trafficDone)
	if err := <-reshardErr; err != nil {
		t.Fatal(err)
	}
	longest := time.Duration(longestMigration.Load())
	t.Logf("%d keys through 2 proxies, %d migrations (the longest %v), %d answers 503 store-unavailable",
		len(keys), migrations.Load(), longest.Round(time.Millisecond), unavailable)
	for _, p := range problems[:min(len(problems), 10)] {
		t.Error(p)
	}
	if len(problems) > 0 {
		t.Fatalf("%d answers were neither 201, key-in-use nor store-unavailable; want none", len(problems))
	}
	// The claim is about migrations shorter than the store timeout (2 s by
	// default); a loaded machine can stretch one past it, and then a 503
	// for that slot is the documented fail-closed answer.
	if unavailable > 0 && longest < 2*time.Second {
		t.Fatalf("%d answers were 503 store-unavailable although every migration took less than the 2 s store timeout", unavailable)
	}
	for _, key := range keys {
		if n := up.executions(key); n != 1 {
			t.Errorf("%s reached the upstream %d times, want once", key, n)
		}
		var body201 []byte
		for _, ans := range answers[key] {
			if ans.status != http.StatusCreated {
				continue
			}
			if body201 == nil {
				body201 = ans.body
			} else if string(ans.body) != string(body201) {
				t.Errorf("%s: two different 201 bodies %s and %s", key, body201, ans.body)
			}
		}
	}
}
