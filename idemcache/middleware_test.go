package idemcache

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

type answer struct {
	status         int
	body, replayed string
}

// post sends a payment request with key and body to srv.
func post(t *testing.T, srv *httptest.Server, key, body string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(idem.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, string(b), resp.Header.Get(idem.HeaderReplayed)}
}

// paymentHandler answers 201 with a payment number and counts its runs.
func paymentHandler(runs *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, n)
	})
}

// redisProcess is a redis-server the test started.
type redisProcess struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

// startRedis starts a redis-server without persistence on a free port and
// waits until it answers PING. It is killed at the end of the test.
func startRedis(t *testing.T) *redisProcess {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Unavailable(t, "redis-server is not on PATH: cannot start a Redis to kill")
	}
	addr := closedAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	dir := t.TempDir()
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log"))
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	p := &redisProcess{cmd: cmd, addr: addr, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	deadline := time.Now().Add(10 * time.Second)
	for client.Ping(t.Context()).Err() != nil {
		select {
		case <-p.done:
			t.Fatalf("redis-server on %s exited", addr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s does not answer", addr)
		}
	}
	return p
}

// kill kills the process and waits until it is gone.
func (p *redisProcess) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// TestMiddlewareRedisKilled runs the real middleware over a Redis cache, then
// kills the Redis: every replay is still answered, from the store, and the
// handler never runs twice for a key.
func TestMiddlewareRedisKilled(t *testing.T) {
	t.Parallel()
	proc := startRedis(t)
	client := redis.NewClient(deadOptions(proc.addr))
	t.Cleanup(func() { client.Close() })
	inner := newCountingMem(time.Now)
	// Backoff -1: every request tries the dead cache, the hardest case.
	store := New(inner, NewRedis(client, "idemcache:"), &Config{Backoff: -1, Logger: discardLogger()})
	var runs atomic.Int32
	srv := httptest.NewServer(idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Logger: discardLogger()}})(paymentHandler(&runs)))
	t.Cleanup(srv.Close)

	const body = `{"amount":1000}`
	first := post(t, srv, "k1", body)
	if first.status != http.StatusCreated || first.replayed != "" {
		t.Fatalf("first request: %+v, want a fresh 201", first)
	}
	requireReplayed := func(what string, a answer, want answer) {
		t.Helper()
		if a.status != want.status || a.body != want.body || a.replayed != "true" {
			t.Fatalf("%s: %+v, want the replay of %+v", what, a, want)
		}
	}
	for i := range 3 {
		requireReplayed(fmt.Sprintf("replay %d", i), post(t, srv, "k1", body), first)
	}
	// New key, first replay (filling the cache); then two from the cache.
	if n := inner.reserves.Load(); n != 2 {
		t.Fatalf("%d store reservations for one request and three replays, want 2", n)
	}
	if rec, err := NewRedis(client, "idemcache:").Get(t.Context(), testIDOf("k1")); err != nil || rec == nil {
		t.Fatalf("the replay is not in Redis: %v, %v", rec, err)
	}

	proc.kill()
	for i := range 5 {
		requireReplayed(fmt.Sprintf("replay %d with Redis dead", i), post(t, srv, "k1", body), first)
	}
	if n := inner.reserves.Load(); n != 7 {
		t.Fatalf("%d store reservations, want 7: every replay with Redis dead asks the store", n)
	}
	// Another fingerprint is still key-reused, and a new key still runs once.
	if a := post(t, srv, "k1", `{"amount":2000}`); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("other body with Redis dead: %+v, want 422 key-reused", a)
	}
	second := post(t, srv, "k2", body)
	if second.status != http.StatusCreated || second.replayed != "" {
		t.Fatalf("new key with Redis dead: %+v, want a fresh 201", second)
	}
	requireReplayed("replay of the new key with Redis dead", post(t, srv, "k2", body), second)
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times for two keys, want 2", n)
	}
}

// testIDOf is the identity the middleware gives key on the test route.
func testIDOf(key string) idemstore.Identity {
	return idemstore.Identity{Endpoint: "POST /v1/payments", Key: key}
}

// TestMiddlewareTransactional runs the middleware in transactional mode over
// idemsqlite through the cache: the payment and the key's completion commit
// together, replays come from the cache, a rolled-back attempt re-executes.
func TestMiddlewareTransactional(t *testing.T) {
	t.Parallel()
	sqlite := openSQLite(t, time.Now)
	if _, err := sqlite.DB().ExecContext(t.Context(), "CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	inner := &countingSQLite{Store: sqlite}
	store := New(inner, NewLRU(100, 0), &Config{Logger: discardLogger()})

	var runs atomic.Int32
	var fail atomic.Bool
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tx, err := idemsqlite.TxFromContext(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		res, err := tx.ExecContext(r.Context(), "INSERT INTO payments (amount) VALUES (1000)")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if fail.Load() {
			http.Error(w, "downstream failed", http.StatusInternalServerError) // rolls back
			return
		}
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, id)
	})
	srv := httptest.NewServer(idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Transactional: true, Logger: discardLogger()}})(handler))
	t.Cleanup(srv.Close)
	const body = `{"amount":1000}`

	// A failing attempt rolls back and releases: the retry executes.
	fail.Store(true)
	if a := post(t, srv, "k1", body); a.status != http.StatusInternalServerError {
		t.Fatalf("failing attempt: %+v, want 500", a)
	}
	fail.Store(false)
	first := post(t, srv, "k1", body)
	if first.status != http.StatusCreated || first.replayed != "" {
		t.Fatalf("retry after the rollback: %+v, want a fresh 201", first)
	}
	before := inner.reserves.Load()
	for i := range 4 {
		a := post(t, srv, "k1", body)
		if a.status != first.status || a.body != first.body || a.replayed != "true" {
			t.Fatalf("replay %d: %+v, want the replay of %+v", i, a, first)
		}
	}
	if n := inner.reserves.Load() - before; n != 1 {
		t.Fatalf("four replays made %d store reservations, want 1 (the rest from the cache)", n)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (the rolled-back attempt and its retry)", n)
	}
	var payments int
	if err := sqlite.DB().QueryRowContext(t.Context(), "SELECT count(*) FROM payments").Scan(&payments); err != nil {
		t.Fatal(err)
	}
	if payments != 1 {
		t.Fatalf("%d payments committed, want 1", payments)
	}
}
