package idempgx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// largeEnv enables the 10,000,000-row case of BenchmarkReserveScale.
const largeEnv = "IDEM_BENCH_LARGE"

// partitionsEnv, set to N, runs BenchmarkReserveScale on key tables
// hash-partitioned into N partitions (Config.Partitions), filled with
// records of 1,000 tenants rather than one, so that they spread.
const partitionsEnv = "IDEM_BENCH_PARTITIONS"

// scaleStore returns a migrated store for BenchmarkReserveScale: with
// partitionsEnv, on a partitioned key table.
func scaleStore(b *testing.B) *Store {
	n, _ := strconv.Atoi(os.Getenv(partitionsEnv))
	if n > 0 {
		return newPartitionedStore(b, time.Now, n)
	}
	return newTestStore(b, time.Now)
}

// BenchmarkReserveScale measures KeyReserve of a new key, one request at a
// time, on an empty table and on a table that already holds 10,000,000
// records (what a service keeping 24 hours of keys at ~115 new keys a second
// carries), and reports the p50 and p99 of the calls besides the mean.
//
// The large case fills its own schema once per run (per -count), which takes
// minutes, so it runs only with IDEM_BENCH_LARGE=1:
//
//	go test -run '^$' -bench BenchmarkReserveScale ./idempgx
//	IDEM_BENCH_LARGE=1 go test -run '^$' -bench BenchmarkReserveScale -benchtime 20000x -count 1 -timeout 30m ./idempgx
//
// With IDEM_BENCH_PARTITIONS=N both tables are hash-partitioned by scope.
func BenchmarkReserveScale(b *testing.B) {
	const large = 10_000_000
	// The large table is filled before either case runs, so that the two
	// are measured back to back, under the same load of the machine.
	var filled *Store
	if os.Getenv(largeEnv) == "1" {
		filled = scaleStore(b)
		fillScaleTable(b, filled, large)
	}
	b.Run("rows=0", func(b *testing.B) {
		benchReserve(b, scaleStore(b))
	})
	b.Run(fmt.Sprintf("rows=%d", large), func(b *testing.B) {
		if filled == nil {
			b.Skipf("set %s=1 to fill a table with %d records (takes minutes)", largeEnv, large)
		}
		benchReserve(b, filled)
	})
}

// benchReserve reserves new random keys on s, one at a time, and reports
// the p50 and p99 of the calls.
func benchReserve(b *testing.B, s *Store) {
	ctx := context.Background()
	var lat []time.Duration
	buf := make([]byte, 16)
	for b.Loop() {
		rand.Read(buf)
		key := hex.EncodeToString(buf)
		start := time.Now()
		res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
			Identity:    idemstore.Identity{Scope: "tenant", Endpoint: "POST /v1/payments", Key: key},
			Fingerprint: "fp", Token: key, Lease: time.Minute, TTL: 24 * time.Hour,
		})
		lat = append(lat, time.Since(start))
		if err != nil || !res.Reserved {
			b.Fatalf("reserve: %v, %+v", err, res)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[(len(lat)-1)*99/100].Microseconds()), "p99-µs")
}

// fillScaleTable inserts rows records with random keys (as clients' UUIDs
// are) into s's table, most of them completed, the rest released or
// unknown, with retentions spread over the next day. The indexes are
// dropped for the insert and built again from their own definitions, which
// is much faster than maintaining them row by row; then the table is
// vacuumed and analyzed, as autovacuum would have done.
func fillScaleTable(b *testing.B, s *Store, rows int) {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	var indexes []string
	r, err := s.pool.Query(ctx, `
SELECT pg_get_indexdef(i.indexrelid)
FROM pg_index i
JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = $1 AND t.relname = 'idem_keys' AND NOT i.indisprimary`, s.cfg.Schema)
	if err == nil {
		for r.Next() {
			var def string
			if err = r.Scan(&def); err != nil {
				break
			}
			indexes = append(indexes, def)
		}
		r.Close()
		err = r.Err()
	}
	if err != nil {
		b.Fatalf("reading the index definitions: %v", err)
	}
	var pkey string
	err = s.pool.QueryRow(ctx, "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'idem_keys_pkey' AND conrelid = $1::regclass",
		s.schema+".idem_keys").Scan(&pkey)
	if err != nil {
		b.Fatalf("reading the primary key definition: %v", err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback(ctx)
	stmts := []string{"ALTER TABLE " + s.schema + ".idem_keys DROP CONSTRAINT idem_keys_pkey"}
	for i, def := range indexes {
		var name string
		if _, err := fmt.Sscanf(def, "CREATE INDEX %s ON", &name); err != nil {
			b.Fatalf("index definition %q: %v", def, err)
		}
		stmts = append(stmts, "DROP INDEX "+s.schema+"."+name)
		// A partitioned table's index is defined ON ONLY the parent; built
		// again ON the table, it is built on every partition too.
		def = strings.Replace(def, " ON ONLY ", " ON ", 1)
		indexes[i] = def
	}
	for _, sql := range stmts {
		if _, err := tx.Exec(ctx, sql); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	_, err = tx.Exec(ctx, `
INSERT INTO `+s.schema+`.idem_keys (scope, endpoint, key, fingerprint, state, token,
    locked_until, started_at, lease_expired_state, response_status, response_header,
    response_body, created_at, updated_at, expires_at)
SELECT CASE WHEN $3 THEN 'tenant-' || (i % 1000) ELSE 'tenant' END, 'POST /v1/payments', md5(i::text || 'k'), md5(i::text) || md5(i::text), st,
    md5(i::text || 't'), $1::timestamptz, $1::timestamptz, 'unknown',
    CASE WHEN st = 'completed' THEN 201 END,
    CASE WHEN st = 'completed' THEN '{"Content-Type":["application/json"]}'::jsonb END,
    CASE WHEN st = 'completed' THEN '{"id":"pay_0123456789","status":"succeeded"}'::bytea END,
    $1::timestamptz, $1::timestamptz,
    $1::timestamptz + (i % 86400) * interval '1 second'
FROM generate_series(1, $2::int) AS i,
    LATERAL (SELECT CASE WHEN i % 20 = 0 THEN 'unknown' WHEN i % 20 = 1 THEN 'released'
                         ELSE 'completed' END AS st) AS s`, time.Now(), rows, s.cfg.Partitions > 0)
	if err != nil {
		b.Fatalf("inserting %d records: %v", rows, err)
	}
	stmts = []string{"ALTER TABLE " + s.schema + ".idem_keys ADD CONSTRAINT idem_keys_pkey " + pkey}
	for _, sql := range append(stmts, indexes...) {
		if _, err := tx.Exec(ctx, sql); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE "+s.schema+".idem_keys"); err != nil {
		b.Fatal(err)
	}
	b.Logf("filled %d records in %v", rows, time.Since(start).Round(time.Second))
}
