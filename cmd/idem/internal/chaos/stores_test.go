//go:build linux

package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/internal/testenv/pgproc"
	"github.com/idem-dev/idem/internal/testenv/redisproc"
)

// linkKinds are the faults of a proxy's link to the store.
var linkKinds = []FaultKind{FaultPartition, FaultLatency, FaultDrop, FaultReset}

// linkFault starts a fault on a relay and returns what ends it.
func linkFault(t *testing.T, r *Relay, f PlannedFault) func() {
	switch f.Kind {
	case FaultPartition:
		r.Blackhole(true)
		return func() { r.Blackhole(false) }
	case FaultLatency:
		r.SetLatency(f.Amount)
		return func() { r.SetLatency(0) }
	case FaultDrop:
		r.Drop()
	case FaultReset:
		r.Reset()
	default:
		t.Errorf("the store has no fault %s", f.Kind)
	}
	return func() {}
}

// relays starts one relay per proxy to target, closed when the test ends.
func relays(t *testing.T, target string) []*Relay {
	t.Helper()
	var out []*Relay
	for range 3 {
		r, err := NewRelay(target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		out = append(out, r)
	}
	return out
}

// sqliteEnv is one SQLite file that the three proxies share. It has no
// link to cut and no server to crash: its faults are the processes'.
type sqliteEnv struct{ path string }

func newSQLiteEnv(t *testing.T) *sqliteEnv {
	return &sqliteEnv{path: filepath.Join(t.TempDir(), "idem.db")}
}

func (s *sqliteEnv) proxyStore(int) string { return "sqlite:" + s.path }
func (s *sqliteEnv) readStore() string     { return "sqlite:" + s.path }
func (s *sqliteEnv) kinds() []FaultKind    { return nil }
func (s *sqliteEnv) durable() bool         { return true }
func (s *sqliteEnv) inject(t *testing.T, f PlannedFault) func() {
	t.Errorf("sqlite has no fault %s", f.Kind)
	return func() {}
}

// redisEnv is a private redis-server with the append-only file fsynced on
// every write (appendfsync always), reached by each proxy through a relay.
type redisEnv struct {
	srv      *redisproc.Server
	relays   []*Relay
	volatile bool
}

func newRedisEnv(t *testing.T) *redisEnv {
	srv := redisproc.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	return &redisEnv{srv: srv, relays: relays(t, srv.Addr)}
}

// newVolatileRedisEnv is a redisEnv without persistence (--save ""
// --appendonly no): a crash forgets every record.
func newVolatileRedisEnv(t *testing.T) *redisEnv {
	srv := redisproc.Start(t)
	return &redisEnv{srv: srv, relays: relays(t, srv.Addr), volatile: true}
}

func (r *redisEnv) proxyStore(i int) string { return "redis://" + r.relays[i].Addr() + "/0" }
func (r *redisEnv) readStore() string       { return "redis://" + r.srv.Addr + "/0" }
func (r *redisEnv) kinds() []FaultKind      { return append([]FaultKind{FaultStoreCrash}, linkKinds...) }
func (r *redisEnv) durable() bool           { return !r.volatile }
func (r *redisEnv) link(i int) *Relay       { return r.relays[i] }
func (r *redisEnv) inject(t *testing.T, f PlannedFault) func() {
	if f.Kind == FaultStoreCrash {
		r.srv.Kill()
		return r.srv.Restart
	}
	return linkFault(t, r.relays[f.Proxy], f)
}

// pgEnv is a private PostgreSQL primary, reached by each proxy through a
// relay; crashed with pg_ctl stop -m immediate.
type pgEnv struct {
	c        *pgproc.Cluster
	relays   []*Relay
	volatile bool
}

func newPGEnv(t *testing.T) *pgEnv {
	c := pgproc.Start(t)
	return &pgEnv{c: c, relays: relays(t, fmt.Sprintf("127.0.0.1:%d", c.Port))}
}

// newAsyncCommitPGEnv is a pgEnv with synchronous_commit=off, its WAL
// writer held back (as TestDurabilityPostgresAsyncCommit does) so that a
// crash loses the commits it had not written.
func newAsyncCommitPGEnv(t *testing.T) *pgEnv {
	c := pgproc.Start(t, "synchronous_commit = off", "wal_writer_delay = 10s", "wal_writer_flush_after = 1GB",
		"bgwriter_lru_maxpages = 0", "autovacuum = off", "checkpoint_timeout = 1h", "max_wal_size = 1GB")
	return &pgEnv{c: c, relays: relays(t, fmt.Sprintf("127.0.0.1:%d", c.Port)), volatile: true}
}

func (p *pgEnv) proxyStore(i int) string {
	return "postgres://postgres@" + p.relays[i].Addr() + "/postgres?sslmode=disable&pool_max_conns=4"
}
func (p *pgEnv) readStore() string  { return p.c.URL }
func (p *pgEnv) kinds() []FaultKind { return append([]FaultKind{FaultStoreCrash}, linkKinds...) }
func (p *pgEnv) durable() bool      { return !p.volatile }
func (p *pgEnv) link(i int) *Relay  { return p.relays[i] }
func (p *pgEnv) inject(t *testing.T, f PlannedFault) func() {
	if f.Kind == FaultStoreCrash {
		p.c.Crash()
		return p.c.Start
	}
	return linkFault(t, p.relays[f.Proxy], f)
}

// replicaStall is how long a failover cuts the replica off before the
// primary dies: the writes of that window exist on the primary only,
// unless the primary waits for the replica (synchronous replication,
// wait_replicas).
const replicaStall = 1500 * time.Millisecond

// pgFailoverEnv is a private primary with a streaming standby, reached by
// the proxies through a multi-host URL (target_session_attrs=read-write).
// With sync, the standby is synchronous (synchronous_standby_names). The
// standby replicates through a relay; the failover partitions it from the
// primary (what the primary sends then never arrives: stopping the standby
// would not do, the kernel's buffers would keep the WAL for it), crashes
// the primary and promotes the standby; the old primary stays down. A
// store crash crashes whichever is the primary and starts it again.
type pgFailoverEnv struct {
	primary, standby *pgproc.Cluster
	replication      *Relay
	sync             bool
	mu               sync.Mutex
	current          *pgproc.Cluster
}

func newPGFailoverEnv(t *testing.T, synchronous bool) *pgFailoverEnv {
	p := pgproc.Start(t)
	repl, err := NewRelay(fmt.Sprintf("127.0.0.1:%d", p.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repl.Close)
	s := p.StartStandby("standby", repl.Addr())
	want := "async"
	if synchronous {
		p.Configure("synchronous_standby_names = 'standby'")
		want = "sync"
	}
	pool, err := pgxpool.New(t.Context(), p.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var state string
		err := pool.QueryRow(t.Context(), "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'").Scan(&state)
		if err == nil && state == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby never streamed as %s (%q, %v)", want, state, err)
		}
		time.Sleep(50 * time.Millisecond) // replication starts on real time
	}
	return &pgFailoverEnv{primary: p, standby: s, replication: repl, sync: synchronous, current: p}
}

func (p *pgFailoverEnv) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		p.primary.Port, p.standby.Port)
}
func (p *pgFailoverEnv) proxyStore(int) string { return p.url() + "&pool_max_conns=4" }
func (p *pgFailoverEnv) readStore() string     { return p.url() }
func (p *pgFailoverEnv) kinds() []FaultKind    { return []FaultKind{FaultStoreCrash} }
func (p *pgFailoverEnv) durable() bool         { return p.sync }
func (p *pgFailoverEnv) inject(t *testing.T, f PlannedFault) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch f.Kind {
	case FaultStoreCrash:
		c := p.current
		c.Crash()
		return c.Start
	case FaultFailover:
		if p.current != p.primary {
			t.Errorf("a second failover planned")
			return func() {}
		}
		p.replication.Blackhole(true)
		time.Sleep(replicaStall) // the primary runs ahead of its standby
		p.primary.Crash()
		p.replication.Close() // what it held never arrives
		p.standby.Promote()
		p.current = p.standby
		return func() {}
	}
	t.Errorf("no fault %s here", f.Kind)
	return func() {}
}

