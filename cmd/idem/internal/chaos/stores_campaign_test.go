//go:build linux

package chaos

import (
	"testing"
	"time"
)

// TestCampaignSQLite: three proxies on one SQLite file, proxies killed and
// stopped, a slow upstream, clients that hang up.
func TestCampaignSQLite(t *testing.T) {
	c := &campaign{t: t, name: "sqlite", seed: campaignSeed(t, 1), dur: campaignDuration(t), store: newSQLiteEnv(t)}
	requireNoAnomalies(t, c.run())
}

// TestCampaignRedis: three proxies on a private Redis with appendfsync
// always, each through a relay: the faults of TestCampaignSQLite, plus the
// Redis killed and restarted and each link delayed, cut, reset and
// partitioned.
func TestCampaignRedis(t *testing.T) {
	c := &campaign{t: t, name: "redis", seed: campaignSeed(t, 2), dur: campaignDuration(t), store: newRedisEnv(t)}
	requireNoAnomalies(t, c.run())
}

// TestCampaignPostgres: three proxies on a private PostgreSQL, each through
// a relay: proxies killed and stopped, the server crashed (pg_ctl stop -m
// immediate) and restarted, each link delayed, cut, reset and partitioned.
func TestCampaignPostgres(t *testing.T) {
	c := &campaign{t: t, name: "postgres", seed: campaignSeed(t, 3), dur: campaignDuration(t), store: newPGEnv(t)}
	requireNoAnomalies(t, c.run())
}

// TestCampaignPostgresFailover: a primary with a synchronous standby,
// reached through a multi-host URL; halfway through, the standby stalls,
// the primary crashes and the standby is promoted. Synchronous
// replication loses nothing a client was told.
func TestCampaignPostgresFailover(t *testing.T) {
	dur := campaignDuration(t)
	c := &campaign{t: t, name: "postgres-failover", seed: campaignSeed(t, 6), dur: dur, store: newPGFailoverEnv(t, true), failoverAt: dur / 2}
	res := c.run()
	if res.faults[FaultFailover] != 1 {
		t.Errorf("%d failovers, want 1", res.faults[FaultFailover])
	}
	requireNoAnomalies(t, res)
}

// TestCampaignPostgresAsyncFailover is the README's row "PostgreSQL, async
// streaming replica": the failover alone, with an asynchronous standby,
// loses what the primary acknowledged while the standby was cut off, and
// the checker must find those losses (an answer no record replays, a
// retry that runs again).
func TestCampaignPostgresAsyncFailover(t *testing.T) {
	dur := min(campaignDuration(t), 10*time.Second)
	c := &campaign{t: t, name: "postgres-async-failover", seed: campaignSeed(t, 7), dur: dur, store: newPGFailoverEnv(t, false),
		failoverAt: dur / 2, onlyFailover: true}
	res := c.run()
	requireLosses(t, res)
}

// TestCampaignPause is the review's pause scenario on its own: proxies on
// a private PostgreSQL are stopped (SIGSTOP) right after reservations,
// for longer than the lease, the reconciler's grace and interval, while
// clients retry through the others. A proxy that resumes must not run an
// attempt whose key was released meanwhile.
func TestCampaignPause(t *testing.T) {
	c := &campaign{t: t, name: "pause", seed: campaignSeed(t, 8), dur: min(campaignDuration(t), 15*time.Second), store: newPGEnv(t),
		kinds: []FaultKind{FaultPauseProxy}}
	res := c.run()
	if res.faults[FaultPauseProxy] == 0 {
		t.Errorf("no pause injected")
	}
	requireNoAnomalies(t, res)
}

// TestCampaignRedisCluster: three proxies on a private Redis Cluster of
// three masters: proxies killed and stopped, a slow upstream, clients
// that hang up.
func TestCampaignRedisCluster(t *testing.T) {
	c := &campaign{t: t, name: "redis-cluster", seed: campaignSeed(t, 4), dur: campaignDuration(t), store: newClusterEnv(t)}
	requireNoAnomalies(t, c.run())
}

