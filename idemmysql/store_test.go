package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/testenv"
)

const (
	fp1   = "f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1"
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

func (b *bundle) get(t *testing.T) *idemstore.Record {
	t.Helper()
	rec, err := b.store.KeyGet(b.ctx, testID)
	if err != nil {
		t.Fatalf("KeyGet: %v", err)
	}
	return rec
}

func sampleResponse() *idemstore.Response {
	return &idemstore.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Link": {"</a>", "</b>"}},
		Body:   []byte(`{"id":"pay_1"}`),
	}
}

// requireUnlocked fails unless another connection can lock id's row at
// once: nothing holds a lock on it (and so nothing wrote it).
func (b *bundle) requireUnlocked(t *testing.T, what string, id idemstore.Identity) {
	t.Helper()
	tx, err := b.store.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var n int
	err = tx.QueryRowContext(b.ctx, "SELECT count(*) FROM (SELECT 1 FROM idem_keys WHERE scope = ? AND endpoint = ? AND idem_key = ? FOR UPDATE NOWAIT) AS l",
		[]byte(id.Scope), []byte(id.Endpoint), []byte(id.Key)).Scan(&n)
	if err != nil {
		t.Fatalf("%s: the row is locked: %v", what, err)
	}
}

// TestReplayWritesNothing checks SPEC section 7: the replay of a completed
// key is one round trip that neither writes nor locks the row. The reserve
// statements run in a transaction that stays open while another
// connection locks the row with NOWAIT: a write, or a lock, would make that
// fail. The same probe sees the lock of a takeover.
func TestReplayWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if !b.reserve(t, reserveParams("t1", idemstore.StateUnknown)).Reserved {
		t.Fatal("first reserve did not reserve")
	}
	if err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()}); err != nil {
		t.Fatal(err)
	}
	// inTx runs st for p in an open transaction and probes the row.
	inTx := func(st stmt, p *idemstore.ReserveParams, wantLocked bool) *idemstore.Record {
		t.Helper()
		tx, err := b.store.db.BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		now := b.store.now()
		a := idArgs(p.Identity, now)
		a["fingerprint"], a["token"] = bin(p.Fingerprint), bin(p.Token)
		a["locked_until"], a["expires_at"] = at(now.Add(p.Lease)), at(now.Add(p.TTL))
		a["les"], a["ttl"] = string(p.LeaseExpiredState), p.TTL.Microseconds()
		rec, err := b.store.queryRecord(b.ctx, tx, st, a)
		if err != nil {
			t.Fatal(err)
		}
		probe, err := b.store.db.BeginTx(b.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer probe.Rollback()
		var n int
		err = probe.QueryRowContext(b.ctx, "SELECT count(*) FROM (SELECT 1 FROM idem_keys WHERE scope = ? AND endpoint = ? AND idem_key = ? FOR UPDATE NOWAIT) AS l",
			bin(p.Scope), bin(p.Endpoint), bin(p.Key)).Scan(&n)
		if locked := err != nil; locked != wantLocked {
			t.Fatalf("%s: row locked %v (%v), want %v", p.Token, locked, err, wantLocked)
		}
		return rec
	}
	for i := range 3 {
		rec := inTx(qReserve, reserveParams(fmt.Sprint("replay-", i), idemstore.StateUnknown), false)
		if rec.State != idemstore.StateCompleted || rec.Token != "t1" || rec.Response == nil || string(rec.Response.Body) != `{"id":"pay_1"}` {
			t.Fatalf("replay %d: %+v, want the completion of t1", i, rec)
		}
	}
	// The reclaim statement too reads a completed record without writing.
	inTx(qReclaim, reserveParams("replay-reclaim", idemstore.StateUnknown), false)
	// A live lease in progress is read without a write as well; a released
	// record is taken over by reclaim, which the probe sees locked.
	other := reserveParams("t2", idemstore.StateUnknown)
	other.Key = "key-2"
	b.reserve(t, other)
	dup := *other
	dup.Token = "t3"
	if rec := inTx(qReserve, &dup, false); rec.Token != "t2" {
		t.Fatalf("duplicate of a live lease saw token %s, want t2", rec.Token)
	}
	if err := b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: other.Identity, Token: "t2"}); err != nil {
		t.Fatal(err)
	}
	if rec := inTx(qReserve, &dup, false); rec.State != idemstore.StateReleased {
		t.Fatalf("reserve statement on a released record: %s, want it left released", rec.State)
	}
	if rec := inTx(qReclaim, &dup, true); rec.Token != "t3" || rec.State != idemstore.StateInProgress {
		t.Fatalf("takeover of a released record: %s %s, want in_progress t3", rec.State, rec.Token)
	}
	b.requireUnlocked(t, "after the replays", testID)
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
	testenv.Race(n, func(i int) {
		results[i], errs[i] = b.store.KeyReserve(b.ctx, reserveParams(fmt.Sprintf("race-%d-%d", round, i), les))
	})
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

