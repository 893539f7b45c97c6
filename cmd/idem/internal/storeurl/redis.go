package storeurl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemredis"
)

// Redis topologies, as RedisURL.Topology names them.
const (
	TopologySingle   = "single"   // redis://, rediss://
	TopologyCluster  = "cluster"  // redis+cluster://, rediss+cluster://
	TopologySentinel = "sentinel" // redis+sentinel://, rediss+sentinel://
)

// RedisURL is a Redis URL read by ParseRedis: the client options of its
// topology (one of Single, Cluster, Failover is set) and the options that
// are idem's own rather than go-redis's.
type RedisURL struct {
	// Topology is TopologySingle, TopologyCluster or TopologySentinel.
	Topology string
	Single   *redis.Options
	Cluster  *redis.ClusterOptions
	Failover *redis.FailoverOptions
	// Prefix is the ?prefix= option ("" when absent: the store's default).
	Prefix string
	// WaitReplicas and WaitTimeout are the ?wait_replicas=N and
	// ?wait_timeout=DURATION options: how many replicas must acknowledge
	// each write of a record before the store answers, and for how long
	// it waits (see idemredis.Config). Zero when absent.
	WaitReplicas int
	WaitTimeout  time.Duration
}

// redisSchemes maps the schemes of Redis URLs to their topology and the
// scheme go-redis's parser of that topology takes.
var redisSchemes = map[string]struct{ topology, scheme string }{
	"redis":           {TopologySingle, "redis"},
	"rediss":          {TopologySingle, "rediss"},
	"redis+cluster":   {TopologyCluster, "redis"},
	"rediss+cluster":  {TopologyCluster, "rediss"},
	"redis+sentinel":  {TopologySentinel, "redis"},
	"rediss+sentinel": {TopologySentinel, "rediss"},
}

// ParseRedis reads a Redis URL of any topology:
//
//	redis://[user:pass@]host:port/DB             one server (rediss:// for TLS)
//	redis+cluster://[user:pass@]host:port?addr=host2:port2&addr=…
//	                                             a Redis Cluster: the seed
//	                                             nodes, as redis.ParseClusterURL
//	                                             reads them (rediss+cluster://)
//	redis+sentinel://[user:pass@]host:port/DB?addr=…&master_name=NAME
//	                                             the master that Sentinels
//	                                             name, as redis.ParseFailoverURL
//	                                             reads it: the user information
//	                                             authenticates to the Sentinels,
//	                                             ?password= to the master
//	                                             (rediss+sentinel://)
//
// The options idem adds (prefix, wait_replicas, wait_timeout) are taken out
// of the query first; the rest of the query is go-redis's, and an option it
// does not know is an error.
func ParseRedis(rawURL string) (*RedisURL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", Redact(rawURL), errors.Unwrap(err))
	}
	kind, ok := redisSchemes[strings.ToLower(u.Scheme)]
	if !ok {
		return nil, fmt.Errorf("store %s: not a Redis URL (want redis://, redis+cluster:// or redis+sentinel://)", Redact(rawURL))
	}
	q, err := parseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", Redact(rawURL), err)
	}
	r := &RedisURL{Topology: kind.topology, Prefix: q.Get("prefix")}
	if v := q.Get("wait_replicas"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("store %s: wait_replicas=%q: want a number of replicas, 0 or more", Redact(rawURL), v)
		}
		r.WaitReplicas = n
	}
	if v := q.Get("wait_timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("store %s: wait_timeout=%q: want a positive duration such as 500ms", Redact(rawURL), v)
		}
		if r.WaitReplicas == 0 {
			return nil, fmt.Errorf("store %s: wait_timeout without wait_replicas: name how many replicas to wait for", Redact(rawURL))
		}
		r.WaitTimeout = d
	}
	for _, name := range []string{"prefix", "wait_replicas", "wait_timeout"} {
		q.Del(name)
	}
	u.RawQuery = q.Encode()
	u.Scheme = kind.scheme
	switch kind.topology {
	case TopologySingle:
		r.Single, err = redis.ParseURL(u.String())
	case TopologyCluster:
		if u.Path != "" && u.Path != "/" && u.Path != "/0" {
			// Cluster nodes have database 0 only; go-redis would ignore it.
			return nil, fmt.Errorf("store %s: a Redis Cluster has database 0 only: drop the path %q", Redact(rawURL), u.Path)
		}
		u.Path = ""
		r.Cluster, err = redis.ParseClusterURL(u.String())
	case TopologySentinel:
		r.Failover, err = redis.ParseFailoverURL(u.String())
		if err == nil && r.Failover.MasterName == "" {
			err = errors.New("the master's name is missing: add ?master_name=NAME, as the Sentinels know it")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", Redact(rawURL), err)
	}
	return r, nil
}

// ErrClusterNode is wrapped by the error of Connect for a redis:// URL
// that names a node of a Redis Cluster.
var ErrClusterNode = errors.New("the server is a node of a Redis Cluster (cluster_enabled:1): " +
	"name the cluster with redis+cluster://host:port?addr=host2:port2 (rediss+cluster:// for TLS)")

// FailFast makes the client give up on a server that does not answer at
// once, without retrying a command (as a cache in front of a store should:
// the store answers when the cache cannot).
func (r *RedisURL) FailFast() {
	switch {
	case r.Single != nil:
		r.Single.MaxRetries, r.Single.DialerRetries = -1, 1
	case r.Cluster != nil:
		r.Cluster.MaxRetries, r.Cluster.DialerRetries = -1, 1
	case r.Failover != nil:
		r.Failover.MaxRetries, r.Failover.DialerRetries = -1, 1
	}
}

// NewClient returns a client of the topology, not yet connected.
func (r *RedisURL) NewClient() redis.UniversalClient {
	switch r.Topology {
	case TopologyCluster:
		return redis.NewClusterClient(r.Cluster)
	case TopologySentinel:
		return redis.NewFailoverClient(r.Failover)
	}
	return redis.NewClient(r.Single)
}

// Connect returns a client of the topology that has answered once. A
// redis:// URL naming a node of a Redis Cluster is refused: a single-node
// client there would answer MOVED for most keys, and `idem keys list` would
// see that node's records only.
func (r *RedisURL) Connect(ctx context.Context) (redis.UniversalClient, error) {
	client := r.NewClient()
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, err
	}
	if r.Topology == TopologySingle {
		info, err := client.Info(ctx, "cluster").Result()
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("reading INFO cluster: %w", err)
		}
		if clusterEnabled(info) {
			client.Close()
			return nil, ErrClusterNode
		}
	}
	return client, nil
}

// clusterEnabled reports whether an INFO cluster reply says cluster_enabled:1.
func clusterEnabled(info string) bool {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster_enabled:"); ok {
			return v == "1"
		}
	}
	return false
}

func openRedisURL(ctx context.Context, rawURL string) (*idemredis.Store, func() error, error) {
	r, err := ParseRedis(rawURL)
	if err != nil {
		return nil, nil, err
	}
	client, err := r.Connect(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("store %s: %w", Redact(rawURL), err)
	}
	cfg := &idemredis.Config{Prefix: r.Prefix, WaitReplicas: r.WaitReplicas, WaitTimeout: r.WaitTimeout}
	return idemredis.New(client, cfg), client.Close, nil
}
