package idempgx

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

const (
	fp1   = "f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1"
	fp2   = "f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2"
	lease = 30 * time.Second
	ttl   = 24 * time.Hour
)

var testID = idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "key-1"}

type bundle struct {
	store *Store
	clock *idemtest.Clock
	ctx   context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	return &bundle{store: newTestStore(t, clock.Now), clock: clock, ctx: t.Context()}
}

func reserveParams(token string, les idemstore.State) *idemstore.ReserveParams {
	return &idemstore.ReserveParams{
		Identity: testID, Fingerprint: fp1, Token: token,
		Lease: lease, TTL: ttl, LeaseExpiredState: les,
	}
}

func (b *bundle) reserve(t *testing.T, p *idemstore.ReserveParams) *idemstore.ReserveResult {
	t.Helper()
	res, err := b.store.KeyReserve(b.ctx, p)
	if err != nil {
		t.Fatalf("KeyReserve: %v", err)
	}
	return res
}

func sampleResponse() *idemstore.Response {
	return &idemstore.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Link": {"</a>", "</b>"}},
		Body:   []byte(`{"id":"pay_1"}`),
	}
}

// rowVersion returns the record's xmin and xmax: a write or a row lock
// changes one of them.
func (b *bundle) rowVersion(t *testing.T, id idemstore.Identity) string {
	t.Helper()
	var xmin, xmax string
	err := b.store.pool.QueryRow(b.ctx,
		"SELECT xmin::text, xmax::text FROM "+b.store.schema+".idem_keys WHERE scope = $1 AND endpoint = $2 AND key = $3",
		id.Scope, id.Endpoint, id.Key).Scan(&xmin, &xmax)
	if err != nil {
		t.Fatalf("reading row version: %v", err)
	}
	return xmin + "/" + xmax
}

// reserveAssignsXID runs sql, the reserve (with find) or the reclaim
// statement, in a transaction and reports
// whether it got a transaction id, that is whether it wrote anything (a
// tuple or a row lock). A transaction without one commits without a WAL
// flush.
func (b *bundle) reserveAssignsXID(t *testing.T, sql string, p *idemstore.ReserveParams) (reserved bool, assigned bool) {
	t.Helper()
	tx, err := b.store.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	now := b.store.now()
	var rs recordScan
	args := []any{p.Scope, p.Endpoint, p.Key, p.Token, p.Fingerprint,
		now, now.Add(p.Lease), now.Add(p.TTL), string(p.LeaseExpiredState), p.TTL}
	if sql == b.store.q.reserve {
		// The reserve statement and, in the same transaction, find, which
		// returns a row only when reserve inserted none.
		tag, xerr := tx.Exec(b.ctx, sql, args...)
		reserved = xerr == nil && tag.RowsAffected() == 1
		err = xerr
		if err == nil && !reserved {
			err = tx.QueryRow(b.ctx, b.store.q.find, args[:reserveFindArgs]...).Scan(rs.dest()...)
		}
	} else {
		err = tx.QueryRow(b.ctx, sql, args...).Scan(append([]any{&reserved}, rs.dest()...)...)
	}
	if err != nil {
		t.Fatalf("reserve statement: %v", err)
	}
	var xid *string
	if err := tx.QueryRow(b.ctx, "SELECT pg_current_xact_id_if_assigned()::text").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	return reserved, xid != nil
}

