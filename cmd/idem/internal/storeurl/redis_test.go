package storeurl

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemredis"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv/redisproc"
)

func TestParseRedis(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url      string
		topology string
		addrs    []string // the seed nodes, the sentinels, or the server
		prefix   string
		check    func(t *testing.T, r *RedisURL)
	}{
		{url: "redis://h:6379/2?prefix=p:", topology: TopologySingle, addrs: []string{"h:6379"}, prefix: "p:",
			check: func(t *testing.T, r *RedisURL) {
				if r.Single.DB != 2 {
					t.Errorf("DB = %d, want 2", r.Single.DB)
				}
			}},
		{url: "redis+cluster://u:pw@a:7000?addr=b:7001&addr=c:7002&prefix=x:&max_redirects=5",
			topology: TopologyCluster, addrs: []string{"a:7000", "b:7001", "c:7002"}, prefix: "x:",
			check: func(t *testing.T, r *RedisURL) {
				if r.Cluster.Username != "u" || r.Cluster.Password != "pw" || r.Cluster.MaxRedirects != 5 || r.Cluster.TLSConfig != nil {
					t.Errorf("cluster options = %+v", r.Cluster)
				}
			}},
		{url: "redis://h:6379/0?wait_replicas=2&wait_timeout=250ms&prefix=w:", topology: TopologySingle, addrs: []string{"h:6379"}, prefix: "w:",
			check: func(t *testing.T, r *RedisURL) {
				if r.WaitReplicas != 2 || r.WaitTimeout != 250*time.Millisecond {
					t.Errorf("wait = %d, %v; want 2, 250ms", r.WaitReplicas, r.WaitTimeout)
				}
			}},
		{url: "REDISS+CLUSTER://a:7000/0", topology: TopologyCluster, addrs: []string{"a:7000"},
			check: func(t *testing.T, r *RedisURL) {
				if r.Cluster.TLSConfig == nil || r.Cluster.TLSConfig.ServerName != "a" {
					t.Errorf("TLS = %+v, want ServerName a", r.Cluster.TLSConfig)
				}
			}},
		{url: "redis+sentinel://su:spw@s1:26379/3?addr=s2:26379&master_name=main&password=mpw&prefix=q:",
			topology: TopologySentinel, addrs: []string{"s1:26379", "s2:26379"}, prefix: "q:",
			check: func(t *testing.T, r *RedisURL) {
				f := r.Failover
				if f.MasterName != "main" || f.DB != 3 || f.SentinelUsername != "su" || f.SentinelPassword != "spw" || f.Password != "mpw" {
					t.Errorf("failover options = %+v", f)
				}
			}},
		{url: "rediss+sentinel://s1:26379?master_name=m", topology: TopologySentinel, addrs: []string{"s1:26379"},
			check: func(t *testing.T, r *RedisURL) {
				if r.Failover.TLSConfig == nil {
					t.Error("no TLS for rediss+sentinel")
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			if Kind(tt.url) != KindRedis {
				t.Errorf("Kind = %q, want %q", Kind(tt.url), KindRedis)
			}
			r, err := ParseRedis(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			if r.Topology != tt.topology || r.Prefix != tt.prefix {
				t.Errorf("topology, prefix = %q, %q; want %q, %q", r.Topology, r.Prefix, tt.topology, tt.prefix)
			}
			var addrs []string
			switch {
			case r.Single != nil:
				addrs = []string{r.Single.Addr}
			case r.Cluster != nil:
				addrs = r.Cluster.Addrs
			case r.Failover != nil:
				addrs = r.Failover.SentinelAddrs
			}
			if !slices.Equal(addrs, tt.addrs) {
				t.Errorf("addresses = %q, want %q", addrs, tt.addrs)
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

func TestParseRedisErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ url, want string }{
		{"redis+cluster://:s3cret@a:7000?nope=1", "unexpected option: nope"},
		{"redis+cluster://a:7000/2", "database 0 only"},
		{"redis+cluster://a:7000?addr=nohost", "addr"},
		{"redis+sentinel://:s3cret@s:26379/0", "master_name"},
		{"redis+sentinel://s:26379/x?master_name=m", "database number"},
		{"redis://:s3cret@h:6379/0?nope=1", "unexpected option"},
		{"redis+ring://h:6379", "not a Redis URL"},
		{"redis://h:6379/0?wait_replicas=x", "wait_replicas"},
		{"redis://h:6379/0?wait_replicas=-1", "wait_replicas"},
		{"redis://h:6379/0?wait_replicas=1&wait_timeout=0s", "wait_timeout"},
		{"redis://h:6379/0?wait_timeout=1s", "without wait_replicas"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			_, err := ParseRedis(tt.url)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseRedis error = %v, want one mentioning %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

func FuzzParseRedis(f *testing.F) {
	for _, s := range []string{
		"redis://h:6379/0?prefix=p", "redis+cluster://u:pw@a:1?addr=b:2&prefix=x",
		"rediss+sentinel://u:pw@s:1/0?master_name=m&password=pw&addr=t:2", "redis+cluster://a:1/%zz",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := ParseRedis(raw)
		if err != nil {
			if strings.Contains(err.Error(), "s3cret") && !strings.Contains(Redact(raw), "s3cret") {
				t.Fatalf("the error shows a password the redacted URL hides: %v", err)
			}
			return
		}
		n := 0
		for _, set := range []bool{r.Single != nil, r.Cluster != nil, r.Failover != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d topologies set: %+v", n, r)
		}
		c := r.NewClient()
		c.Close()
	})
}

// TestOpenRedisCluster opens a private three-master cluster through
// redis+cluster://, with the store's prefix beside go-redis's options: the
// records land on every master. A redis:// URL naming one of its nodes is
// refused with a message naming redis+cluster://.
func TestOpenRedisCluster(t *testing.T) {
	t.Parallel()
	c := redisproc.StartCluster(t, 3)
	addrs := c.Addrs()
	prefix := "storeurl_test_" + randomHex() + ":"
	s := open(t, "redis+cluster://"+addrs[0]+"?addr="+addrs[1]+"&prefix="+prefix+"&max_redirects=8")
	for range 30 {
		roundTrip(t, s)
	}
	for _, m := range c.Masters {
		n, err := m.Client().Keys(t.Context(), prefix+"*:r:*").Result()
		if err != nil || len(n) == 0 {
			t.Errorf("records under %q on master %s: %d, %v; want some on every master", prefix, m.Addr, len(n), err)
		}
	}
	if _, ok := s.(*idemredis.Store); !ok {
		t.Fatalf("the store is a %T", s)
	}

	_, _, err := Open(t.Context(), "redis://"+addrs[1]+"/0")
	if !errors.Is(err, ErrClusterNode) || !strings.Contains(err.Error(), "redis+cluster://") {
		t.Fatalf("Open(redis:// of a cluster node) = %v; want ErrClusterNode naming redis+cluster://", err)
	}
}

// TestOpenRedisSentinel opens the master a private Sentinel names through
// redis+sentinel://.
func TestOpenRedisSentinel(t *testing.T) {
	t.Parallel()
	master := redisproc.Start(t)
	sentinel := redisproc.StartSentinel(t, "idemurl", master.Addr)
	prefix := "storeurl_test_" + randomHex() + ":"
	s := open(t, "redis+sentinel://"+sentinel.Addr+"/0?master_name=idemurl&prefix="+prefix)
	roundTrip(t, s)
	keys, err := master.Client().Keys(t.Context(), prefix+"*:r:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("records on the master = %q, %v; want the one written", keys, err)
	}
	if _, err := s.KeyGet(t.Context(), idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "absent"}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("KeyGet of an absent key = %v", err)
	}
}

// TestOpenRedisWaitReplicas: ?wait_replicas reaches the store. Its server
// has no replica, so a reservation fails closed once the wait times out.
func TestOpenRedisWaitReplicas(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t)
	s := open(t, "redis://"+srv.Addr+"/0?wait_replicas=1&wait_timeout=100ms")
	_, err := s.KeyReserve(t.Context(), &idemstore.ReserveParams{
		Identity: idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "k"}, Fingerprint: "f", Token: "t",
		Lease: time.Minute, TTL: time.Hour,
	})
	if !errors.Is(err, idemredis.ErrNotReplicated) {
		t.Fatalf("KeyReserve without a replica = %v; want ErrNotReplicated", err)
	}
}