// TestReserveRace has 300 goroutines on one pool race for a new key, a
// released key and an expired lease: each time exactly one wins and every
// other sees the winner's record, and no deadlock reaches a caller.
func TestReserveRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 300
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

// TestManyKeysRace has 200 goroutines reserve and complete 20 keys each, all
// at once, in an order of their own: new keys next to each other in the
// primary key is where REPEATABLE READ's gap locks deadlock.
func TestManyKeysRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const goroutines, keys = 200, 20
	wins := make([][]string, goroutines)
	errs := make([]error, goroutines)
	testenv.Race(goroutines, func(g int) {
		for i := range keys {
			p := reserveParams(fmt.Sprintf("g%d-%d", g, i), idemstore.StateUnknown)
			p.Key = fmt.Sprintf("key-%02d", (i*7+g)%keys)
			res, err := b.store.KeyReserve(b.ctx, p)
			if err != nil {
				errs[g] = err
				return
			}
			if res.Reserved {
				wins[g] = append(wins[g], p.Key)
				err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: p.Identity, Token: p.Token, Response: sampleResponse()})
				if err != nil {
					errs[g] = err
					return
				}
			}
		}
	})
	won := map[string]int{}
	for g := range goroutines {
		if errs[g] != nil {
			t.Fatalf("goroutine %d: %v", g, errs[g])
		}
		for _, k := range wins[g] {
			won[k]++
		}
	}
	for i := range keys {
		if k := fmt.Sprintf("key-%02d", i); won[k] != 1 {
			t.Errorf("%s won %d times, want once", k, won[k])
		}
	}
}

// TestLockWaitTimeoutRetried: a completion that waits longer than
// innodb_lock_wait_timeout for a row another transaction holds gets error
// 1205, and runs again within its context: it completes once the row is
// free instead of failing the request.
func TestLockWaitTimeoutRetried(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t) + "?innodb_lock_wait_timeout=1"
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	s, err := Open(t.Context(), dsn, &Config{Now: clock.Now, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	b := &bundle{store: s, clock: clock, ctx: t.Context()}
	b.reserve(t, reserveParams("t1", idemstore.StateUnknown))

	tx, err := s.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(b.ctx, "SELECT 1 FROM idem_keys WHERE scope = 'tenant-a' AND endpoint = 'POST /v1/payments' AND idem_key = 'key-1' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	// The raw statement fails with 1205 while the row is held...
	var me *mysql.MySQLError
	_, err = s.db.ExecContext(b.ctx, "UPDATE idem_keys SET updated_at = updated_at WHERE idem_key = 'key-1'")
	if !errors.As(err, &me) || me.Number != errLockWaitTimeout {
		t.Fatalf("update of a held row: %v, want error 1205", err)
	}
	// ...and the store's completion runs again until it is free.
	var released atomic.Bool
	go func() {
		time.Sleep(1500 * time.Millisecond) // past one lock wait timeout
		released.Store(true)
		tx.Rollback()
	}()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()}); err != nil {
		t.Fatalf("KeyComplete while the row was held: %v", err)
	}
	if !released.Load() {
		t.Fatal("KeyComplete returned before the row was released")
	}
	if rec := b.get(t); rec.State != idemstore.StateCompleted {
		t.Fatalf("state %s, want completed", rec.State)
	}
}

