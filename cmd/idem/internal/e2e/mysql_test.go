package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
	"github.com/idem-dev/idem/internal/testenv/mariadbproc"
)

// childMySQLEnv is the DSN of the "mysql-tx" child's database.
const childMySQLEnv = "IDEM_E2E_MYSQL_DSN"

// myEnv is one test's MySQL database: a migrated idem schema in a database
// of its own on the test server (IDEM_TEST_MYSQL_URL), dropped when the
// test ends, and a store on it to inspect records.
type myEnv struct {
	t     *testing.T
	url   string // mysql:// URL of the test's database
	dsn   string // its go-sql-driver DSN
	store *idemmysql.Store
}

func newMyEnv(t *testing.T) *myEnv {
	t.Helper()
	return newMyEnvOn(t, testenv.MySQLURL(t))
}

// newMyEnvOn makes the test's database on the server of base, a mysql://
// URL.
func newMyEnvOn(t *testing.T, base string) *myEnv {
	t.Helper()
	adminDSN, _, err := storeurl.ParseMySQL(base)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() }) // after the drop below
	name := "idem_e2e_" + randomHex(6)
	if _, err := admin.ExecContext(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	dsn, _, err := storeurl.ParseMySQL(u.String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := idemmysql.Open(t.Context(), dsn, &idemmysql.Config{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("migrating %s: %v", name, err)
	}
	return &myEnv{t: t, url: u.String(), dsn: dsn, store: s}
}

// storeURL is the --store URL of a proxy on the test's database, with a
// bounded pool so that several processes stay within max_connections.
func (e *myEnv) storeURL(maxConns int) string {
	u, _ := url.Parse(e.url)
	q := u.Query()
	q.Set("pool_max_conns", fmt.Sprint(maxConns))
	u.RawQuery = q.Encode()
	return u.String()
}

// startProxy starts `idem proxy --store mysql://…` in front of upstream.
func (e *myEnv) startProxy(name, upstream string, maxConns int, args ...string) *proc {
	e.t.Helper()
	cmd := exec.Command(idembin.Path(e.t), append([]string{"proxy",
		"--listen", "127.0.0.1:0", "--upstream", upstream, "--store", e.storeURL(maxConns)}, args...)...)
	cmd.Env = idembin.Environ()
	return start(e.t, name, cmd)
}

// record returns the only record of the test's database.
func (e *myEnv) record() *idemstore.Record {
	e.t.Helper()
	recs, err := e.store.KeyList(e.t.Context(), &idemstore.ListParams{})
	if err != nil {
		e.t.Fatalf("listing records: %v", err)
	}
	if len(recs) != 1 {
		e.t.Fatalf("%d records, want 1", len(recs))
	}
	return recs[0]
}

// count runs a query that returns one integer.
func (e *myEnv) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.store.DB().QueryRowContext(e.t.Context(), query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// TestMySQLOneExecutionAcrossThreeProxies runs three `idem proxy` processes
// on one MySQL database in front of one upstream, as
// TestOneExecutionAcrossThreeProxies does on PostgreSQL: 300 concurrent
// requests with one key execute the upstream once, then 30 keys with 10
// concurrent requests each execute once per key.
//
// It is not parallel: it loads the whole machine.
func TestMySQLOneExecutionAcrossThreeProxies(t *testing.T) {
	e := newMyEnv(t)
	up := newUpstream(t, 100*time.Millisecond, nil)
	var proxies []*proc
	for i := range 3 {
		proxies = append(proxies, e.startProxy(fmt.Sprintf("proxy-%d", i), up.URL, 6, "--lease", "10s"))
	}
	const body = `{"amount":1000,"currency":"EUR"}`
	const n = 300
	shots := make([]shot, n)
	for i := range shots {
		shots[i] = shot{proxies[i%3].URL + "/v1/payments", "one-key"}
	}
	orig, inUse, replays := checkOneExecution(t, "one-key", burst(t, shots, body))
	t.Logf("one key, %d concurrent requests on 3 proxies: 1 execution, %d key-in-use, %d replays", n, inUse, replays)
	if got := up.executions("one-key"); got != 1 {
		t.Fatalf("the upstream executed one-key %d times, want 1", got)
	}
	for _, p := range proxies {
		a := post(t.Context(), p.URL+"/v1/payments", "one-key", body)
		if a.err != nil || a.status != http.StatusCreated || a.replayed != "true" || !bytes.Equal(a.body, orig.body) {
			t.Fatalf("%s after the burst: %v, want the replay of %q", p.name, a, orig.body)
		}
	}

	const keys, perKey = 30, 10
	shots = shots[:0]
	for i := range keys * perKey {
		shots = append(shots, shot{proxies[(i/keys)%3].URL + "/v1/payments", fmt.Sprintf("key-%02d", i%keys)})
	}
	answers := burst(t, shots, body)
	byKey := make(map[string][]answer)
	for i, s := range shots {
		byKey[s.key] = append(byKey[s.key], answers[i])
	}
	for key, as := range byKey {
		checkOneExecution(t, key, as)
		if got := up.executions(key); got != 1 {
			t.Fatalf("the upstream executed %s %d times, want 1", key, got)
		}
	}
	if got := up.total(); got != 1+keys {
		t.Fatalf("the upstream executed %d times in all, want %d", got, 1+keys)
	}
	recs, err := e.store.KeyList(t.Context(), &idemstore.ListParams{State: idemstore.StateCompleted, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1+keys {
		t.Fatalf("%d completed records, want %d", len(recs), 1+keys)
	}
}

// TestMySQLKilledProxyLeavesKeyUnknown kills a proxy on MySQL while its
// upstream call runs: once the lease has run out, a retry through another
// proxy gets 409 outcome-unknown, never a second execution.
func TestMySQLKilledProxyLeavesKeyUnknown(t *testing.T) {
	t.Parallel()
	e := newMyEnv(t)
	block := make(chan struct{})
	up := newUpstream(t, 0, block)
	defer close(block)
	a := e.startProxy("proxy-a", up.URL, 3, "--lease", "1s")
	b := e.startProxy("proxy-b", up.URL, 3, "--lease", "1s")
	const key, body = "crash-key", `{"amount":1000}`

	first := make(chan answer, 1)
	go func() { first <- post(t.Context(), a.URL+"/v1/payments", key, body) }()
	select {
	case <-up.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the request never reached the upstream")
	}
	killNow(t, a)
	if got := <-first; got.err == nil {
		t.Fatalf("the killed proxy answered: %v", got)
	}
	got := retryWhileInUse(t, b.URL+"/v1/payments", key, body, 20*time.Second)
	if got.err != nil || got.status != http.StatusConflict || got.code != idem.CodeOutcomeUnknown || got.retryAfter == "" {
		t.Fatalf("retry after the lease: %v, want 409 outcome-unknown with Retry-After", got)
	}
	if rec := e.record(); rec.State != idemstore.StateUnknown || rec.Attempts != 1 {
		t.Fatalf("record after the lease: state %s, %d attempts; want unknown after 1", rec.State, rec.Attempts)
	}
	if n := up.executions(key); n != 1 {
		t.Fatalf("the upstream executed %d times, want 1", n)
	}
}

// TestMySQLKilledTransactionalServerCommitsNothing kills a server in
// transactional mode on MySQL after its handler inserted a business row and
// before it answered: the row never commits, and once the lease has run out
// a retry on a second server executes once and commits exactly one row.
func TestMySQLKilledTransactionalServerCommitsNothing(t *testing.T) {
	t.Parallel()
	e := newMyEnv(t)
	if _, err := e.store.DB().ExecContext(t.Context(),
		"CREATE TABLE business_rows (id BIGINT AUTO_INCREMENT PRIMARY KEY, op_key VARBINARY(255) NOT NULL, pid INT NOT NULL) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	startChild := func(name string, block bool) *proc {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(idembin.Environ(), childEnv+"=mysql-tx", childMySQLEnv+"="+e.dsn, childLease+"=1s")
		if block {
			cmd.Env = append(cmd.Env, childBlock+"=1")
		}
		return start(t, name, cmd)
	}
	blocking := startChild("tx-server-blocking", true)
	second := startChild("tx-server", false)
	const key, body = "order-tx-crash", `{"amount":1000}`

	first := make(chan answer, 1)
	go func() { first <- post(t.Context(), blocking.URL+"/v1/orders", key, body) }()
	if blocking.waitLine(blockedRE, 30*time.Second) == nil {
		t.Fatal("the handler never reached its block")
	}
	killNow(t, blocking)
	if got := <-first; got.err == nil {
		t.Fatalf("the killed server answered: %v", got)
	}
	if n := e.count("SELECT count(*) FROM business_rows"); n != 0 {
		t.Fatalf("%d business rows after the kill, want 0", n)
	}
	got := retryWhileInUse(t, second.URL+"/v1/orders", key, body, 20*time.Second)
	if got.err != nil || got.status != http.StatusCreated || got.replayed != "" {
		t.Fatalf("retry after the lease: %v, want 201 from an execution", got)
	}
	replay := post(t.Context(), second.URL+"/v1/orders", key, body)
	if replay.status != http.StatusCreated || replay.replayed != "true" || !bytes.Equal(replay.body, got.body) {
		t.Fatalf("replay: %v, want the replay of %q", replay, got.body)
	}
	if n := e.count("SELECT count(*) FROM business_rows WHERE op_key = ? AND pid = ?", key, second.cmd.Process.Pid); n != 1 {
		t.Fatalf("%d business rows from the retry, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM business_rows"); n != 1 {
		t.Fatalf("%d business rows in all, want 1", n)
	}
	if rec := e.record(); rec.State != idemstore.StateCompleted || rec.Attempts != 2 {
		t.Fatalf("record: state %s, %d attempts; want completed after 2", rec.State, rec.Attempts)
	}
}

// runMySQLChild serves the middleware in transactional mode on MySQL on
// POST /v1/orders until the process is killed: the "mysql-tx" child.
func runMySQLChild(logger *slog.Logger) int {
	fail := func(err error) int {
		logger.Error("child failed", "error", err)
		return 3
	}
	lease, err := time.ParseDuration(os.Getenv(childLease))
	if err != nil {
		return fail(err)
	}
	store, err := idemmysql.Open(context.Background(), os.Getenv(childMySQLEnv), &idemmysql.Config{MaxConns: 3})
	if err != nil {
		return fail(err)
	}
	block := os.Getenv(childBlock) == "1"
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := idemmysql.TxFromContext(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		key, _ := idem.KeyFromContext(ctx)
		res, err := tx.ExecContext(ctx, "INSERT INTO business_rows (op_key, pid) VALUES (?, ?)", key, os.Getpid())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		if block {
			logger.Info("blocked", "row", id)
			select {} // until SIGKILL
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"row":%d,"pid":%d}`, id, os.Getpid())
	})
	mux := http.NewServeMux()
	mux.Handle(ordersPattern, idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Transactional: true, Lease: lease, Logger: logger}})(h))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	logger.Info("listening", "addr", ln.Addr().String(), "pid", os.Getpid())
	return fail((&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln))
}

// TestMySQLStoreOutage kills a private MariaDB under a running `idem proxy`
// and starts it again, as TestStoreOutage does with PostgreSQL: while it is
// down every request gets 503 store-unavailable and the upstream is never
// called; once it is back the same proxy serves again and replays what it
// stored before.
func TestMySQLStoreOutage(t *testing.T) {
	t.Parallel()
	srv := mariadbproc.Start(t)
	e := newMyEnvOn(t, srv.URL)
	up := newUpstream(t, 0, nil)
	p := e.startProxy("proxy", up.URL, 4, "--lease", "5s")
	url := p.URL + "/v1/payments"
	const body = `{"amount":1000}`
	before := post(t.Context(), url, "before", body)
	if before.err != nil || before.status != http.StatusCreated || before.replayed != "" {
		t.Fatalf("before the outage: %v", before)
	}

	srv.Kill()
	unavailable := func(a answer) bool {
		return a.err == nil && a.status == http.StatusServiceUnavailable && a.code == idem.CodeStoreUnavailable && a.retryAfter != ""
	}
	for _, key := range []string{"during", "after", "before"} {
		if a := post(t.Context(), url, key, body); !unavailable(a) {
			t.Fatalf("%s during the outage: %v, want 503 store-unavailable with Retry-After", key, a)
		}
	}
	if n := up.total(); n != 1 {
		t.Fatalf("the upstream ran %d times, want once (before the outage)", n)
	}

	srv.Restart()
	deadline := time.Now().Add(30 * time.Second)
	var after answer
	for {
		after = post(t.Context(), url, "after", body)
		if !unavailable(after) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still unavailable 30 s after the restart: %v", after)
		}
		time.Sleep(100 * time.Millisecond) // the database comes back on real time
	}
	if after.err != nil || after.status != http.StatusCreated || after.replayed != "" {
		t.Fatalf("after the outage: %v, want 201 from an execution", after)
	}
	for key, want := range map[string]answer{"before": before, "after": after} {
		a := post(t.Context(), url, key, body)
		if a.status != http.StatusCreated || a.replayed != "true" || !bytes.Equal(a.body, want.body) {
			t.Fatalf("%s after the outage: %v, want the replay of %q", key, a, want.body)
		}
	}
	if n := up.total(); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2", n)
	}
}
