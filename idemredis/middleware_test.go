package idemredis

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

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// TestMiddlewareTwoNodes runs the middleware on two app nodes sharing one
// Redis (and one Redis Cluster): duplicates of a request in progress on node
// A wait on both nodes, woken across nodes by the scripts' notifications,
// and the handler runs once.
func TestMiddlewareTwoNodes(t *testing.T) {
	t.Parallel()
	clients(t, func(t *testing.T, client redis.UniversalClient) {
		storeA := newTestStore(t, client, time.Now)
		storeB := New(client, &Config{Prefix: storeA.prefix})

		var runs atomic.Int32
		release := make(chan struct{})
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			<-release
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"run":%d}`, n)
		})
		cfg := &idem.Config{GuardConfig: idem.GuardConfig{Wait: 20 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
		nodeA := httptest.NewServer(idem.New(storeA, cfg)(handler))
		t.Cleanup(nodeA.Close)
		nodeB := httptest.NewServer(idem.New(storeB, cfg)(handler))
		t.Cleanup(nodeB.Close)

		post := func(url string) (int, string, string, error) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/payments", strings.NewReader(`{"amount":1000}`))
			if err != nil {
				return 0, "", "", err
			}
			req.Header.Set("Idempotency-Key", "order-42")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, "", "", err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body), resp.Header.Get(idem.HeaderReplayed), err
		}

		type answer struct {
			status         int
			body, replayed string
			err            error
		}
		first := make(chan answer, 1)
		go func() {
			s, b, r, err := post(nodeA.URL)
			first <- answer{s, b, r, err}
		}()
		// Wait (bounded) until the first request holds the lease.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		id := idemstore.Identity{Endpoint: "POST /v1/payments", Key: "order-42"}
		if err := pollUntil(ctx, func() bool { return runs.Load() == 1 }); err != nil {
			t.Fatal("the first request never reached the handler")
		}

		const dupsA, dupsB = 3, 6
		var wg sync.WaitGroup
		answers := make(chan answer, dupsA+dupsB)
		for i := range dupsA + dupsB {
			url := nodeA.URL
			if i >= dupsA {
				url = nodeB.URL
			}
			wg.Go(func() {
				s, b, r, err := post(url)
				answers <- answer{s, b, r, err}
			})
		}
		// Every duplicate waits on the record's channel (the middleware's
		// KeyWait); then the handler may finish.
		rec, err := storeA.KeyGet(ctx, id)
		if err != nil {
			t.Fatalf("KeyGet of the record in progress (the scope or endpoint differs from the middleware's?): %v", err)
		}
		channel := storeA.keysOf(rec.Identity).channel
		if err := pollUntil(ctx, func() bool {
			n, err := shardNumSub(ctx, client, channel)
			return err == nil && n >= dupsA+dupsB
		}); err != nil {
			t.Fatalf("the duplicates never all waited on %s: %v", channel, err)
		}
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
	})
}
