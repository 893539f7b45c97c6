// Package redisproc starts private redis-server processes for tests: a
// single server with the persistence a test asks for, a Redis Cluster of
// several masters, a Sentinel. Each listens on a free loopback port, lives
// in a temporary directory and is killed when the test ends, so tests may
// kill, restart and reshard them without touching the shared Redis.
//
// A test that calls these skips (fails under IDEM_TEST_REQUIRE_ALL=1) when
// redis-server or redis-cli is not on PATH.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/internal/testenv"
)

// Server is a redis-server child process.
type Server struct {
	// Addr is its host:port.
	Addr string
	// Dir is its working directory (append-only files, logs).
	Dir  string
	t    testing.TB
	args []string
	// op serializes Kill and Restart: a fault campaign heals one crash
	// (Restart) in its own goroutine while it may inject the next (Kill),
	// and a kill amid a restart would look like a server that failed to
	// start. mu guards cmd and done, which a restart replaces while a
	// fault injector may signal the server from another goroutine.
	op   sync.Mutex
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts redis-server on a free loopback port, without persistence
// unless extra says otherwise (later arguments win: "--appendonly", "yes"
// turns the append-only file on), and waits until it answers PING.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	lookPath(t, "redis-server")
	dir := t.TempDir()
	for attempt := 0; ; attempt++ {
		port, err := freePort(false)
		if err != nil {
			t.Fatal(err)
		}
		s, err := start(t, dir, port, extra)
		if err == nil {
			return s
		}
		if attempt == 2 {
			t.Fatal(err)
		}
	}
}

func start(t testing.TB, dir string, port int, extra []string) (*Server, error) {
	args := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no",
		"--logfile", filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)),
	}, extra...)
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, t: t, args: args}
	if err := s.run(); err != nil {
		return nil, err
	}
	t.Cleanup(s.Kill)
	return s, nil
}

// run starts the process with s.args and waits up to 20 s for PING.
func (s *Server) run() error {
	cmd := exec.Command("redis-server", s.args...)
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	client := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := poll(ctx, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		return client.Ping(ctx).Err() == nil
	})
	select {
	case <-done:
		return fmt.Errorf("redis-server %s exited at start: %s", s.Addr, s.Log())
	default:
	}
	if err != nil {
		s.kill()
		return fmt.Errorf("redis-server %s does not answer: %w", s.Addr, err)
	}
	return nil
}

// Log returns the last lines of the server's log.
func (s *Server) Log() string {
	_, port, _ := net.SplitHostPort(s.Addr)
	b, err := os.ReadFile(filepath.Join(s.Dir, "redis-"+port+".log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-10):], "\n")
}

// Kill sends SIGKILL, as a crash would, and waits until the process is
// gone. It does nothing when the server is not running.
func (s *Server) Kill() {
	s.op.Lock()
	defer s.op.Unlock()
	s.kill()
}

// live returns the server's process and the channel closed when it exits
// while the process runs; nil otherwise.
func (s *Server) live() (*exec.Cmd, chan struct{}) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return nil, nil
	}
	select {
	case <-done:
		return nil, nil
	default:
		return cmd, done
	}
}

// running reports whether the server's process runs.
func (s *Server) running() bool {
	cmd, _ := s.live()
	return cmd != nil
}

// kill is Kill without taking op.
func (s *Server) kill() {
	if cmd, done := s.live(); cmd != nil {
		cmd.Process.Kill()
		<-done
	}
}

// Signal sends sig to the server (SIGSTOP: a stalled server, SIGCONT: it
// goes on). It does nothing when the server is not running.
func (s *Server) Signal(sig os.Signal) error {
	if cmd, _ := s.live(); cmd != nil {
		return cmd.Process.Signal(sig)
	}
	return nil
}

// Restart starts the server again, after Kill, on the same port, directory
// and arguments: what it persisted, it reads back. Restart, ReplicaOf and
// Promote report a failure with t.Error and return, rather than t.Fatal:
// a fault campaign calls them from the goroutines that inject and heal its
// faults, where FailNow must not be called.
func (s *Server) Restart() {
	s.t.Helper()
	s.op.Lock()
	defer s.op.Unlock()
	if s.running() {
		return // a campaign's crashes may overlap: this one found it up
	}
	if err := s.run(); err != nil {
		s.t.Error(err)
	}
}

// Client returns a client of the server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Cluster is a Redis Cluster: masters, and with StartClusterWithReplicas
// one replica of each.
type Cluster struct {
	// Masters are its nodes, in the order of the slot ranges they were
	// given at creation.
	Masters []*Server
	// Replicas[i] is the replica of Masters[i], when the cluster has
	// replicas.
	Replicas []*Server
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		addrs[i] = m.Addr
	}
	return addrs
}

// StartCluster starts n cluster-enabled servers, joins them with redis-cli
// --cluster create (slots spread evenly, no replicas) and waits until every
// node reports cluster_state:ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return startCluster(t, n, false, nil)
}

