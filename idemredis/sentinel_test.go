package idemredis

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/testenv"
)

// TestStoreSentinel runs the conformance suite through a Sentinel-backed
// failover client, against a master and a Sentinel the test starts.
func TestStoreSentinel(t *testing.T) {
	t.Parallel()
	master := privateRedis(t, freePort(t))
	sentinel := startSentinel(t, master.addr)
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    "idemtest",
		SentinelAddrs: []string{sentinel.addr},
		PoolSize:      64,
	})
	t.Cleanup(func() { client.Close() })
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return newTestStore(t, client, clock.Now)
	})
}

// startSentinel starts a Sentinel that monitors the master at masterAddr
// as "idemtest" (quorum 1) and returns once it names that master.
func startSentinel(t *testing.T, masterAddr string) *redisProcess {
	t.Helper()
	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	err := os.WriteFile(conf, fmt.Appendf(nil,
		"port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor idemtest %s 1\n"+
			"sentinel down-after-milliseconds idemtest 1000\nsentinel failover-timeout idemtest 10000\n",
		port, dir, filepath.Join(dir, "sentinel.log"), strings.Replace(masterAddr, ":", " ", 1)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		testenv.Unavailable(t, "cannot start redis-server --sentinel: %v", err)
	}
	sentinel := &redisProcess{cmd: cmd, addr: fmt.Sprintf("127.0.0.1:%d", port), done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(sentinel.done)
	}()
	t.Cleanup(sentinel.kill)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.addr, MaxRetries: -1})
	defer sc.Close()
	if err := pollUntil(ctx, func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, "idemtest").Result()
		return err == nil && len(addr) == 2
	}); err != nil {
		t.Fatalf("the sentinel never named the master: %v\n%s", err, tail(filepath.Join(dir, "sentinel.log")))
	}
	return sentinel
}

// TestSentinelFailover promotes the replica of the store's Redis with
// SENTINEL FAILOVER: a record completed (and replicated) before the
// failover is replayed after it, a call during the switch fails with an
// error (never a wrong answer), and new reservations work on the new
// master.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	master := privateRedis(t, freePort(t))
	replica := privateRedis(t, freePort(t))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	mc := redis.NewClient(&redis.Options{Addr: master.addr})
	defer mc.Close()
	rc := redis.NewClient(&redis.Options{Addr: replica.addr})
	defer rc.Close()
	host, port, _ := strings.Cut(master.addr, ":")
	if err := rc.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	if err := pollUntil(ctx, func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}); err != nil {
		t.Fatalf("the replica never synced: %v", err)
	}
	sentinel := startSentinel(t, master.addr)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.addr})
	defer sc.Close()
	if err := pollUntil(ctx, func() bool {
		replicas, err := sc.Replicas(ctx, "idemtest").Result()
		return err == nil && len(replicas) == 1
	}); err != nil {
		t.Fatalf("the sentinel never found the replica: %v", err)
	}

	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    "idemtest",
		SentinelAddrs: []string{sentinel.addr},
		DialTimeout:   500 * time.Millisecond,
		ReadTimeout:   500 * time.Millisecond,
		WriteTimeout:  500 * time.Millisecond,
		MaxRetries:    -1,
	})
	defer client.Close()
	s := New(client, nil)
	id := func(key string) idemstore.Identity { id := testID; id.Key = key; return id }
	params := func(key, token string) *idemstore.ReserveParams {
		p := reserveParams(token, idemstore.StateUnknown)
		p.Identity = id(key)
		return p
	}
	want := &idemstore.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}
	if res, err := s.KeyReserve(ctx, params("before", "t1")); err != nil || !res.Reserved {
		t.Fatalf("KeyReserve before the failover: %+v, %v", res, err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id("before"), Token: "t1", Response: want}); err != nil {
		t.Fatal(err)
	}
	// Replication is asynchronous: wait until the replica has the
	// completion, as the README says a failover may lose what it has not.
	if n, err := mc.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %d replicas, %v", n, err)
	}

	// Sentinel refuses (NOGOODSLAVE) until it has heard from the replica
	// recently enough: ask again until it accepts.
	var failoverErr error
	if err := pollUntil(ctx, func() bool {
		failoverErr = sc.Failover(ctx, "idemtest").Err()
		return failoverErr == nil || !strings.HasPrefix(failoverErr.Error(), "NOGOODSLAVE")
	}); err != nil || failoverErr != nil {
		t.Fatalf("SENTINEL FAILOVER: %v (%v)", failoverErr, err)
	}
	if err := pollUntil(ctx, func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, "idemtest").Result()
		return err == nil && addr[0]+":"+addr[1] == replica.addr
	}); err != nil {
		t.Fatalf("the sentinel never promoted the replica: %v", err)
	}

	// Sentinel turns the old master into a replica of the new one. Until
	// it has, the old master still takes writes, and what a client writes
	// there is lost when it resyncs: the window the README's guarantees
	// describe. The test waits it out, so that every write below either
	// reaches the new master or fails (READONLY from the old one).
	if err := pollUntil(ctx, func() bool {
		info, err := mc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:slave")
	}); err != nil {
		t.Fatalf("the sentinel never turned the old master into a replica: %v", err)
	}

	// Until the client follows the switch, a call fails; it never reserves
	// twice or answers from nothing.
	var failures int
	if err := pollUntil(ctx, func() bool {
		res, err := s.KeyReserve(ctx, params("before", "t2"))
		if err != nil {
			failures++
			return false
		}
		if res.Reserved || res.Record.State != idemstore.StateCompleted || string(res.Record.Response.Body) != string(want.Body) {
			t.Fatalf("the completed record after the failover: %+v", res)
		}
		return true
	}); err != nil {
		t.Fatalf("the store never answered after the failover (%d failed calls): %v", failures, err)
	}
	res, err := s.KeyReserve(ctx, params("after", "t3"))
	if err != nil || !res.Reserved {
		t.Fatalf("a new key after the failover: %+v, %v", res, err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id("after"), Token: "t3", Response: want}); err != nil {
		t.Fatalf("completing it: %v", err)
	}
	// The new key is on the new master.
	if n, err := rc.Exists(ctx, s.keysOf(id("after")).record).Result(); err != nil || n != 1 {
		t.Fatalf("the new record on the promoted replica: %d, %v", n, err)
	}
	t.Logf("%d calls failed during the switch", failures)
}
