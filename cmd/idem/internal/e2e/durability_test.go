package e2e

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv/pgproc"
)

// The tests of this file are the PostgreSQL rows of the README's "What each
// store can lose" table: each completes keys on a private cluster, crashes
// the server (pg_ctl stop -m immediate) and counts the completed keys whose
// record is gone, whose retry would run the operation again.

const durabilityKeys = 40

// TestDurabilityPostgresAsyncCommit: with synchronous_commit=off a commit
// returns before its WAL is written; what the WAL writer had not yet written
// when the server crashes is lost, and those keys would run again. The WAL
// writer is held back (wal_writer_delay=10s, no background writer, no
// autovacuum, no timed checkpoint) so that the window is still open when the
// test crashes the server.
func TestDurabilityPostgresAsyncCommit(t *testing.T) {
	t.Parallel()
	gone, reserved := crashAfterCompletions(t, "off")
	t.Logf("synchronous_commit=off: of %d completed keys, %d gone (would run again), %d back to their reservation",
		durabilityKeys, gone, reserved)
	// The WAL writer writes every full WAL page as soon as it is full: what
	// is lost is the commits of the last, partial page. It always holds the
	// last completion; whether it holds the last reservation too depends on
	// where the page boundary falls.
	if gone+reserved == 0 {
		t.Fatalf("no completion lost with synchronous_commit=off; want those whose commits the WAL writer had not written")
	}
}

// TestDurabilityPostgresSyncCommit is the control of
// TestDurabilityPostgresAsyncCommit: the same cluster settings and crash with
// synchronous_commit=on lose nothing that was acknowledged.
func TestDurabilityPostgresSyncCommit(t *testing.T) {
	t.Parallel()
	if gone, reserved := crashAfterCompletions(t, "on"); gone != 0 || reserved != 0 {
		t.Fatalf("of %d completed keys, %d gone and %d back to their reservation with synchronous_commit=on; want none",
			durabilityKeys, gone, reserved)
	}
}

// crashAfterCompletions starts a private cluster with the given
// synchronous_commit, completes durabilityKeys keys through an idempgx
// store, crashes the server, starts it again and returns how many of the
// completed records are gone and how many are back to their reservation.
func crashAfterCompletions(t *testing.T, synchronousCommit string) (gone, reserved int) {
	t.Helper()
	// Only the WAL writer's timer (10 s, its maximum) or a full WAL page
	// writes asynchronous commits: nothing else flushes the WAL while the
	// keys are completed and the server crashed.
	c := pgproc.Start(t, "synchronous_commit = "+synchronousCommit, "wal_writer_delay = 10s", "wal_writer_flush_after = 1GB",
		"bgwriter_lru_maxpages = 0", "autovacuum = off", "checkpoint_timeout = 1h", "max_wal_size = 1GB")

	ctx := t.Context()
	store := pgStoreOn(t, c)
	if _, err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	p := openPool(t, c)
	var setting string
	if err := p.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting); err != nil || setting != synchronousCommit {
		t.Fatalf("synchronous_commit is %q (%v), want %q", setting, err, synchronousCommit)
	}
	// The schema is on disk before the keys are completed.
	if _, err := p.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}

	identity := func(i int) idemstore.Identity {
		return idemstore.Identity{Scope: "s", Endpoint: "POST /pay", Key: fmt.Sprintf("k%d", i)}
	}
	var walStart int64
	if err := p.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").Scan(&walStart); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range durabilityKeys {
		id := identity(i)
		res, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: "t1",
			Lease: time.Minute, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown})
		if err != nil || !res.Reserved {
			t.Fatalf("reserving %s: %+v, %v", id.Key, res, err)
		}
		if err := store.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t1",
			Response: &idemstore.Response{Status: 201, Body: []byte(id.Key)}}); err != nil {
			t.Fatalf("completing %s: %v", id.Key, err)
		}
	}
	var walEnd int64
	if err := p.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").Scan(&walEnd); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes of WAL for %d keys", walEnd-walStart, durabilityKeys)
	c.Crash()
	if d := time.Since(start); d > 8*time.Second {
		// The WAL writer's timer may have run: the loss would be a matter of timing.
		t.Fatalf("completing the keys and crashing took %v; want well under wal_writer_delay (10 s)", d)
	}
	c.Start()

	after := pgStoreOn(t, c)
	gone, reserved = 0, 0
	for i := range durabilityKeys {
		id := identity(i)
		rec, err := after.KeyGet(ctx, id)
		switch {
		case errors.Is(err, idemstore.ErrNotFound):
			gone++ // a retry runs the operation again
		case err != nil:
			t.Fatalf("reading %s after the crash: %v", id.Key, err)
		case rec.State == idemstore.StateInProgress && rec.Response == nil:
			reserved++ // the reservation survived, its completion did not
		case rec.State != idemstore.StateCompleted || rec.Response == nil || string(rec.Response.Body) != id.Key:
			t.Errorf("%s after the crash: %+v; want its completion, its reservation or nothing", id.Key, rec)
		}
	}
	return gone, reserved
}

// openPool returns a small pool on the cluster, closed when the test ends.
func openPool(t *testing.T, c *pgproc.Cluster) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// pgStoreOn returns an idempgx store in schema idem of the cluster, on a
// pool of its own.
func pgStoreOn(t *testing.T, c *pgproc.Cluster) *idempgx.Store {
	t.Helper()
	s := idempgx.New(openPool(t, c), &idempgx.Config{Schema: "idem", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(s.Close)
	return s
}