// StartClusterWithReplicas starts a cluster of n masters with one replica
// each (redis-cli --cluster create --cluster-replicas 1), every node with
// the extra arguments (e.g. an append-only file), and waits until every
// node reports cluster_state:ok and every replica's link to its master is
// up.
func StartClusterWithReplicas(t testing.TB, n int, extra ...string) *Cluster {
	t.Helper()
	return startCluster(t, n, true, extra)
}

func startCluster(t testing.TB, n int, replicas bool, extra []string) *Cluster {
	t.Helper()
	lookPath(t, "redis-server")
	lookPath(t, "redis-cli")
	dir := t.TempDir()
	nodes := n
	if replicas {
		nodes = 2 * n
	}
	var all []*Server
	for range nodes {
		var s *Server
		for attempt := 0; ; attempt++ {
			port, err := freePort(true)
			if err != nil {
				t.Fatal(err)
			}
			s, err = start(t, dir, port, append([]string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
				"--cluster-node-timeout", "5000",
			}, extra...))
			if err == nil {
				break
			}
			if attempt == 2 {
				t.Fatal(err)
			}
		}
		all = append(all, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := []string{"--cluster", "create"}
	for _, s := range all {
		args = append(args, s.Addr)
	}
	perMaster := "0"
	if replicas {
		perMaster = "1"
	}
	args = append(args, "--cluster-replicas", perMaster, "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, s := range all {
		client := redis.NewClient(&redis.Options{Addr: s.Addr})
		err := poll(ctx, func() bool {
			info, err := client.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
		client.Close()
		if err != nil {
			t.Fatalf("cluster node %s never reported cluster_state:ok: %v", s.Addr, err)
		}
	}
	if !replicas {
		return &Cluster{Masters: all}
	}
	c, err := clusterRoles(ctx, all)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range c.Replicas {
		client := redis.NewClient(&redis.Options{Addr: r.Addr})
		err := poll(ctx, func() bool {
			info, err := client.Info(ctx, "replication").Result()
			return err == nil && strings.Contains(info, "master_link_status:up")
		})
		client.Close()
		if err != nil {
			t.Fatalf("replica %s never synced: %v", r.Addr, err)
		}
	}
	return c
}

// clusterRoles sorts the nodes of a new cluster into its masters, in the
// order of their slots, and the replica of each, as each node tells its
// own role (INFO replication) and slots (CLUSTER NODES, its "myself" line).
func clusterRoles(ctx context.Context, all []*Server) (*Cluster, error) {
	byPort := make(map[string]*Server, len(all))
	for _, s := range all {
		_, port, _ := net.SplitHostPort(s.Addr)
		byPort[port] = s
	}
	firstSlot := make(map[*Server]int)
	masterOf := make(map[*Server]*Server) // replica -> master
	for _, s := range all {
		client := redis.NewClient(&redis.Options{Addr: s.Addr})
		info, err := client.Info(ctx, "replication").Result()
		var nodes string
		if err == nil {
			nodes, err = client.ClusterNodes(ctx).Result()
		}
		client.Close()
		if err != nil {
			return nil, err
		}
		if strings.Contains(info, "role:master") {
			for _, line := range strings.Split(nodes, "\n") {
				f := strings.Fields(line)
				if len(f) > 8 && strings.Contains(f[2], "myself") {
					lo, _, _ := strings.Cut(f[8], "-")
					firstSlot[s], _ = strconv.Atoi(lo)
				}
			}
			continue
		}
		for _, line := range strings.Split(info, "\n") {
			if port, ok := strings.CutPrefix(strings.TrimSpace(line), "master_port:"); ok {
				masterOf[s] = byPort[port]
			}
		}
	}
	c := &Cluster{}
	for m := range firstSlot {
		c.Masters = append(c.Masters, m)
	}
	sort.Slice(c.Masters, func(i, j int) bool { return firstSlot[c.Masters[i]] < firstSlot[c.Masters[j]] })
	for _, m := range c.Masters {
		for r, rm := range masterOf {
			if rm == m {
				c.Replicas = append(c.Replicas, r)
			}
		}
	}
	if len(c.Masters) != len(c.Replicas) || len(c.Masters)+len(c.Replicas) != len(all) {
		return nil, fmt.Errorf("the cluster's roles are not one replica a master: %d masters, %d replicas of %d nodes",
			len(c.Masters), len(c.Replicas), len(all))
	}
	return c, nil
}

// StartSentinel starts a Sentinel that monitors the master at masterAddr
// as name (quorum 1) and returns once it names that master.
func StartSentinel(t testing.TB, name, masterAddr string) *Server {
	t.Helper()
	lookPath(t, "redis-server")
	dir := t.TempDir()
	port, err := freePort(false)
	if err != nil {
		t.Fatal(err)
	}
	host, mport, _ := net.SplitHostPort(masterAddr)
	conf := filepath.Join(dir, "sentinel.conf")
	err = os.WriteFile(conf, fmt.Appendf(nil,
		"port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor %s %s %s 1\n"+
			"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 10000\n",
		port, dir, filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)), name, host, mport, name, name), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, t: t, args: []string{conf, "--sentinel"}}
	if err := s.run(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer sc.Close()
	if err := poll(ctx, func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, name).Result()
		return err == nil && len(addr) == 2
	}); err != nil {
		t.Fatalf("the sentinel never named the master: %v\n%s", err, s.Log())
	}
	return s
}

