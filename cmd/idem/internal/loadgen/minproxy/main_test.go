package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/internal/testenv"
)

// stores opens the minimal layer's store on the test Redis and PostgreSQL,
// each under a name of its own.
func stores(t *testing.T) map[string]store {
	t.Helper()
	tag := fmt.Sprintf("minproxy_%d", time.Now().UnixNano())
	ctx := context.Background()
	rs, err := open(ctx, testenv.RedisURL(t)+"?prefix="+tag+":")
	if err != nil {
		t.Fatal(err)
	}
	pgURL := testenv.PostgresURL(t)
	admin, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+tag); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP SCHEMA "+tag+" CASCADE") })
	sep := "?"
	if strings.Contains(pgURL, "?") {
		sep = "&"
	}
	ps, err := open(ctx, pgURL+sep+"table="+tag+".keys")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ps.(*pgStore).pool.Close)
	return map[string]store{"redis": rs, "postgres": ps}
}

func TestOnceThenReplay(t *testing.T) {
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			var hits atomic.Int64
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := hits.Add(1)
				time.Sleep(20 * time.Millisecond) // let concurrent calls find the key in progress
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"n":%d}`, n)
			}))
			defer up.Close()
			target, _ := url.Parse(up.URL)
			srv := httptest.NewServer(handler(st, target))
			defer srv.Close()
			key := fmt.Sprintf("k-%s-%d", name, time.Now().UnixNano())
			post := func() (int, string, string) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", strings.NewReader(`{}`))
				req.Header.Set("Idempotency-Key", key)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return 0, "", ""
				}
				defer res.Body.Close()
				b, _ := io.ReadAll(res.Body)
				return res.StatusCode, string(b), res.Header.Get("Idempotent-Replayed")
			}
			// 64 concurrent first sends of one key: one is forwarded, the
			// others find it in progress.
			var wg sync.WaitGroup
			var created, conflicts atomic.Int64
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					switch code, _, _ := post(); code {
					case http.StatusCreated:
						created.Add(1)
					case http.StatusConflict:
						conflicts.Add(1)
					default:
						t.Errorf("status %d", code)
					}
				}()
			}
			wg.Wait()
			if hits.Load() != 1 {
				t.Fatalf("upstream called %d times, want 1", hits.Load())
			}
			if created.Load() < 1 || created.Load()+conflicts.Load() != 64 {
				t.Fatalf("%d created, %d conflicts", created.Load(), conflicts.Load())
			}
			code, body, replayed := post()
			if code != http.StatusCreated || body != `{"n":1}` || replayed != "true" {
				t.Fatalf("retry: %d %q replayed=%q, want the stored 201 {\"n\":1}", code, body, replayed)
			}
			if hits.Load() != 1 {
				t.Fatalf("upstream called %d times after the retry, want 1", hits.Load())
			}
		})
	}
}
