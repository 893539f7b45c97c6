package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/internal/testenv"
)

// stores opens the minimal layer's store on the test Redis and PostgreSQL,
// each under a name of its own, and on a new SQLite file.
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
	return map[string]store{"redis": rs, "postgres": ps, "sqlite": openTestSQLite(t, filepath.Join(t.TempDir(), "min.db"))}
}

// openTestSQLite opens the minimal layer's SQLite store on the file path.
func openTestSQLite(t *testing.T, path string) *sqliteStore {
	t.Helper()
	ss, err := openSQLite(context.Background(), "sqlite:"+path+"?synchronous=FULL")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ss.close(); err != nil {
			t.Error(err)
		}
	})
	return ss
}

// TestSQLiteSharesCommits holds SQLite's write lock from another connection
// while 64 new keys are inserted at once: the writer, waiting to begin its
// transaction with the first, finds the other 63 queued when it begins, and
// commits all 64 in one transaction. Each is answered as a new key only
// after that commit, and is then durable (a second connection reads it).
func TestSQLiteSharesCommits(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "min.db")
	ss := openTestSQLite(t, path)
	ctx := context.Background()
	other, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lock, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	const n = 64
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i := range n {
		wg.Go(func() {
			taken, held, err := ss.insert(ctx, fmt.Sprint("k-", i))
			if err != nil || taken || held != nil {
				t.Errorf("insert k-%d: taken %v, held %q, %v; want a new key", i, taken, held, err)
			}
			answered.Add(1)
		})
	}
	// The writer took one write and waits for the lock; the others queue.
	for len(ss.queue) < n-1 {
		time.Sleep(time.Millisecond)
	}
	if answered.Load() != 0 || ss.commits.Load() != 0 {
		t.Fatalf("%d inserts answered, %d commits before the writer could begin", answered.Load(), ss.commits.Load())
	}
	if _, err := lock.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if c, w := ss.commits.Load(), ss.writes.Load(); c != 1 || w != n {
		t.Fatalf("%d commits held %d writes, want 1 commit of %d", c, w, n)
	}
	var rows int
	if err := lock.QueryRowContext(ctx, "SELECT count(*) FROM keys WHERE answer = ?", inProgress).Scan(&rows); err != nil || rows != n {
		t.Fatalf("another connection reads %d keys in progress (%v), want %d", rows, err, n)
	}
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
