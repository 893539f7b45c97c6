//go:build linux

package chaos

import "testing"

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
