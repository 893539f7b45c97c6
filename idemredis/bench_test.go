package idemredis

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// rawEval sends a command made by a builder of args.go with EVALSHA and
// nothing else: no NOSCRIPT fallback, no slot retries, no WAIT.
func rawEval(ctx context.Context, client redis.UniversalClient, sc *script, call []any) *redis.Cmd {
	call[0], call[1] = argEvalSha, sc.hash
	cmd := redis.NewCmd(ctx, call...)
	_ = client.Process(ctx, cmd)
	return cmd
}

// loadScripts loads scripts into the Redis of client, for rawEval.
func loadScripts(b *testing.B, client redis.UniversalClient, scripts ...*script) {
	for _, sc := range scripts {
		if err := sc.Load(b.Context(), client).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawReserveComplete runs the reserve and complete scripts with
// go-redis alone.
func BenchmarkRawReserveComplete(b *testing.B) {
	client := sharedClient(b)
	s := newTestStore(b, client, time.Now) // for its prefix and cleanup
	loadScripts(b, client, reserveScript, completeScript)
	resp, err := encodeResponse(benchResponse, false)
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			i := n.Add(1)
			member := strconv.FormatInt(i, 10)
			k := s.bucketKeys(int(i%bucketCount), member).box()
			now := time.Now().UnixMicro()
			p := &idemstore.ReserveParams{Identity: idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: member},
				Fingerprint: "fp", Token: member}
			err := rawEval(ctx, client, reserveScript, newReserveArgs(p, now).call(k)).Err()
			if err != nil {
				b.Fatal(err)
			}
			err = rawEval(ctx, client, completeScript, completeArgs{now: now, token: member, resp: resp}.call(k)).Err()
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
	k := s.keysOf(testID).boxed
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := time.Now().UnixMicro()
			p := &idemstore.ReserveParams{Identity: testID, Fingerprint: "fp", Token: "t2"}
			v, err := rawEval(ctx, client, reserveScript, newReserveArgs(p, now).call(k)).Text()
			if err != nil || v == "" {
				b.Fatalf("raw replay: %v", err)
			}
		}
	})
}

// newReserveArgs are reserve.lua's arguments for p at now with a lease of
// 30 s and a retention of an hour, as a new key of the default lease has
// them.
func newReserveArgs(p *idemstore.ReserveParams, now int64) reserveArgs {
	var a reserveArgs
	a.record, a.now, a.lockedUntil = newRecordValue(p, idemstore.StateUnknown, now, now+30e6, now+3600e6, 3600e6)
	return a
}