// TestCampaignRedisFailover: a Redis master and its replica, written with
// wait_replicas=1; halfway through, the replica is detached, the master
// killed and the replica promoted. What a client was told was on the
// replica: nothing is lost.
func TestCampaignRedisFailover(t *testing.T) {
	dur := campaignDuration(t)
	c := &campaign{t: t, name: "redis-failover", seed: campaignSeed(t, 9), dur: dur, store: newRedisFailoverEnv(t, true), failoverAt: dur / 2}
	res := c.run()
	if res.faults[FaultFailover] != 1 {
		t.Errorf("%d failovers, want 1", res.faults[FaultFailover])
	}
	requireNoAnomalies(t, res)
}

// TestCampaignRedisAsyncFailover is the README's row "Redis, replica, no
// wait_replicas": the same failover alone loses what the master
// acknowledged after the replica was detached, and the checker must find
// it.
func TestCampaignRedisAsyncFailover(t *testing.T) {
	dur := min(campaignDuration(t), 10*time.Second)
	c := &campaign{t: t, name: "redis-async-failover", seed: campaignSeed(t, 10), dur: dur, store: newRedisFailoverEnv(t, false),
		failoverAt: dur / 2, onlyFailover: true}
	requireLosses(t, c.run())
}

// TestCampaignRedisClusterFailover: a Redis Cluster with a replica per
// master, written with wait_replicas=1; halfway through, a master's
// replica is cut off, the master killed and the replica promoted (CLUSTER
// FAILOVER TAKEOVER). Nothing a client was told is lost.
func TestCampaignRedisClusterFailover(t *testing.T) {
	dur := campaignDuration(t)
	c := &campaign{t: t, name: "redis-cluster-failover", seed: campaignSeed(t, 11), dur: dur, store: newClusterFailoverEnv(t, true), failoverAt: dur / 2}
	res := c.run()
	if res.faults[FaultFailover] != 1 {
		t.Errorf("%d failovers, want 1", res.faults[FaultFailover])
	}
	requireNoAnomalies(t, res)
}

// TestCampaignRedisClusterAsyncFailover: the same failover alone, without
// wait_replicas, loses what the master acknowledged after its replica was
// cut off, and the checker must find it.
func TestCampaignRedisClusterAsyncFailover(t *testing.T) {
	dur := min(campaignDuration(t), 10*time.Second)
	c := &campaign{t: t, name: "redis-cluster-async-failover", seed: campaignSeed(t, 12), dur: dur, store: newClusterFailoverEnv(t, false),
		failoverAt: dur / 2, onlyFailover: true}
	requireLosses(t, c.run())
}

// TestCampaignRedisNoPersistence is the README's row "Redis, no
// persistence": the store crashed and restarted, alone, forgets every
// record, and the checker must find the answers lost and the keys run
// again.
func TestCampaignRedisNoPersistence(t *testing.T) {
	c := &campaign{t: t, name: "redis-no-persistence", seed: campaignSeed(t, 13), dur: min(campaignDuration(t), 10*time.Second),
		store: newVolatileRedisEnv(t), kinds: []FaultKind{FaultStoreCrash}}
	requireLosses(t, c.run())
}

// TestCampaignPostgresAsyncCommit is the README's row "PostgreSQL,
// synchronous_commit=off": server crashes alone lose the commits the WAL
// writer had not written, and the checker must find them.
func TestCampaignPostgresAsyncCommit(t *testing.T) {
	c := &campaign{t: t, name: "postgres-async-commit", seed: campaignSeed(t, 14), dur: min(campaignDuration(t), 10*time.Second),
		store: newAsyncCommitPGEnv(t), kinds: []FaultKind{FaultStoreCrash}}
	requireLosses(t, c.run())
}
