package cli

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemredis"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv/redisproc"
)

// redisClusterURL starts a private three-master Redis Cluster and returns
// its redis+cluster:// URL with a prefix of the test's own.
func redisClusterURL(t *testing.T) (string, *redisproc.Cluster) {
	t.Helper()
	c := redisproc.StartCluster(t, 3)
	b := make([]byte, 6)
	rand.Read(b)
	a := c.Addrs()
	return fmt.Sprintf("redis+cluster://%s?addr=%s&addr=%s&prefix=cli_test_%s:", a[0], a[1], a[2], hex.EncodeToString(b)), c
}

// storedRecord is a record as read straight from a master's keys.
type storedRecord struct {
	master                        string
	state, lockedUntil, expiresAt string
}

// storedRecords reads every record under prefix from every master with
// KEYS and GET, on clients of its own: the count the commands' output is
// compared with.
func storedRecords(t *testing.T, c *redisproc.Cluster, prefix string) []storedRecord {
	t.Helper()
	ctx := t.Context()
	var out []storedRecord
	for _, m := range c.Masters {
		client := redis.NewClient(&redis.Options{Addr: m.Addr})
		keys, err := client.Keys(ctx, prefix+"{*}:r:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			// A record is a string whose head starts
			// "2,state,lease_expired_state,locked_until,expires_at,"
			// (idemredis's codec.go).
			v, err := client.Get(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			f := strings.SplitN(v, ",", 6)
			if len(f) < 6 || f[0] != "2" {
				t.Fatalf("record %s: %.60q… is not in idemredis's layout", k, v)
			}
			out = append(out, storedRecord{master: m.Addr, state: f[1], lockedUntil: f[3], expiresAt: f[4]})
		}
		client.Close()
	}
	return out
}

// TestKeysCountsAcrossClusterMasters seeds records over the three masters
// of a Redis Cluster (live ones in every state, expired ones, expired
// leases) and compares what `idem keys list`, `idem keys purge`, `idem
// maintain --once` and the console count with the records read straight
// from each master; each command says it covered every master.
func TestKeysCountsAcrossClusterMasters(t *testing.T) {
	t.Parallel()
	u, c := redisClusterURL(t)
	ru, err := storeurl.ParseRedis(u)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClusterClient(ru.Cluster)
	t.Cleanup(func() { client.Close() })
	// A store whose clock is two hours behind writes records that are, by
	// the commands' clock, expired (TTL 1h) or past their lease (lease 1h).
	past := idemredis.New(client, &idemredis.Config{Prefix: ru.Prefix, Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }})
	now := idemredis.New(client, &idemredis.Config{Prefix: ru.Prefix})
	const live, expired, leases = 45, 12, 9
	for i := range live {
		states := []idemstore.State{idemstore.StateCompleted, idemstore.StateReleased, idemstore.StateUnknown}
		seed(t, now, idemstore.Identity{Scope: "acme", Endpoint: payments, Key: "live-" + strconv.Itoa(i)}, states[i%3], time.Hour)
	}
	for i := range expired {
		seed(t, past, idemstore.Identity{Scope: "acme", Endpoint: payments, Key: "expired-" + strconv.Itoa(i)}, idemstore.StateCompleted, time.Hour)
	}
	for i := range leases {
		seed(t, past, idemstore.Identity{Scope: "acme", Endpoint: payments, Key: "lease-" + strconv.Itoa(i)}, idemstore.StateInProgress, 24*time.Hour)
	}

	stored := storedRecords(t, c, ru.Prefix)
	masters := map[string]int{}
	for _, s := range stored {
		masters[s.master]++
	}
	if len(stored) != live+expired+leases || len(masters) != 3 {
		t.Fatalf("stored %d records on %d masters (%v); want %d on 3", len(stored), len(masters), masters, live+expired+leases)
	}
	nowUs := time.Now().UnixMicro()
	count := func(recs []storedRecord) (liveByState map[string]int, expiredN, leaseN int) {
		liveByState = map[string]int{}
		for _, s := range recs {
			exp, _ := strconv.ParseInt(s.expiresAt, 10, 64)
			lu, _ := strconv.ParseInt(s.lockedUntil, 10, 64)
			switch {
			case exp < nowUs:
				expiredN++
			case s.state == "in_progress" && lu <= nowUs:
				leaseN++
				liveByState["unknown"]++ // as the lease-expired state it turns into
			default:
				liveByState[s.state]++
			}
		}
		return
	}
	wantLive, wantExpired, wantLeases := count(stored)
	if wantExpired != expired || wantLeases != leases {
		t.Fatalf("stored: %d expired, %d past their lease; want %d, %d", wantExpired, wantLeases, expired, leases)
	}

	// idem keys list: every live record of every master, and says so.
	code, out, errOut := runKeysIn(t, openExisting, nil, "list", "--json", "--limit", "0", "--store", u)
	if code != ExitOK {
		t.Fatalf("keys list: %d\n%s", code, errOut)
	}
	gotLive := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var j jsonRecord
		if err := json.Unmarshal([]byte(line), &j); err != nil {
			t.Fatalf("keys list line %q: %v", line, err)
		}
		gotLive[string(j.State)]++
	}
	if fmt.Sprint(gotLive) != fmt.Sprint(wantLive) {
		t.Errorf("keys list counts %v; the masters hold %v", gotLive, wantLive)
	}
	if !strings.Contains(errOut, "Listed the records of every master (3: ") {
		t.Errorf("keys list does not say it read every master:\n%s", errOut)
	}

	// The console's counts.
	token := strings.Repeat("s", 32)
	st, closeStore, err := openExisting(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	o, err := newOps(&opsOptions{consoleToken: token}, opsParts{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("GET", "/_idem/", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	w := httptest.NewRecorder()
	o.Handler.ServeHTTP(w, req)
	page, _ := io.ReadAll(w.Body)
	for state, n := range wantLive {
		if want := fmt.Sprintf(`id="count-%s">%d<`, state, n); !strings.Contains(string(page), want) {
			t.Errorf("the console's overview lacks %s", want)
		}
	}
	if !strings.Contains(string(page), "Counted on every master of the store (3: ") {
		t.Errorf("the console does not say it counted every master")
	}

	// idem maintain --once: sweeps the expired leases of every master.
	e := newTestEnv(nil)
	if err := runMaintainIn(t.Context(), e, openExisting, "--once", "--store", u); err != nil {
		t.Fatalf("maintain --once: %v\n%s", err, e.stderr)
	}
	if out := e.stdout.String(); !strings.Contains(out, fmt.Sprintf("Swept %d expired leases, reaped %d expired records.", leases, expired)) ||
		!strings.Contains(out, "Swept and reaped on every master (3: ") {
		t.Errorf("maintain --once printed:\n%s", out)
	}
	after := storedRecords(t, c, ru.Prefix)
	if _, gotExpired, gotLeases := count(after); len(after) != live+leases || gotExpired != 0 || gotLeases != 0 {
		t.Errorf("after maintain: %d records stored, %d expired, %d in_progress past their lease; want %d, 0, 0",
			len(after), gotExpired, gotLeases, live+leases)
	}
	for _, s := range after {
		if s.state == "in_progress" {
			t.Errorf("a record on %s is still in_progress after the sweep", s.master)
		}
	}

	// idem keys purge: the reaper through the command, once more expired
	// records exist.
	for i := range expired {
		seed(t, past, idemstore.Identity{Scope: "globex", Endpoint: payments, Key: "expired-" + strconv.Itoa(i)}, idemstore.StateReleased, time.Hour)
	}
	code, out, errOut = runKeysIn(t, openExisting, nil, "purge", "--batch-size", "5", "--store", u)
	if code != ExitOK || !strings.Contains(out, fmt.Sprintf("Purged %d expired records.", expired)) || !strings.Contains(out, "Purged on every master (3: ") {
		t.Errorf("keys purge: %d\n%s\n%s", code, out, errOut)
	}
	if n := len(storedRecords(t, c, ru.Prefix)); n != live+leases {
		t.Errorf("after purge: %d records stored, want %d", n, live+leases)
	}
}

// TestCacheOnRedisCluster: --cache takes redis+cluster:// (with ?prefix=)
// and writes its entries to the cluster; a redis:// cache URL naming a
// cluster node and a cache URL with wait_replicas are refused.
func TestCacheOnRedisCluster(t *testing.T) {
	t.Parallel()
	c := redisproc.StartCluster(t, 3)
	a := c.Addrs()
	ctx := t.Context()
	prefix := "cli_cache_" + randomHexString(t) + ":"
	store, closeCache, err := openCache(ctx, "redis+cluster://"+a[0]+"?addr="+a[1]+"&prefix="+prefix, idemmem.New(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeCache()
	for i := range 20 {
		id := idemstore.Identity{Scope: "s", Endpoint: payments, Key: "k" + strconv.Itoa(i)}
		seed(t, store, id, idemstore.StateCompleted, time.Hour)
		res, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp-" + id.Key, Token: "again",
			Lease: time.Minute, TTL: time.Hour})
		if err != nil || res.Reserved || res.Record.State != idemstore.StateCompleted {
			t.Fatalf("replay of %s: %+v, %v", id.Key, res, err)
		}
	}
	cached := 0
	for _, m := range c.Masters {
		keys, err := m.Client().Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		cached += len(keys)
	}
	if cached == 0 {
		t.Errorf("no cache entry under %q on the cluster's masters", prefix)
	}

	if _, _, err := openCache(ctx, "redis://"+a[2]+"/0", idemmem.New(nil), nil); err == nil || !strings.Contains(err.Error(), "redis+cluster://") {
		t.Errorf("a redis:// cache on a cluster node: %v; want a refusal naming redis+cluster://", err)
	}
	if _, _, err := openCache(ctx, "redis+cluster://"+a[0]+"?wait_replicas=1", idemmem.New(nil), nil); err == nil || !strings.Contains(err.Error(), "wait_replicas") {
		t.Errorf("a cache URL with wait_replicas: %v; want a refusal", err)
	}
}

func randomHexString(t *testing.T) string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}