// TestRetry: a deadlock or a lock wait timeout runs the call again, other
// errors do not, and the call's deadline bounds the runs.
func TestRetry(t *testing.T) {
	t.Parallel()
	s := New(nil, nil)
	deadlock := &mysql.MySQLError{Number: errDeadlock, Message: "Deadlock found"}
	runs := 0
	err := s.retry(t.Context(), func() error {
		runs++
		if runs < 3 {
			return deadlock
		}
		return nil
	})
	if err != nil || runs != 3 {
		t.Fatalf("retry = %v after %d runs, want nil after 3", err, runs)
	}
	runs = 0
	other := &mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}
	if err := s.retry(t.Context(), func() error { runs++; return other }); err != other || runs != 1 {
		t.Fatalf("retry of error 1062 = %v after %d runs, want it after 1", err, runs)
	}
	runs = 0
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := s.retry(ctx, func() error { runs++; return deadlock }); err != deadlock {
		t.Fatalf("retry until the deadline = %v, want the deadlock", err)
	}
	if d := time.Since(start); d > time.Second || runs < 2 || runs >= retryMaxTries {
		t.Fatalf("%d runs in %v, want a few within the 50ms deadline", runs, d)
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
			les = idemstore.StateReleased
		}
		p := reserveParams(fmt.Sprintf("t%d", i), les)
		p.Key = fmt.Sprintf("key-%d", i)
		b.reserve(t, p)
	}
	tx, err := b.store.db.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	// By the whole primary key: a scan would lock every row it reads.
	if _, err := tx.ExecContext(b.ctx, "SELECT 1 FROM idem_keys WHERE scope = 'tenant-a' AND endpoint = 'POST /v1/payments' AND idem_key = 'key-0' FOR UPDATE"); err != nil {
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
		if err := b.store.KeyResolve(ctx, &idemstore.ResolveParams{Identity: r.Identity, Token: r.Token, To: idemstore.StateReleased}); err != nil {
			t.Fatal(err)
		}
	}
	b.clock.Advance(ttl)
	if n, err := b.store.KeyReap(ctx, &idemstore.ReapParams{Limit: 1}); err != nil || n != 1 {
		t.Fatalf("KeyReap(limit 1) = %d, %v; want 1", n, err)
	}
	if n, err := b.store.KeyReap(ctx, &idemstore.ReapParams{}); err != nil || n != 1 {
		t.Fatalf("KeyReap = %d, %v; want the 1 unlocked record left", n, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.KeyReap(ctx, &idemstore.ReapParams{}); err != nil || n != 1 {
		t.Fatalf("KeyReap after the lock = %d, %v; want 1", n, err)
	}
}

// TestIdentityColumnsAreBinary: the columns that identify and fence a
// record compare byte for byte, whatever the server's default collation.
func TestIdentityColumnsAreBinary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rows, err := b.store.db.QueryContext(b.ctx, `SELECT column_name, data_type FROM information_schema.columns
		WHERE table_schema = DATABASE() AND table_name = 'idem_keys'
		  AND column_name IN ('scope', 'endpoint', 'idem_key', 'fingerprint', 'token', 'state')`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			t.Fatal(err)
		}
		if typ != "varbinary" {
			t.Errorf("column %s is %s, want varbinary", name, typ)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != 6 {
		t.Fatalf("%d columns (%v), want 6", n, err)
	}
}

// TestSessionIsReadCommitted: every connection of NewConnector runs at READ
// COMMITTED, whatever the server's default.
func TestSessionIsReadCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conns := make([]*sql.Conn, 3)
	for i := range conns {
		c, err := b.store.db.Conn(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
		var level string
		// @@tx_isolation on MariaDB, @@transaction_isolation on MySQL 8.
		err = c.QueryRowContext(b.ctx, "SELECT @@SESSION.tx_isolation").Scan(&level)
		if err != nil {
			err = c.QueryRowContext(b.ctx, "SELECT @@SESSION.transaction_isolation").Scan(&level)
		}
		if err != nil || level != "READ-COMMITTED" {
			t.Fatalf("connection %d: isolation %q (%v), want READ-COMMITTED", i, level, err)
		}
	}
}

// TestReserveRefusesLongValues: a value longer than its column is refused,
// never cut into another record's identity.
func TestReserveRefusesLongValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := reserveParams("t1", idemstore.StateUnknown)
	for _, tt := range []struct {
		field *string
		max   int
	}{{&p.Scope, maxScopeLen}, {&p.Endpoint, maxEndpointLen}, {&p.Key, maxKeyLen}} {
		orig := *tt.field
		*tt.field = strings.Repeat("x", tt.max+1)
		if _, err := b.store.KeyReserve(b.ctx, p); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than the %d", tt.max)) {
			t.Fatalf("KeyReserve of a %d-byte identity part: %v, want a refusal", tt.max+1, err)
		}
		*tt.field = orig
	}
	p.Scope = strings.Repeat("s", maxScopeLen)
	p.Endpoint = strings.Repeat("e", maxEndpointLen)
	p.Key = strings.Repeat("k", maxKeyLen)
	if res := b.reserve(t, p); !res.Reserved || res.Record.Key != p.Key || res.Record.Endpoint != p.Endpoint {
		t.Fatalf("KeyReserve of identity parts at their limits: %+v", res)
	}
	if rec, err := b.store.KeyGet(b.ctx, p.Identity); err != nil || rec.Token != p.Token {
		t.Fatalf("KeyGet of identity parts at their limits: %+v, %v", rec, err)
	}
}
