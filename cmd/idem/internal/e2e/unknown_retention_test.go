package e2e

import (
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/idemstore"
)

// TestKilledProxyUnknownOutlivesRetention is the SPEC's section 2 rule end
// to end: a proxy with a short retention (--ttl 3s) is killed while its
// upstream call runs; past the retention, after `idem maintain --once` (the
// sweeper and the reaper), a retry still gets 409 outcome-unknown and the
// upstream has executed once.
func TestKilledProxyUnknownOutlivesRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	block := make(chan struct{})
	up := newUpstream(t, 0, block)
	defer close(block)
	a := e.startProxy("proxy-a", up.URL, 3, "--lease", "1s", "--ttl", "3s")
	b := e.startProxy("proxy-b", up.URL, 3, "--lease", "1s", "--ttl", "3s")
	const key, body = "outlives-key", `{"amount":1000}`

	killMidRequest(t, a, up, key, body)

	rec := e.record()
	for time.Now().Before(rec.ExpiresAt.Add(time.Second)) {
		time.Sleep(100 * time.Millisecond) // real processes: real time
	}
	maintainOnce(t, e.storeURL(2))
	if rec := e.record(); rec.State != idemstore.StateUnknown || rec.Attempts != 1 {
		t.Fatalf("record past its retention after maintenance: %s after %d attempts; want unknown after 1", rec.State, rec.Attempts)
	}
	requireStillUnknown(t, b, up, key, body)
}

// TestRedisKilledProxyUnknownOutlivesRetention is the same on Redis, where
// a native TTL would remove the record: the record of the killed attempt has
// none, and past its retention and a maintenance run a retry still gets 409
// outcome-unknown.
func TestRedisKilledProxyUnknownOutlivesRetention(t *testing.T) {
	t.Parallel()
	r := startRedisServer(t)
	block := make(chan struct{})
	up := newUpstream(t, 0, block)
	defer close(block)
	a := startRedisProxy(t, "proxy-a", up.URL, r, "--lease", "1s", "--ttl", "3s")
	b := startRedisProxy(t, "proxy-b", up.URL, r, "--lease", "1s", "--ttl", "3s")
	const key, body = "outlives-key", `{"amount":1000}`

	killMidRequest(t, a, up, key, body)
	time.Sleep(4 * time.Second) // past the retention; real processes: real time
	maintainOnce(t, r.URL())
	client := redis.NewClient(&redis.Options{Addr: r.addr()})
	defer client.Close()
	recs, err := client.Keys(t.Context(), "idem:{*}:r:*").Result()
	if err != nil || len(recs) != 1 {
		t.Fatalf("record keys %v, %v; want the one record", recs, err)
	}
	if ttl, err := client.PTTL(t.Context(), recs[0]).Result(); err != nil || ttl != -1 {
		t.Fatalf("native TTL of the unknown record = %v, %v; want none", ttl, err)
	}
	// A record is a string whose head starts "2,<state>," (idemredis's
	// codec.go).
	v, err := client.Get(t.Context(), recs[0]).Result()
	if err != nil || !strings.HasPrefix(v, "2,unknown,") {
		t.Fatalf("record %.40q…, %v; want an unknown one", v, err)
	}
	requireStillUnknown(t, b, up, key, body)
}

// TestSQLiteKilledProxyUnknownOutlivesRetention is the same rule on the
// embedded default: the proxy on a SQLite file is killed while its upstream
// call runs; past the retention, `idem maintain --once` on the file, and a
// new proxy on the same file answers every retry 409 outcome-unknown.
func TestSQLiteKilledProxyUnknownOutlivesRetention(t *testing.T) {
	t.Parallel()
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	block := make(chan struct{})
	up := newUpstream(t, 0, block)
	defer close(block)
	startSQLiteProxy := func(name string) *proc {
		cmd := exec.Command(idembin.Path(t), "proxy", "--listen", "127.0.0.1:0", "--upstream", up.URL,
			"--store", store, "--lease", "1s", "--ttl", "3s")
		cmd.Env = idembin.Environ()
		return start(t, name, cmd)
	}
	a := startSQLiteProxy("proxy-a")
	const key, body = "outlives-key", `{"amount":1000}`

	killMidRequest(t, a, up, key, body)

	time.Sleep(4 * time.Second) // past the 3 s retention; real processes: real time
	maintainOnce(t, store)
	b := startSQLiteProxy("proxy-b")
	requireStillUnknown(t, b, up, key, body)
}

// killMidRequest sends key's request through a, waits until the upstream
// works on it, and kills a with SIGKILL.
func killMidRequest(t *testing.T, a *proc, up *upstream, key, body string) {
	t.Helper()
	first := make(chan answer, 1)
	go func() { first <- post(t.Context(), a.URL+"/v1/payments", key, body) }()
	select {
	case <-up.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the request never reached the upstream")
	}
	killNow(t, a)
	<-first
}

// maintainOnce runs `idem maintain --once` (sweeper, reaper) on store.
func maintainOnce(t *testing.T, store string) {
	t.Helper()
	cmd := exec.Command(idembin.Path(t), "maintain", "--once", "--store", store)
	cmd.Env = idembin.Environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("idem maintain --once: %v\n%s", err, out)
	}
}

// requireStillUnknown retries key's request through b three times: each
// gets 409 outcome-unknown, and the upstream has executed it once.
func requireStillUnknown(t *testing.T, b *proc, up *upstream, key, body string) {
	t.Helper()
	for range 3 {
		got := post(t.Context(), b.URL+"/v1/payments", key, body)
		if got.err != nil || got.status != http.StatusConflict || got.code != idem.CodeOutcomeUnknown {
			t.Fatalf("retry past the retention: %v, want 409 outcome-unknown", got)
		}
	}
	if n := up.executions(key); n != 1 {
		t.Fatalf("the upstream executed %d times, want 1", n)
	}
}
