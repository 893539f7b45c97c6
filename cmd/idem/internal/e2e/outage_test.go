package e2e

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/internal/testenv/pgproc"
)

// TestStoreOutage stops the PostgreSQL under a running service, as a crash
// would, and starts it again. While it is down every request gets 503
// store-unavailable with Retry-After and the handler never runs (fail
// closed, replays included); once it is back, requests succeed again
// without restarting the service, and what was stored before the outage is
// still replayed.
func TestStoreOutage(t *testing.T) {
	t.Parallel()
	c := pgproc.Start(t)
	cfg, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	store := idempgx.New(p, &idempgx.Config{Schema: "idem"})
	t.Cleanup(store.Close)
	if _, err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d,"nonce":%q}`, n, randomHex(8))
	})
	srv := httptest.NewServer(idem.New(store, &idem.Config{
		GuardConfig: idem.GuardConfig{StoreTimeout: 500 * time.Millisecond, Lease: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
	})(handler))
	t.Cleanup(srv.Close)
	url := srv.URL + "/v1/payments"
	const body = `{"amount":1000}`

	before := post(t.Context(), url, "before", body)
	if before.err != nil || before.status != http.StatusCreated || before.replayed != "" {
		t.Fatalf("before the outage: %v", before)
	}

	c.Crash()
	unavailable := func(a answer) bool {
		return a.err == nil && a.status == http.StatusServiceUnavailable && a.code == idem.CodeStoreUnavailable && a.retryAfter != ""
	}
	for _, key := range []string{"during-1", "during-2", "after", "before"} {
		start := time.Now()
		if a := post(t.Context(), url, key, body); !unavailable(a) {
			t.Fatalf("%s during the outage: %v, want 503 store-unavailable with Retry-After", key, a)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%s during the outage took %v to be refused", key, d)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once (before the outage)", n)
	}

	c.Start()
	// The pool may hand out a connection cut by the outage once more; the
	// service recovers by itself within a few requests.
	deadline := time.Now().Add(30 * time.Second)
	var after answer
	for failures := 0; ; failures++ {
		after = post(t.Context(), url, "after", body)
		if !unavailable(after) {
			t.Logf("%d answers store-unavailable after the restart", failures)
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
	if n := runs.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
	for key, want := range map[string]answer{"before": before, "after": after} {
		a := post(t.Context(), url, key, body)
		if a.status != http.StatusCreated || a.replayed != "true" || !bytes.Equal(a.body, want.body) {
			t.Fatalf("%s after the outage: %v, want the replay of %q", key, a, want.body)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
}
