package idemsqlite_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/benchkit"
)

// BenchmarkReserve measures reserving a new key: one write transaction,
// durable at commit with synchronous=FULL (the default) or NORMAL.
func BenchmarkReserve(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		b.Run(sync, func(b *testing.B) {
			s := openStore(b, &idemsqlite.Config{Synchronous: sync})
			ctx := b.Context()
			i := 0
			defer reportCPU(b)()
			for b.Loop() {
				i++
				_, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
					Identity:    idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: fmt.Sprint("key-", i)},
					Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour,
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReserveParallel measures new-key reservations from many
// goroutines at once, all contending for SQLite's single writer.
func BenchmarkReserveParallel(b *testing.B) {
	s := countBatches(openStore(b, nil))
	ctx := b.Context()
	var n atomic.Int64
	b.SetParallelism(16)
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
				Identity:    idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: fmt.Sprint("key-", n.Add(1))},
				Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour,
			})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportBatches(b, s)
}

// BenchmarkNewKeyParallel measures what a new key costs the store under
// load: a reservation and then a completion with a small response (as `idem
// proxy` stores for its benchmark's upstream), from 16 goroutines per CPU,
// each write durable (synchronous=FULL) in a group commit.
func BenchmarkNewKeyParallel(b *testing.B) {
	s := countBatches(openStore(b, nil))
	ctx := b.Context()
	resp := &idemstore.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Content-Length": {"110"}},
		Body:   []byte(`{"method":"POST","path":"/v1/payments","body":{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}}`),
	}
	var n atomic.Int64
	b.SetParallelism(16)
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: fmt.Sprint("key-", n.Add(1))}
			_, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
				Identity: id, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour,
			})
			if err == nil {
				err = s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t", Response: resp})
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportBatches(b, s)
}

// completedStore returns a store holding one completed record with a 1 KiB
// body.
func completedStore(b *testing.B) (*idemsqlite.Store, idemstore.Identity) {
	s := openStore(b, nil)
	id := idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: "key"}
	reserve(b, s, id, "t")
	resp := &idemstore.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   make([]byte, 1024),
	}
	if err := s.KeyComplete(b.Context(), &idemstore.CompleteParams{Identity: id, Token: "t", Response: resp}); err != nil {
		b.Fatal(err)
	}
	return s, id
}

// BenchmarkGetCompleted measures reading a completed record.
func BenchmarkGetCompleted(b *testing.B) {
	s, id := completedStore(b)
	ctx := b.Context()
	for b.Loop() {
		if _, err := s.KeyGet(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay measures KeyReserve of a completed record, the replay
// path: one read, no write lock.
func BenchmarkReplay(b *testing.B) {
	s, id := completedStore(b)
	ctx := b.Context()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
				Identity: id, Fingerprint: "fp", Token: "t2", Lease: time.Minute, TTL: time.Hour,
			})
			if err != nil || res.Reserved {
				b.Errorf("KeyReserve = %+v, %v", res, err)
				return
			}
		}
	})
}

// BenchmarkMiddlewareNewKey measures a request with a new key through the
// middleware on the default store (synchronous=FULL), one at a time: the
// latency of a lone request, which pays a durable reservation and a durable
// completion.
func BenchmarkMiddlewareNewKey(b *testing.B) {
	h := idem.New(openStore(b, nil), nil)(benchkit.Handler)
	i := 0
	for b.Loop() {
		i++
		w := httptest.NewRecorder()
		h.ServeHTTP(w, benchkit.RequestBody(fmt.Sprint("key-", i), benchkit.BodyN(int64(i))))
		if w.Code != http.StatusCreated {
			b.Fatal(w.Code, w.Body)
		}
	}
}

// BenchmarkMiddlewareNewKeyParallel measures requests with new keys through
// the middleware on the default store from 16 goroutines per CPU, as a
// loaded server sees them: all of them wait for SQLite's one writer.
func BenchmarkMiddlewareNewKeyParallel(b *testing.B) {
	s := countBatches(openStore(b, nil))
	h := idem.New(s, nil)(benchkit.Handler)
	var n atomic.Int64
	b.SetParallelism(16)
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, benchkit.RequestBody(fmt.Sprint("key-", i), benchkit.BodyN(i)))
			if w.Code != http.StatusCreated {
				b.Error(w.Code, w.Body)
				return
			}
		}
	})
	reportBatches(b, s)
}

// reportBatches reports the writes per commit of s's group commit and its
// commits per op, and logs how many commits held how many writes.
func reportBatches(b *testing.B, s *idemsqlite.Store) {
	commits, writes := idemsqlite.BatchStats(s)
	if commits == 0 {
		return
	}
	b.ReportMetric(float64(writes)/float64(commits), "writes/commit")
	b.ReportMetric(float64(commits)/float64(b.N), "commits/op")
	if h := batchSizes[s]; h != nil {
		var sb strings.Builder
		for n, c := range h {
			if c > 0 {
				fmt.Fprintf(&sb, " %d:%d", n, c)
			}
		}
		b.Logf("N=%d, commits of n writes (n:commits):%s", b.N, sb.String())
	}
}

// batchSizes counts, per store that countBatches was called on, its
// committed batches by number of writes.
var batchSizes = map[*idemsqlite.Store][]int64{}

// countBatches makes s count its committed batches by size in batchSizes
// (for reportBatches). Call it before using s.
func countBatches(s *idemsqlite.Store) *idemsqlite.Store {
	h := make([]int64, 65)
	batchSizes[s] = h
	idemsqlite.OnCommitted(s, func(n int) { h[min(n, len(h)-1)]++ })
	return s
}

// reportCPU starts measuring the process's CPU time (user and system: the
// store runs in the process, its fsyncs included) and returns the function
// that reports it per op: under load, wall time per op hides what a write
// costs while it waits for a commit.
func reportCPU(b *testing.B) (stop func()) {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	return func() {
		b.ReportMetric(float64((cpu()-start).Microseconds())/float64(b.N), "cpu-µs/op")
	}
}
