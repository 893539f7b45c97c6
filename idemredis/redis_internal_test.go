package idemredis

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idem-dev/idem/internal/testenv"
)

// TestMain stops the Redis Cluster that the tests may have started, and
// fails the run when a test left goroutines behind (a KeyWait subscription
// or a client not closed).
func TestMain(m *testing.M) {
	code := m.Run()
	testCluster.stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testCluster is the three-master Redis Cluster of this package's tests,
// started on first use and stopped by TestMain.
var testCluster clusterProcs

type clusterProcs struct {
	once  sync.Once
	addrs []string
	procs []*redisProcess
	dir   string
	skip  string // why the cluster is unavailable (redis-server missing)
	err   error
}

// clusterAddrs returns the addresses of the test cluster's masters,
// starting it on the first call. It skips the test (fails it under
// IDEM_TEST_REQUIRE_ALL=1) when redis-server or redis-cli is not on PATH.
func clusterAddrs(t testing.TB) []string {
	t.Helper()
	testCluster.once.Do(testCluster.start)
	if testCluster.skip != "" {
		testenv.Unavailable(t, "%s", testCluster.skip)
	}
	if testCluster.err != nil {
		t.Fatalf("starting the test Redis Cluster: %v", testCluster.err)
	}
	return testCluster.addrs
}

func (c *clusterProcs) start() {
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			c.skip = bin + " is not on PATH: cannot start a Redis Cluster"
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.err = c.startProcs(ctx)
	if c.err != nil {
		c.stop()
	}
}

func (c *clusterProcs) startProcs(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "idemredis-cluster-")
	if err != nil {
		return err
	}
	c.dir = dir
	for range 3 {
		port, err := freeClusterPort()
		if err != nil {
			return err
		}
		p, err := startRedis(ctx, dir, port,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
			"--cluster-node-timeout", "5000")
		if err != nil {
			return err
		}
		c.procs = append(c.procs, p)
		c.addrs = append(c.addrs, p.addr)
	}
	args := append([]string{"--cluster", "create"}, c.addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Wait until every node sees every slot served.
	for _, addr := range c.addrs {
		client := redis.NewClient(&redis.Options{Addr: addr})
		err := pollUntil(ctx, func() bool {
			info, err := client.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
		client.Close()
		if err != nil {
			return fmt.Errorf("cluster node %s never reported cluster_state:ok: %w", addr, err)
		}
	}
	return nil
}

func (c *clusterProcs) stop() {
	for _, p := range c.procs {
		p.kill()
	}
	c.procs = nil
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
}

// freeClusterPort returns a loopback port that is free, as is the cluster
// bus port 10000 above it.
func freeClusterPort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port+10000 > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return port, nil
	}
	return 0, errors.New("no free port pair for a cluster node")
}

// freePort returns a free loopback port.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// redisProcess is a redis-server child process.
type redisProcess struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

// startRedis starts redis-server on port without persistence and waits
// until it answers PING.
func startRedis(ctx context.Context, dir string, port int, extra ...string) (*redisProcess, error) {
	args := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no",
		"--logfile", filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)),
	}, extra...)
	cmd := exec.Command("redis-server", args...)
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	p := &redisProcess{cmd: cmd, addr: "127.0.0.1:" + strconv.Itoa(port), done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	client := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
	defer client.Close()
	err := pollUntil(ctx, func() bool {
		select {
		case <-p.done:
			return true
		default:
		}
		return client.Ping(ctx).Err() == nil
	})
	select {
	case <-p.done:
		return nil, fmt.Errorf("redis-server on port %d exited: %s", port, tail(filepath.Join(dir, fmt.Sprintf("redis-%d.log", port))))
	default:
	}
	if err != nil {
		p.kill()
		return nil, fmt.Errorf("redis-server on port %d does not answer: %w", port, err)
	}
	return p, nil
}

// kill kills the process and waits until it is gone.
func (p *redisProcess) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// pollUntil calls ok every 20ms until it returns true or ctx ends.
func pollUntil(ctx context.Context, ok func() bool) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 10 {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// sharedClient returns a client of the Redis at testenv.RedisURL, closed at
// the end of the test.
func sharedClient(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	opts.PoolSize = 64
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	return client
}

// clusterClient returns a client of the test cluster, closed at the end of
// the test.
func clusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(t), PoolSize: 64})
	t.Cleanup(func() { client.Close() })
	return client
}

// newTestStore returns a store on client under a random prefix whose keys
// are deleted at the end of the test.
func newTestStore(t testing.TB, client redis.UniversalClient, now func() time.Time) *Store {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	s := New(client, &Config{Prefix: "idemtest:" + hex.EncodeToString(b[:]) + ":", Now: now})
	t.Cleanup(func() {
		if err := s.deleteAll(context.Background()); err != nil {
			t.Errorf("deleting the test keys: %v", err)
		}
	})
	return s
}

// deleteAll deletes every key under the store's prefix.
func (s *Store) deleteAll(ctx context.Context) error {
	var mu sync.Mutex
	var keys []string
	err := s.forEachNode(ctx, func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, escapeGlob(s.prefix)+"*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	})
	if err != nil {
		return err
	}
	pipe := s.client.Pipeline()
	for _, k := range keys {
		pipe.Unlink(ctx, k)
	}
	if len(keys) > 0 {
		_, err = pipe.Exec(ctx)
	}
	return err
}