// TestReplayWritesNothing checks SPEC section 7: the replay of a completed
// key is one round trip that neither writes nor locks the row.
func TestReplayWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.reserve(t, reserveParams("t1", idemstore.StateUnknown))
	if !res.Reserved {
		t.Fatal("first reserve did not reserve")
	}
	err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()})
	if err != nil {
		t.Fatal(err)
	}
	before := b.rowVersion(t, testID)
	for i := range 5 {
		res := b.reserve(t, reserveParams(fmt.Sprintf("replay-%d", i), idemstore.StateUnknown))
		if res.Reserved || res.Record.State != idemstore.StateCompleted || res.Record.Response == nil {
			t.Fatalf("replay %d: reserved %v state %s, want the completed record", i, res.Reserved, res.Record.State)
		}
		if res.Record.Response.Status != http.StatusCreated || string(res.Record.Response.Body) != `{"id":"pay_1"}` {
			t.Fatalf("replay %d: response %+v", i, res.Record.Response)
		}
	}
	if after := b.rowVersion(t, testID); after != before {
		t.Fatalf("replays changed the row version from %s to %s: they wrote or locked it", before, after)
	}
	for _, sql := range []string{b.store.q.reserve, b.store.q.reclaim} {
		if _, assigned := b.reserveAssignsXID(t, sql, reserveParams("replay-tx", idemstore.StateUnknown)); assigned {
			t.Fatal("a replay got a transaction id: it wrote something")
		}
	}
	// The same probe sees a write when there is one: a live in_progress
	// record is read without writing, a released one is taken over by the
	// reclaim statement (the reserve statement leaves it to reclaim).
	other := idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "key-2"}
	p := reserveParams("t2", idemstore.StateUnknown)
	p.Identity = other
	b.reserve(t, p)
	p.Token = "t3"
	for _, sql := range []string{b.store.q.reserve, b.store.q.reclaim} {
		if reserved, assigned := b.reserveAssignsXID(t, sql, p); reserved || assigned {
			t.Fatalf("duplicate of a live lease: reserved %v, xid assigned %v; want neither", reserved, assigned)
		}
	}
	if err := b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: other, Token: "t2"}); err != nil {
		t.Fatal(err)
	}
	if reserved, assigned := b.reserveAssignsXID(t, b.store.q.reserve, p); reserved || assigned {
		t.Fatalf("reserve statement on a released record: reserved %v, xid assigned %v; want neither", reserved, assigned)
	}
	if reserved, assigned := b.reserveAssignsXID(t, b.store.q.reclaim, p); !reserved || !assigned {
		t.Fatalf("takeover of a released record: reserved %v, xid assigned %v; want both", reserved, assigned)
	}
}

// raceRounds numbers the calls of raceReserve, so that every attempt has a
// token of its own, as in production: a contender of one round whose token
// was the winner's of the round before would read that record as its own.
var raceRounds atomic.Int64

// raceReserve has n goroutines reserve testID with fingerprint fp1 at once.
func (b *bundle) raceReserve(t *testing.T, n int, les idemstore.State) []*idemstore.ReserveResult {
	t.Helper()
	round := raceRounds.Add(1)
	results := make([]*idemstore.ReserveResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = b.store.KeyReserve(b.ctx, reserveParams(fmt.Sprintf("race-%d-%d", round, i), les))
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("KeyReserve #%d: %v", i, err)
		}
	}
	return results
}

func requireOneWinner(t *testing.T, results []*idemstore.ReserveResult) *idemstore.Record {
	t.Helper()
	var winner *idemstore.Record
	for i, res := range results {
		if !res.Reserved {
			continue
		}
		if winner != nil {
			t.Fatalf("#%d also reserved (winner token %s, this one %s)", i, winner.Token, res.Record.Token)
		}
		winner = res.Record
	}
	if winner == nil {
		t.Fatal("nobody reserved")
	}
	for i, res := range results {
		if !res.Reserved && (res.Record.State != idemstore.StateInProgress || res.Record.Token != winner.Token) {
			t.Fatalf("loser #%d saw %s token %s, want in_progress token %s", i, res.Record.State, res.Record.Token, winner.Token)
		}
	}
	return winner
}

