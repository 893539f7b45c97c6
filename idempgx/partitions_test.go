package idempgx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// newPartitionedStore returns a store migrated with Partitions n, in a
// schema of its own dropped when the test ends.
func newPartitionedStore(t testing.TB, now func() time.Time, n int) *Store {
	t.Helper()
	u := newUnmigratedStore(t, now)
	cfg := u.cfg
	cfg.Partitions = n
	s := New(u.pool, &cfg)
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate with %d partitions: %v", n, err)
	}
	return s
}

// TestPartitionedTable checks the layout Partitions creates (a table
// partitioned by hash of scope, its partitions, the indexes on each), that
// records of many scopes spread over the partitions, and that the reaper,
// working partition by partition, deletes every expired record of every
// partition and nothing else, in batches.
func TestPartitionedTable(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s := newPartitionedStore(t, clock, 4)
	ctx := t.Context()
	parts, err := s.Partitions(ctx)
	if err != nil || len(parts) != 4 {
		t.Fatalf("Partitions = %q, %v; want 4", parts, err)
	}
	var strategy string
	if err := s.pool.QueryRow(ctx, `SELECT partstrat::text FROM pg_partitioned_table WHERE partrelid = to_regclass($1)`,
		s.schema+".idem_keys").Scan(&strategy); err != nil || strategy != "h" {
		t.Fatalf("partition strategy %q, %v; want h (hash)", strategy, err)
	}
	countIndexes := func(table string) int {
		t.Helper()
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE format('%I.%I', schemaname, tablename) = $1`, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Every index of the table, those of later migrations included, is on
	// every partition.
	want := countIndexes(fmt.Sprintf("%s.idem_keys", s.cfg.Schema))
	if want < 3 {
		t.Fatalf("the partitioned table has %d indexes; want at least 3 (primary key, reap, sweep)", want)
	}
	for _, p := range parts {
		if n := countIndexes(p); n != want {
			t.Errorf("%s has %d indexes; want the table's %d", p, n, want)
		}
	}

	const scopes, perScope = 40, 5
	for i := range scopes {
		for j := range perScope {
			id := idemstore.Identity{Scope: fmt.Sprintf("tenant-%d", i), Endpoint: "POST /pay", Key: fmt.Sprint(j)}
			ttl := time.Hour
			if j%2 == 0 {
				ttl = time.Minute // expired below
			}
			res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: ttl})
			if err != nil || !res.Reserved {
				t.Fatalf("reserve: %+v, %v", res, err)
			}
			if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t", Response: &idemstore.Response{Status: 201}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	expired := scopes * ((perScope + 1) / 2)
	for _, p := range parts {
		var n int
		if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+p).Scan(&n); err != nil || n == 0 {
			t.Errorf("%s holds %d records, %v; want some of the %d scopes", p, n, err, scopes)
		}
	}

	now = now.Add(10 * time.Minute)
	total, calls := 0, 0
	for {
		n, err := s.KeyReap(ctx, &idemstore.ReapParams{Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		if n > 7 {
			t.Fatalf("KeyReap deleted %d records with Limit 7", n)
		}
		total += n
		calls++
		if n == 0 {
			break
		}
	}
	if total != expired {
		t.Fatalf("reaped %d records in %d calls; want the %d expired", total, calls, expired)
	}
	var left int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.schema+".idem_keys").Scan(&left); err != nil || left != scopes*perScope-expired {
		t.Fatalf("%d records left, %v; want %d", left, err, scopes*perScope-expired)
	}
}

// TestPartitionsRefused: a count out of range is refused before anything
// is created.
func TestPartitionsRefused(t *testing.T) {
	t.Parallel()
	u := newUnmigratedStore(t, time.Now)
	cfg := u.cfg
	cfg.Partitions = MaxPartitions + 1
	if _, err := New(u.pool, &cfg).Migrate(t.Context()); err == nil {
		t.Fatal("Migrate with too many partitions succeeded")
	}
}
