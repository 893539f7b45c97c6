package idemmem_test

import (
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// BenchmarkReserve measures reserving a new key.
func BenchmarkReserve(b *testing.B) {
	s := idemmem.New(nil)
	ctx := b.Context()
	i := 0
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
}

// BenchmarkGetCompleted measures reading a completed record with a 1 KiB body.
func BenchmarkGetCompleted(b *testing.B) {
	s := idemmem.New(nil)
	ctx := b.Context()
	id := idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: "key"}
	if _, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
		Identity: id, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour,
	}); err != nil {
		b.Fatal(err)
	}
	resp := &idemstore.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   make([]byte, 1024),
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t", Response: resp}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.KeyGet(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLiveRecord measures the memory a completed record keeps while it
// lives (its retention): 100,000 records, each completed with the answer of
// the end-to-end benchmark's upstream, reported as live-bytes/record (the
// heap in use after a collection, less the empty store's). A long-lived
// store's heap is what the garbage collector marks on every cycle.
func BenchmarkLiveRecord(b *testing.B) {
	const n = 100_000
	body := []byte(`{"method":"POST","path":"/v1/payments","body":{"customer_id":"cus_bench","amount_cents":1999,"currency":"EUR"}}`)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := idemmem.New(nil)
		ctx := b.Context()
		for i := range n {
			id := idemstore.Identity{Endpoint: "POST /v1/payments", Key: fmt.Sprintf("key-%d-%d", b.N, i)}
			token := fmt.Sprintf("%032x", i)
			if _, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
				Identity: id, Fingerprint: fmt.Sprintf("%064x", i), Token: token, Lease: time.Minute, TTL: 24 * time.Hour,
			}); err != nil {
				b.Fatal(err)
			}
			// A response as the middleware hands it over: a header of its own.
			resp := &idemstore.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
			if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: token, Response: resp}); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "live-bytes/record")
		runtime.KeepAlive(s)
	}
}
