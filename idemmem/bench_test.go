package idemmem_test

import (
	"fmt"
	"net/http"
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