// TestReserveRace has 200 goroutines on one pool race for a new key, a
// released key and an expired lease: each time exactly one wins and every
// other sees the winner's record.
func TestReserveRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 200
	w := requireOneWinner(t, b.raceReserve(t, n, idemstore.StateReleased))
	if w.Attempts != 1 {
		t.Fatalf("new key: attempts %d, want 1", w.Attempts)
	}

	if err := b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: testID, Token: w.Token}); err != nil {
		t.Fatal(err)
	}
	w = requireOneWinner(t, b.raceReserve(t, n, idemstore.StateReleased))
	if w.Attempts != 2 {
		t.Fatalf("released key: attempts %d, want 2", w.Attempts)
	}

	b.clock.Advance(lease)
	w = requireOneWinner(t, b.raceReserve(t, n, idemstore.StateReleased))
	if w.Attempts != 3 {
		t.Fatalf("expired lease: attempts %d, want 3", w.Attempts)
	}
}

// TestReserveLapseRace has 200 goroutines find an expired lease that turns
// unknown: none reserves and all see it unknown.
func TestReserveLapseRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.reserve(t, reserveParams("t1", idemstore.StateUnknown))
	b.clock.Advance(lease)
	for i, res := range b.raceReserve(t, 200, idemstore.StateUnknown) {
		if res.Reserved || res.Record.State != idemstore.StateUnknown || res.Record.Token != "t1" {
			t.Fatalf("#%d: reserved %v state %s token %s, want unknown t1", i, res.Reserved, res.Record.State, res.Record.Token)
		}
	}
}

func TestCompleteTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.reserve(t, reserveParams("t1", idemstore.StateReleased))
	complete := &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()}

	// Rolled back: the record stays in progress.
	tx, err := b.store.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.CompleteTx(b.ctx, tx, complete); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if rec := b.get(t); rec.State != idemstore.StateInProgress || rec.Response != nil {
		t.Fatalf("after rollback: state %s, response %v; want in_progress without one", rec.State, rec.Response)
	}

	// Another token: ErrLeaseLost, and the transaction stays usable.
	err = pgx.BeginFunc(b.ctx, b.store.pool, func(tx pgx.Tx) error {
		err := b.store.CompleteTx(b.ctx, tx, &idemstore.CompleteParams{Identity: testID, Token: "other", Response: sampleResponse()})
		if !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("CompleteTx with another token: %v, want ErrLeaseLost", err)
		}
		_, err = tx.Exec(b.ctx, "SELECT 1")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	// Committed: completed with the response.
	err = pgx.BeginFunc(b.ctx, b.store.pool, func(tx pgx.Tx) error {
		return b.store.CompleteTx(b.ctx, tx, complete)
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := b.get(t)
	if rec.State != idemstore.StateCompleted || rec.Response == nil || rec.Response.Status != http.StatusCreated {
		t.Fatalf("after commit: state %s, response %+v", rec.State, rec.Response)
	}
}

// TestCompleteTxBlocksTakeover: while a transaction that completes the key
// is open, a retry that finds the lease expired (turning released) waits for
// it, and after the commit replays the completion instead of taking over.
func TestCompleteTxBlocksTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.reserve(t, reserveParams("t1", idemstore.StateReleased))
	tx, err := b.store.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if err := b.store.CompleteTx(b.ctx, tx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()}); err != nil {
		t.Fatal(err)
	}
	var pid uint32
	if err := tx.QueryRow(b.ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(lease) // the lease expired while the transaction runs

	type result struct {
		res *idemstore.ReserveResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := b.store.KeyReserve(b.ctx, reserveParams("t2", idemstore.StateReleased))
		done <- result{res, err}
	}()
	b.waitBlockedBy(t, pid)
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Reserved || r.res.Record.State != idemstore.StateCompleted || r.res.Record.Token != "t1" {
		t.Fatalf("retry after the commit: reserved %v state %s token %s, want the completion of t1",
			r.res.Reserved, r.res.Record.State, r.res.Record.Token)
	}
}

// waitBlockedBy waits until some backend waits for a lock held by pid.
func (b *bundle) waitBlockedBy(t *testing.T, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var blocked bool
		err := b.store.pool.QueryRow(b.ctx,
			"SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))",
			int32(pid)).Scan(&blocked)
		if err != nil {
			t.Fatal(err)
		}
		if blocked {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no backend blocked on the open transaction within 10s")
}

func (b *bundle) get(t *testing.T) *idemstore.Record {
	t.Helper()
	rec, err := b.store.KeyGet(b.ctx, testID)
	if err != nil {
		t.Fatalf("KeyGet: %v", err)
	}
	return rec
}

func TestCheckpointTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	orig := b.reserve(t, reserveParams("t1", idemstore.StateReleased)).Record
	b.clock.Advance(time.Second)

	tx, err := b.store.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.CheckpointTx(b.ctx, tx, testID, "t1", "charged"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if rec := b.get(t); rec.RecoveryPoint != "" {
		t.Fatalf("after rollback: recovery point %q, want none", rec.RecoveryPoint)
	}

	err = pgx.BeginFunc(b.ctx, b.store.pool, func(tx pgx.Tx) error {
		return b.store.CheckpointTx(b.ctx, tx, testID, "t1", "charged")
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := b.get(t)
	if rec.RecoveryPoint != "charged" || rec.State != idemstore.StateInProgress ||
		!rec.LockedUntil.Equal(orig.LockedUntil) || !rec.UpdatedAt.Equal(b.clock.Now()) {
		t.Fatalf("after commit: %+v; want recovery point charged, the lease unchanged", rec)
	}

	err = pgx.BeginFunc(b.ctx, b.store.pool, func(tx pgx.Tx) error {
		return b.store.CheckpointTx(b.ctx, tx, testID, "other", "shipped")
	})
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("CheckpointTx with another token: %v, want ErrLeaseLost", err)
	}

	// A takeover after the lease expired resumes at the recovery point.
	b.clock.Advance(lease)
	res := b.reserve(t, reserveParams("t2", idemstore.StateReleased))
	if !res.Reserved || res.Record.RecoveryPoint != "charged" {
		t.Fatalf("takeover: reserved %v, recovery point %q; want the lease at charged", res.Reserved, res.Record.RecoveryPoint)
	}
	err = pgx.BeginFunc(b.ctx, b.store.pool, func(tx pgx.Tx) error {
		return b.store.CheckpointTx(b.ctx, tx, testID, "t1", "shipped")
	})
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("CheckpointTx by the attempt taken over: %v, want ErrLeaseLost", err)
	}
}

// TestBatchesSkipLockedRows: KeySweep and KeyReap pass over a row another
// transaction holds instead of waiting for it.
func TestBatchesSkipLockedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 3 {
		les := idemstore.StateUnknown
		if i == 0 {
			// Reapable once past its retention (never unknown), but locked.
			les = idemstore.StateReleased
		}
		p := reserveParams(fmt.Sprintf("t%d", i), les)
		p.Key = fmt.Sprintf("key-%d", i)
		b.reserve(t, p)
	}
	tx, err := b.store.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if _, err := tx.Exec(b.ctx, "SELECT 1 FROM "+b.store.schema+".idem_keys WHERE key = 'key-0' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}

	b.clock.Advance(lease)
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	swept, err := b.store.KeySweep(ctx, &idemstore.SweepParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(swept) != 2 {
		t.Fatalf("swept %d records, want the 2 unlocked ones", len(swept))
	}
	for _, r := range swept {
		if r.Key == "key-0" || r.State != idemstore.StateUnknown {
			t.Fatalf("swept %s to %s", r.Key, r.State)
		}
	}

	// Unknown records are never reaped: settle the swept ones first.
	for _, r := range swept {
		if err := b.store.KeyResolve(ctx, &idemstore.ResolveParams{Identity: r.Identity, Token: r.Token, To: idemstore.StateReleased}); err != nil {
			t.Fatal(err)
		}
	}
	b.clock.Advance(ttl)
	n, err := b.store.KeyReap(ctx, &idemstore.ReapParams{Limit: 1})
	if err != nil || n != 1 {
		t.Fatalf("KeyReap(limit 1) = %d, %v; want 1", n, err)
	}
	n, err = b.store.KeyReap(ctx, &idemstore.ReapParams{})
	if err != nil || n != 1 {
		t.Fatalf("KeyReap = %d, %v; want the 1 unlocked record left", n, err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	// The in-progress record past its retention goes too.
	if n, err := b.store.KeyReap(ctx, &idemstore.ReapParams{}); err != nil || n != 1 {
		t.Fatalf("KeyReap after the lock = %d, %v; want 1", n, err)
	}
}

// TestReserveRaceRepeatableRead: on a pool whose transactions default to
// REPEATABLE READ, the races that READ COMMITTED resolves by re-reading are
// serialization failures, which KeyReserve runs again.
func TestReserveRaceRepeatableRead(t *testing.T) {
	t.Parallel()
	cfg := testPool(t).Config()
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	s := newTestStore(t, clock.Now)
	b := &bundle{store: New(p, &Config{Schema: s.cfg.Schema, Now: clock.Now}), clock: clock, ctx: t.Context()}
	var isolation string
	if err := p.QueryRow(b.ctx, "SHOW transaction_isolation").Scan(&isolation); err != nil || isolation != "repeatable read" {
		t.Fatalf("isolation %q, %v; want repeatable read", isolation, err)
	}
	w := requireOneWinner(t, b.raceReserve(t, 50, idemstore.StateReleased))
	if err := b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: testID, Token: w.Token}); err != nil {
		t.Fatal(err)
	}
	requireOneWinner(t, b.raceReserve(t, 50, idemstore.StateReleased))
}

// TestTxStore: the business writes and the key's completion commit or roll
// back together through the idemstore.Tx the middleware uses, and a handler
// finds the pgx.Tx in its context.
func TestTxStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.store.pool.Exec(b.ctx, "CREATE TABLE "+b.store.schema+".payments (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	b.reserve(t, reserveParams("t1", idemstore.StateReleased))
	complete := &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()}

	// run is a transactional request: the handler writes through the
	// context's transaction, the middleware checkpoints and completes.
	run := func(commit bool) {
		t.Helper()
		var tx idemstore.Tx
		ctx := idemstore.ContextWithTx(b.ctx, func() (idemstore.Tx, error) {
			var err error
			if tx == nil {
				tx, err = b.store.KeyBeginTx(b.ctx)
			}
			return tx, err
		})
		ptx, err := TxFromContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ptx.Exec(ctx, "INSERT INTO "+b.store.schema+".payments VALUES ('pay_1')"); err != nil {
			t.Fatal(err)
		}
		if err := tx.KeyCheckpoint(ctx, &idemstore.CheckpointParams{Identity: testID, Token: "t1", RecoveryPoint: "charged"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.KeyComplete(ctx, complete); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatalf("Rollback (after Commit: %v): %v", commit, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatalf("second Rollback: %v", err)
		}
	}
	payments := func() int {
		t.Helper()
		var n int
		if err := b.store.pool.QueryRow(b.ctx, "SELECT count(*) FROM "+b.store.schema+".payments").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	run(false)
	if rec := b.get(t); rec.State != idemstore.StateInProgress || rec.RecoveryPoint != "" || payments() != 0 {
		t.Fatalf("after rollback: state %s, recovery point %q, %d payments; want in_progress, none, 0",
			rec.State, rec.RecoveryPoint, payments())
	}
	run(true)
	if rec := b.get(t); rec.State != idemstore.StateCompleted || rec.RecoveryPoint != "charged" || payments() != 1 {
		t.Fatalf("after commit: state %s, recovery point %q, %d payments; want completed, charged, 1",
			rec.State, rec.RecoveryPoint, payments())
	}
	if _, err := TxFromContext(b.ctx); !errors.Is(err, idemstore.ErrNoTx) {
		t.Fatalf("TxFromContext outside a transactional request: %v, want ErrNoTx", err)
	}
}
