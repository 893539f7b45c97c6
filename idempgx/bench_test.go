package idempgx

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/benchkit"
)

// The benchmarks compare the store with the same statements issued by a
// bare pgx loop (the Raw benchmarks), so the store's own cost shows as the
// ratio of the two. All run in parallel on the shared test pool.

// benchParallelism times GOMAXPROCS goroutines share the pool, so that
// several connections are busy at once even on a small machine.
const benchParallelism = 4

func benchStore(b *testing.B) *Store {
	b.Helper()
	return newTestStore(b, time.Now)
}

// BenchmarkReserveComplete is a new key: one reserve and one completion.
func BenchmarkReserveComplete(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	resp := sampleResponse()
	var n atomic.Int64
	b.SetParallelism(benchkit.Parallelism(benchParallelism))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			id := idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: fmt.Sprintf("key-%d", i)}
			token := fmt.Sprintf("token-%d", i)
			res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
				Identity: id, Fingerprint: fp1, Token: token, Lease: lease, TTL: ttl,
				LeaseExpiredState: idemstore.StateUnknown,
			})
			if err != nil || !res.Reserved {
				b.Fatalf("KeyReserve: %v (reserved %v)", err, res != nil && res.Reserved)
			}
			if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: token, Response: resp}); err != nil {
				b.Fatalf("KeyComplete: %v", err)
			}
		}
	})
}

// BenchmarkReplay answers retries of one completed key.
func BenchmarkReplay(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	p := &idemstore.ReserveParams{
		Identity: testID, Fingerprint: fp1, Token: "t0", Lease: lease, TTL: ttl,
		LeaseExpiredState: idemstore.StateUnknown,
	}
	if _, err := s.KeyReserve(ctx, p); err != nil {
		b.Fatal(err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t0", Response: sampleResponse()}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(benchkit.Parallelism(benchParallelism))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := *p
		p.Token = "t1"
		for pb.Next() {
			res, err := s.KeyReserve(ctx, &p)
			if err != nil || res.Reserved || res.Record.Response == nil {
				b.Fatalf("KeyReserve: %v", err)
			}
		}
	})
}

// rawReserve runs the reserve statement and scans its row without building
// a record.
func rawReserve(ctx context.Context, s *Store, id idemstore.Identity, token string, now time.Time) (bool, error) {
	args := []any{id.Scope, id.Endpoint, id.Key, token, fp1, now, now.Add(lease), now.Add(ttl), "unknown", ttl}
	b := &pgx.Batch{}
	b.Queue(s.q.reserve, args...)
	b.Queue(s.q.find, args[:reserveFindArgs]...)
	br := s.pool.SendBatch(ctx, b)
	tag, err := br.Exec()
	inserted := err == nil && tag.RowsAffected() == 1
	switch {
	case inserted: // the record is the one inserted: not decoded
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			rows.Close()
			err = rows.Err()
		}
	case err == nil:
		var rs recordScan
		err = br.QueryRow().Scan(rs.dest()...)
	}
	return inserted, cmp.Or(err, br.Close())
}

// BenchmarkRawReserveComplete is BenchmarkReserveComplete's statements in a
// bare pgx loop.
func BenchmarkRawReserveComplete(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	resp, err := encodeResponse(sampleResponse(), false)
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.SetParallelism(benchkit.Parallelism(benchParallelism))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			id := idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: fmt.Sprintf("key-%d", i)}
			token := fmt.Sprintf("token-%d", i)
			now := time.Now()
			reserved, err := rawReserve(ctx, s, id, token, now)
			if err != nil || !reserved {
				b.Fatalf("reserve: %v (reserved %v)", err, reserved)
			}
			_, err = s.pool.Exec(ctx, s.q.complete, id.Scope, id.Endpoint, id.Key, token, now,
				resp.status, resp.header, resp.body, resp.notReplayable)
			if err != nil {
				b.Fatalf("complete: %v", err)
			}
		}
	})
}

// BenchmarkRawReplay is BenchmarkReplay's statement in a bare pgx loop.
func BenchmarkRawReplay(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	if _, err := rawReserve(ctx, s, testID, "t0", time.Now()); err != nil {
		b.Fatal(err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t0", Response: sampleResponse()}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(benchkit.Parallelism(benchParallelism))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			reserved, err := rawReserve(ctx, s, testID, "t1", time.Now())
			if err != nil || reserved {
				b.Fatalf("reserve: %v (reserved %v)", err, reserved)
			}
		}
	})
}

// BenchmarkRawReplayOnConflictDoUpdate is the replay path SPEC section 7
// warns about, for comparison: INSERT … ON CONFLICT DO UPDATE … WHERE whose
// WHERE is false locks the completed row (a write flushed at commit), and a
// second statement reads it.
func BenchmarkRawReplayOnConflictDoUpdate(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	if _, err := rawReserve(ctx, s, testID, "t0", time.Now()); err != nil {
		b.Fatal(err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t0", Response: sampleResponse()}); err != nil {
		b.Fatal(err)
	}
	upsert := `INSERT INTO ` + s.schema + `.idem_keys AS k (scope, endpoint, key, fingerprint, state, token,
    locked_until, started_at, lease_expired_state, created_at, updated_at, expires_at)
VALUES ($1, $2, $3, $4, 'in_progress', $5, $7, $6, 'unknown', $6, $6, $8)
ON CONFLICT (scope, endpoint, key) DO UPDATE SET token = excluded.token,
    state = 'in_progress', locked_until = excluded.locked_until
WHERE k.state = 'released' AND k.fingerprint = excluded.fingerprint
RETURNING true`
	b.SetParallelism(benchkit.Parallelism(benchParallelism))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := time.Now()
			rows, err := s.pool.Query(ctx, upsert, testID.Scope, testID.Endpoint, testID.Key, fp1, "t1",
				now, now.Add(lease), now.Add(ttl))
			if err != nil {
				b.Fatal(err)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				b.Fatal(err)
			}
			var rs recordScan
			if err := s.pool.QueryRow(ctx, s.q.get, testID.Scope, testID.Endpoint, testID.Key, now).Scan(rs.dest()...); err != nil {
				b.Fatal(err)
			}
		}
	})
}
