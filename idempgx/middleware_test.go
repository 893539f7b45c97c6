package idempgx

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

type answer struct {
	status         int
	body, replayed string
	err            error
}

func post(ctx context.Context, url, key string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/payments", strings.NewReader(`{"amount":1000}`))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(body), resp.Header.Get(idem.HeaderReplayed), err}
}

// TestMiddlewareTwoNodes runs the middleware in transactional and wait mode
// on two app nodes sharing one database: duplicates on both nodes wait for
// the request in progress, the handler runs once, its payment and the key's
// completion commit together, and every duplicate gets the replay.
func TestMiddlewareTwoNodes(t *testing.T) {
	t.Parallel()
	storeA := newTestStore(t, time.Now)
	t.Cleanup(storeA.Close)
	storeB := New(storeA.pool, &Config{Schema: storeA.cfg.Schema})
	t.Cleanup(storeB.Close)
	ctx := t.Context()
	if _, err := storeA.pool.Exec(ctx, "CREATE TABLE "+storeA.schema+".payments (id serial PRIMARY KEY, amount int NOT NULL)"); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int32
	release := make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-release
		tx, err := TxFromContext(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var id int
		if err := tx.QueryRow(r.Context(), "INSERT INTO "+storeA.schema+".payments (amount) VALUES (1000) RETURNING id").Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, id)
	})
	cfg := &idem.Config{GuardConfig: idem.GuardConfig{Wait: 20 * time.Second, Transactional: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	nodeA := httptest.NewServer(idem.New(storeA, cfg)(handler))
	t.Cleanup(nodeA.Close)
	nodeB := httptest.NewServer(idem.New(storeB, cfg)(handler))
	t.Cleanup(nodeB.Close)

	first := make(chan answer, 1)
	go func() { first <- post(ctx, nodeA.URL, "order-42") }()
	deadline := time.Now().Add(10 * time.Second)
	for runs.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first request never reached the handler")
		}
		time.Sleep(5 * time.Millisecond)
	}

	const dupsA, dupsB = 3, 6
	var wg sync.WaitGroup
	answers := make(chan answer, dupsA+dupsB)
	for i := range dupsA + dupsB {
		url := nodeA.URL
		if i >= dupsA {
			url = nodeB.URL
		}
		wg.Go(func() { answers <- post(ctx, url, "order-42") })
	}
	// A duplicate marked the record as waited for before the handler ends.
	b := &bundle{store: storeA, ctx: ctx}
	b.waitFlagged(t, idemstore.Identity{Endpoint: "POST /v1/payments", Key: "order-42"})
	close(release)
	wg.Wait()
	close(answers)

	a := <-first
	if a.err != nil || a.status != http.StatusCreated || a.replayed != "" {
		t.Fatalf("first request: %+v", a)
	}
	for d := range answers {
		if d.err != nil || d.status != http.StatusCreated || d.body != a.body || d.replayed != "true" {
			t.Fatalf("duplicate: %+v, want the replay of %q", d, a.body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
	var payments int
	if err := storeA.pool.QueryRow(ctx, "SELECT count(*) FROM "+storeA.schema+".payments").Scan(&payments); err != nil || payments != 1 {
		t.Fatalf("%d payments (%v), want 1", payments, err)
	}
}

// TestMiddlewareRollback: a handler that fails after writing rolls its
// writes back with the key released, and the retry executes once more.
func TestMiddlewareRollback(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, time.Now)
	ctx := t.Context()
	if _, err := s.pool.Exec(ctx, "CREATE TABLE "+s.schema+".payments (id serial PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		tx, err := TxFromContext(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := tx.Exec(r.Context(), "INSERT INTO "+s.schema+".payments DEFAULT VALUES"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if n == 1 {
			http.Error(w, "downstream failed", http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(idem.New(s, &idem.Config{GuardConfig: idem.GuardConfig{Transactional: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})(handler))
	t.Cleanup(srv.Close)

	count := func() int {
		t.Helper()
		var n int
		if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.schema+".payments").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if a := post(ctx, srv.URL, "k"); a.err != nil || a.status != http.StatusBadGateway {
		t.Fatalf("first attempt: %+v", a)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d payments after the failed attempt, want 0", n)
	}
	if a := post(ctx, srv.URL, "k"); a.err != nil || a.status != http.StatusCreated || a.replayed != "" {
		t.Fatalf("retry: %+v", a)
	}
	if a := post(ctx, srv.URL, "k"); a.err != nil || a.status != http.StatusCreated || a.replayed != "true" {
		t.Fatalf("replay: %+v", a)
	}
	if n := count(); n != 1 || runs.Load() != 2 {
		t.Fatalf("%d payments after %d runs, want 1 after 2", n, runs.Load())
	}
}