// clusterEnv is a private Redis Cluster of three masters. The proxies
// reach it directly: a cluster hands its nodes' own addresses to its
// clients (MOVED, CLUSTER SLOTS), so a relay would be bypassed. Its nodes
// run without persistence, so the campaign does not crash them: its
// faults are the processes', the upstream's and the clients'.
type clusterEnv struct {
	c *redisproc.Cluster
}

func newClusterEnv(t *testing.T) *clusterEnv { return &clusterEnv{c: redisproc.StartCluster(t, 3)} }

func (c *clusterEnv) url() string {
	addrs := c.c.Addrs()
	u := "redis+cluster://" + addrs[0]
	for i, a := range addrs[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + a
	}
	return u
}
func (c *clusterEnv) proxyStore(int) string { return c.url() }
func (c *clusterEnv) readStore() string     { return c.url() }
func (c *clusterEnv) kinds() []FaultKind    { return nil }
func (c *clusterEnv) durable() bool         { return true }
func (c *clusterEnv) inject(t *testing.T, f PlannedFault) func() {
	t.Errorf("the cluster has no fault %s", f.Kind)
	return func() {}
}

// redisFailoverEnv is a private Redis master with a replica, both with
// appendfsync always, which the proxies reach through relays that stand
// for a virtual address. With sync the proxies write with wait_replicas=1.
// The failover detaches the replica (REPLICAOF NO ONE: what the master
// writes from then on never reaches it), lets the master run ahead, kills
// the master, moves the address to the replica and makes the old master,
// restarted, its replica. A store crash kills whichever is the master and
// starts it again.
type redisFailoverEnv struct {
	relays []*Relay
	sync   bool

	mu              sync.Mutex
	master, replica *redisproc.Server
}

