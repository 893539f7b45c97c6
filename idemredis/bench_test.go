package idemredis

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// The benchmarks run against the Redis at IDEM_TEST_REDIS_URL. The Raw ones
// run the same scripts with go-redis directly, without the store's key
// hashing, argument formatting and record decoding: the ratio is the
// store's own overhead.

const benchParallelism = 8

var benchResponse = &idemstore.Response{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_123"}},
	Body:   []byte(`{"id":"pay_123","amount":1000,"currency":"eur","status":"succeeded"}`),
}

// BenchmarkReserveComplete is a new key: reserve, then complete.
func BenchmarkReserveComplete(b *testing.B) {
	s := newTestStore(b, sharedClient(b), time.Now)
	var n atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			key := strconv.FormatInt(n.Add(1), 10)
			id := idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: key}
			res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
				Identity: id, Fingerprint: "fp", Token: key, Lease: 30 * time.Second, TTL: time.Hour,
			})
			if err != nil || !res.Reserved {
				b.Fatalf("KeyReserve: %v", err)
			}
			if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: key, Response: benchResponse}); err != nil {
				b.Fatalf("KeyComplete: %v", err)
			}
		}
	})
}

// BenchmarkReplay is a retry of a completed key: one reserve that reads the
// stored response.
func BenchmarkReplay(b *testing.B) {
	s := newTestStore(b, sharedClient(b), time.Now)
	ctx := b.Context()
	p := &idemstore.ReserveParams{Identity: testID, Fingerprint: "fp", Token: "t", Lease: 30 * time.Second, TTL: time.Hour}
	if _, err := s.KeyReserve(ctx, p); err != nil {
		b.Fatal(err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t", Response: benchResponse}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := s.KeyReserve(ctx, p)
			if err != nil || res.Reserved || res.Record.Response == nil {
				b.Fatalf("replay: %+v, %v", res, err)
			}
		}
	})
}

// BenchmarkRawReserveComplete runs the reserve and complete scripts with
// go-redis alone.
func BenchmarkRawReserveComplete(b *testing.B) {
	client := sharedClient(b)
	s := newTestStore(b, client, time.Now) // for its prefix and cleanup
	header := `{"Content-Type":["application/json"],"Location":["/v1/payments/pay_123"]}`
	var n atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			i := n.Add(1)
			member := strconv.FormatInt(i, 10)
			k := s.bucketKeys(int(i%bucketCount), member)
			now := time.Now().UnixMicro()
			err := reserveScript.Run(ctx, client, []string{k.record, k.index, k.expiry},
				now, "bench", "POST /v1/payments", member, "fp", member, now+30e6, "unknown",
				now+3600e6, 3660000, member, k.channel, now-3600e6).Err()
			if err != nil {
				b.Fatal(err)
			}
			err = completeScript.Run(ctx, client, []string{k.record, k.index},
				now, member, "0", 201, header, benchResponse.Body, member, k.channel).Err()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRawReplay runs the reserve script on a completed record with
// go-redis alone.
func BenchmarkRawReplay(b *testing.B) {
	client := sharedClient(b)
	s := newTestStore(b, client, time.Now)
	ctx := b.Context()
	p := &idemstore.ReserveParams{Identity: testID, Fingerprint: "fp", Token: "t", Lease: 30 * time.Second, TTL: time.Hour}
	if _, err := s.KeyReserve(ctx, p); err != nil {
		b.Fatal(err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t", Response: benchResponse}); err != nil {
		b.Fatal(err)
	}
	k := s.keysOf(testID)
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := time.Now().UnixMicro()
			vals, err := reserveScript.Run(ctx, client, []string{k.record, k.index, k.expiry},
				now, testID.Scope, testID.Endpoint, testID.Key, "fp", "t2", now+30e6, "unknown",
				now+3600e6, 3660000, k.member, k.channel, now-3600e6).Slice()
			if err != nil || vals[0].(int64) != 0 {
				b.Fatalf("raw replay: %v", err)
			}
		}
	})
}
