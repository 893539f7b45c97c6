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

	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	err := os.WriteFile(conf, fmt.Appendf(nil,
		"port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor idemtest %s 1\n",
		port, dir, filepath.Join(dir, "sentinel.log"), strings.Replace(master.addr, ":", " ", 1)), 0o600)
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