func lookPath(t testing.TB, bin string) {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		testenv.Unavailable(t, "%s is not on PATH: cannot start a private Redis", bin)
	}
}

// freePort returns a loopback port that was free a moment ago; with bus,
// the cluster bus port 10000 above it was free too.
func freePort(bus bool) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !bus {
			l.Close()
			return port, nil
		}
		if port+10000 > 65535 {
			l.Close()
			continue
		}
		b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		l.Close()
		if err != nil {
			continue
		}
		b.Close()
		return port, nil
	}
	return 0, errors.New("no free port (pair) on the loopback")
}

// poll calls ok every 20 ms until it returns true or ctx ends. Servers
// start on real time: there is no clock to drive.
func poll(ctx context.Context, ok func() bool) error {
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

// Owner returns the index in Masters of the master that serves slot.
func (c *Cluster) Owner(ctx context.Context, slot int) (int, error) {
	client := redis.NewClient(&redis.Options{Addr: c.Masters[0].Addr})
	defer client.Close()
	shards, err := client.ClusterShards(ctx).Result()
	if err != nil {
		return 0, err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if int64(slot) < r.Start || int64(slot) > r.End {
				continue
			}
			for _, n := range sh.Nodes {
				if n.Role != "master" {
					continue
				}
				addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
				for i, m := range c.Masters {
					if m.Addr == addr {
						return i, nil
					}
				}
				return 0, fmt.Errorf("slot %d is served by %s, not a master of the cluster", slot, addr)
			}
		}
	}
	return 0, fmt.Errorf("slot %d is not served", slot)
}

// MigrateSlot moves slot from the master that serves it to Masters[to] as
// redis-cli --cluster reshard does (SETSLOT IMPORTING and MIGRATING,
// MIGRATE of its keys, SETSLOT NODE on every master), but in two halves
// with a pause of hold between them: for hold, the slot's keys are split
// between the two masters, the state in which a script over several of
// them is refused with TRYAGAIN.
func (c *Cluster) MigrateSlot(ctx context.Context, slot, to int, hold time.Duration) error {
	from, err := c.Owner(ctx, slot)
	if err != nil {
		return err
	}
	if from == to {
		return nil
	}
	clients := make([]*redis.Client, len(c.Masters))
	ids := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		clients[i] = redis.NewClient(&redis.Options{Addr: m.Addr})
		defer clients[i].Close()
		if ids[i], err = clients[i].Do(ctx, "CLUSTER", "MYID").Text(); err != nil {
			return err
		}
	}
	src, dst := clients[from], clients[to]
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]).Err(); err != nil {
		return fmt.Errorf("SETSLOT IMPORTING: %w", err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]).Err(); err != nil {
		return fmt.Errorf("SETSLOT MIGRATING: %w", err)
	}
	host, port, _ := net.SplitHostPort(c.Masters[to].Addr)
	move := func(keys []string) error {
		if len(keys) == 0 {
			return nil
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "REPLACE", "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil && !errors.Is(err, redis.Nil) && err.Error() != "NOKEY" {
			return fmt.Errorf("MIGRATE: %w", err)
		}
		return nil
	}
	keys, err := src.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
	if err != nil {
		return err
	}
	if err := move(keys[:len(keys)/2]); err != nil {
		return err
	}
	t := time.NewTimer(hold)
	select {
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	case <-t.C:
	}
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		if err := move(keys); err != nil {
			return err
		}
	}
	// The new owner first, then the old one, then the others, as
	// redis-cli does.
	order := []int{to, from}
	for i := range c.Masters {
		if i != to && i != from {
			order = append(order, i)
		}
	}
	for _, i := range order {
		if err := clients[i].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err(); err != nil {
			return fmt.Errorf("SETSLOT NODE on %s: %w", c.Masters[i].Addr, err)
		}
	}
	return nil
}

// ReplicaOf makes s a replica of master and waits until the link is up.
func (s *Server) ReplicaOf(master *Server) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	host, port, _ := net.SplitHostPort(master.Addr)
	if err := c.ReplicaOf(ctx, host, port).Err(); err != nil {
		s.t.Error(err)
		return
	}
	if err := poll(ctx, func() bool {
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}); err != nil {
		s.t.Errorf("replica %s never synced with %s: %v", s.Addr, master.Addr, err)
	}
}

// Promote turns a replica into a master (REPLICAOF NO ONE), as a failover
// promotes it.
func (s *Server) Promote() {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	if err := c.ReplicaOf(context.Background(), "NO", "ONE").Err(); err != nil {
		s.t.Error(err)
	}
}
