//go:build linux

package chaos

import (
	"path/filepath"
	"testing"

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
	srv    *redisproc.Server
	relays []*Relay
}

func newRedisEnv(t *testing.T) *redisEnv {
	srv := redisproc.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	return &redisEnv{srv: srv, relays: relays(t, srv.Addr)}
}

func (r *redisEnv) proxyStore(i int) string { return "redis://" + r.relays[i].Addr() + "/0" }
func (r *redisEnv) readStore() string       { return "redis://" + r.srv.Addr + "/0" }
func (r *redisEnv) kinds() []FaultKind      { return append([]FaultKind{FaultStoreCrash}, linkKinds...) }
func (r *redisEnv) durable() bool           { return true }
func (r *redisEnv) link(i int) *Relay       { return r.relays[i] }
func (r *redisEnv) inject(t *testing.T, f PlannedFault) func() {
	if f.Kind == FaultStoreCrash {
		r.srv.Kill()
		return r.srv.Restart
	}
	return linkFault(t, r.relays[f.Proxy], f)
}