func newRedisFailoverEnv(t *testing.T, synchronous bool) *redisFailoverEnv {
	aof := []string{"--appendonly", "yes", "--appendfsync", "always"}
	m, r := redisproc.Start(t, aof...), redisproc.Start(t, aof...)
	r.ReplicaOf(m)
	return &redisFailoverEnv{relays: relays(t, m.Addr), sync: synchronous, master: m, replica: r}
}

func (r *redisFailoverEnv) proxyStore(i int) string {
	u := "redis://" + r.relays[i].Addr() + "/0"
	if r.sync {
		u += "?wait_replicas=1&wait_timeout=500ms"
	}
	return u
}

func (r *redisFailoverEnv) readStore() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return "redis://" + r.master.Addr + "/0"
}
func (r *redisFailoverEnv) kinds() []FaultKind { return []FaultKind{FaultStoreCrash} }
func (r *redisFailoverEnv) durable() bool      { return r.sync }
func (r *redisFailoverEnv) inject(t *testing.T, f PlannedFault) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch f.Kind {
	case FaultStoreCrash:
		m := r.master
		m.Kill()
		return m.Restart
	case FaultFailover:
		old, next := r.master, r.replica
		next.Promote()           // detached: it receives nothing more
		time.Sleep(replicaStall) // the master runs ahead
		old.Kill()
		for _, rl := range r.relays {
			rl.Retarget(next.Addr)
		}
		r.master, r.replica = next, old
		return func() {
			old.Restart()
			old.ReplicaOf(next)
		}
	}
	t.Errorf("no fault %s here", f.Kind)
	return func() {}
}

// clusterFailoverEnv is a private Redis Cluster of three masters with a
// replica each, every node with appendfsync always; with sync the proxies
// write with wait_replicas=1. The failover cuts the first master's replica
// off (it is stopped and its link killed, so it cannot take in what the
// master writes next), lets the master run ahead, kills the master and
// promotes the replica (CLUSTER FAILOVER TAKEOVER); the old master,
// restarted, rejoins as its replica.
type clusterFailoverEnv struct {
	c    *redisproc.Cluster
	sync bool
}

func newClusterFailoverEnv(t *testing.T, synchronous bool) *clusterFailoverEnv {
	return &clusterFailoverEnv{c: redisproc.StartClusterWithReplicas(t, 3, "--appendonly", "yes", "--appendfsync", "always"), sync: synchronous}
}

func (c *clusterFailoverEnv) url() string {
	addrs := append(c.c.Addrs(), c.c.Replicas[0].Addr) // the replica is a master later
	u := "redis+cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	if c.sync {
		u += "&wait_replicas=1&wait_timeout=500ms"
	}
	return u
}
func (c *clusterFailoverEnv) proxyStore(int) string { return c.url() }
func (c *clusterFailoverEnv) readStore() string     { return c.url() }
func (c *clusterFailoverEnv) kinds() []FaultKind    { return nil }
func (c *clusterFailoverEnv) durable() bool         { return c.sync }
func (c *clusterFailoverEnv) inject(t *testing.T, f PlannedFault) func() {
	if f.Kind != FaultFailover {
		t.Errorf("no fault %s here", f.Kind)
		return func() {}
	}
	m, r := c.c.Masters[0], c.c.Replicas[0]
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	r.Signal(syscall.SIGSTOP)
	mc, rc := redis.NewClient(&redis.Options{Addr: m.Addr}), redis.NewClient(&redis.Options{Addr: r.Addr})
	defer mc.Close()
	defer rc.Close()
	if err := mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Errorf("cutting the replica off: %v", err)
	}
	time.Sleep(replicaStall) // the master runs ahead
	m.Kill()
	r.Signal(syscall.SIGCONT)
	if err := rc.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		t.Errorf("promoting the replica: %v", err)
	}
	for {
		info, err := rc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "role:master") {
			break
		}
		if ctx.Err() != nil {
			t.Errorf("the replica never became a master: %v", err)
			break
		}
		time.Sleep(20 * time.Millisecond) // the takeover runs on real time
	}
	return m.Restart
}
