package idempgx_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/internal/benchkit"
	"github.com/idem-dev/idem/internal/rawio"
	"github.com/idem-dev/idem/internal/testenv"
)

// The PostgreSQL benchmarks compare requests through the middleware on
// idempgx with a bare pgx loop that issues the same statements with the same
// arguments (the Raw benchmarks): the ratio of their throughputs is what the
// middleware and the store add to the database's own cost.
//
// The raw loop does not copy the SQL: a tracer on the pool records what the
// middleware sends for one request, and the loop sends exactly that text
// (so both share pgx's statement cache the same way), with the key, token
// and times replaced. Recording also checks the round trips SPEC section 7
// allows: a new key is two statements (reserve, complete), a replay one.
//
// Both sides run GOMAXPROCS×pgBenchParallelism goroutines (or
// IDEM_BENCH_PARALLELISM instead of pgBenchParallelism, see
// benchkit.Parallelism) on a pool of pgBenchConns connections, each in a
// fresh schema. Each Raw benchmark has
// two variants (see benchkit.RawVariants): the statements alone, and with the
// benchmark's HTTP scaffolding and the bare handler added.
//
//	go test -run '^$' -bench 'PG(NewKey|Replay)$' -count 6 .

const (
	pgBenchParallelism = 4
	pgBenchConns       = 10
)

// sqlRecorder is a pgx.QueryTracer and pgx.BatchTracer that records the
// statements sent while it is on.
type sqlRecorder struct {
	benchkit.Recorder[recordedStmt]
}

// recordedStmt is one statement sent on the pool.
type recordedStmt struct {
	sql  string
	args []any
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.Add(func() recordedStmt { return recordedStmt{sql: data.SQL, args: append([]any(nil), data.Args...)} })
	return ctx
}

func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *sqlRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (r *sqlRecorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	r.Add(func() recordedStmt { return recordedStmt{sql: data.SQL, args: append([]any(nil), data.Args...)} })
}

func (r *sqlRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// pgBench is a migrated idempgx store in a schema of its own and the
// middleware on it, twice: on pool, which the benchmarks measure, and on a
// pool whose statements can be recorded (rec, its tracer), which learn
// uses; a tracer costs the store a copy of every statement's arguments,
// which idem proxy's pools do not pay.
type pgBench struct {
	pool   *pgxpool.Pool
	rec    *sqlRecorder
	mw     http.Handler // on pool
	traced http.Handler // on the pool with rec
}

func newPGBench(b *testing.B) *pgBench { return newPGBenchWith(b, false) }

// newPGBenchWith is newPGBench with Config.GroupCommit set to groupCommit.
func newPGBenchWith(b *testing.B, groupCommit bool) *pgBench {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = pgBenchConns
	cfg.ConnConfig.DialFunc = rawio.Dial(cfg.ConnConfig.DialFunc)
	tcfg := cfg.Copy()
	rec := &sqlRecorder{}
	tcfg.ConnConfig.Tracer = rec
	ctx := context.Background()
	var r [6]byte
	rand.Read(r[:])
	schema := "idem_bench_" + hex.EncodeToString(r[:])
	open := func(cfg *pgxpool.Config) (*pgxpool.Pool, http.Handler) {
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		store := idempgx.New(pool, &idempgx.Config{Schema: schema, GroupCommit: groupCommit})
		b.Cleanup(func() {
			store.Close()
			pool.Close()
		})
		if _, err := store.Migrate(ctx); err != nil {
			b.Fatalf("Migrate: %v", err)
		}
		return pool, idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Logger: benchkit.DiscardLogger()}})(benchkit.Handler)
	}
	pool, mw := open(cfg)
	b.Cleanup(func() { // before the pools close: cleanups run last first
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			b.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	_, traced := open(tcfg)
	return &pgBench{pool: pool, rec: rec, mw: mw, traced: traced}
}

// serve sends one request with key through the middleware and checks the
// answer: 201, replayed or not.
func (p *pgBench) serve(b *testing.B, key, body string, replayed bool) {
	p.serveOn(b, p.mw, key, body, replayed)
}

// serveOn is serve through the middleware h.
func (p *pgBench) serveOn(b *testing.B, h http.Handler, key, body string, replayed bool) {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, benchkit.RequestBody(key, body))
	want := ""
	if replayed {
		want = "true"
	}
	if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != want {
		b.Fatalf("key %s: %d, %s=%q, want 201 and %q\n%s", key, w.Code, idem.HeaderReplayed, w.Header().Get(idem.HeaderReplayed), want, w.Body)
	}
}

// learn records the statements of one request with a new key and of one
// replay of it, and checks their number.
func (p *pgBench) learn(b *testing.B) (reserve, find, complete recordedStmt) {
	b.Helper()
	stmts := p.rec.Record(func() { p.serveOn(b, p.traced, "probe", benchkit.Body, false) })
	if len(stmts) != 3 {
		b.Fatalf("a new key sent %d statements, want 3 (reserve and find, complete)", len(stmts))
	}
	replay := p.rec.Record(func() { p.serveOn(b, p.traced, "probe", benchkit.Body, true) })
	if len(replay) != 2 || replay[0].sql != stmts[0].sql || replay[1].sql != stmts[1].sql {
		b.Fatalf("a replay sent %d statements, want 2 (reserve and find)", len(replay))
	}
	return stmts[0], stmts[1], stmts[2]
}

// BenchmarkMiddlewarePGNewKey sends requests with new keys through the
// middleware on PostgreSQL: reserve, handler, complete.
func BenchmarkMiddlewarePGNewKey(b *testing.B) {
	benchMiddlewarePGNewKey(b, newPGBench(b))
}

// BenchmarkMiddlewarePGNewKeyGroupCommit is BenchmarkMiddlewarePGNewKey
// with Config.GroupCommit.
func BenchmarkMiddlewarePGNewKeyGroupCommit(b *testing.B) {
	benchMiddlewarePGNewKey(b, newPGBenchWith(b, true))
}

func benchMiddlewarePGNewKey(b *testing.B, p *pgBench) {
	p.learn(b)
	var n atomic.Int64
	b.SetParallelism(benchkit.Parallelism(pgBenchParallelism))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			p.serve(b, "key-"+strconv.FormatInt(i, 10), benchkit.BodyN(i), false)
		}
	})
}

// BenchmarkMiddlewarePGReplay replays one completed key through the
// middleware on PostgreSQL: one reserve statement that reads the record.
func BenchmarkMiddlewarePGReplay(b *testing.B) {
	benchMiddlewarePGReplay(b, newPGBench(b))
}

// BenchmarkMiddlewarePGReplayGroupCommit is BenchmarkMiddlewarePGReplay
// with Config.GroupCommit.
func BenchmarkMiddlewarePGReplayGroupCommit(b *testing.B) {
	benchMiddlewarePGReplay(b, newPGBenchWith(b, true))
}

func benchMiddlewarePGReplay(b *testing.B, p *pgBench) {
	p.learn(b)
	b.SetParallelism(benchkit.Parallelism(pgBenchParallelism))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p.serve(b, "probe", benchkit.Body, true)
		}
	})
}

// The positions of the arguments the raw loop changes, as queries.sql
// numbers them (from $1).
const (
	reserveArgKey, reserveArgToken, reserveArgNow, reserveArgLockedUntil, reserveArgExpiresAt = 2, 3, 5, 6, 7
	completeArgKey, completeArgToken, completeArgNow                                          = 2, 3, 4
)

// pgRow receives the outcome of the reserve statement (reserved) and the
// row of find: the record's columns.
type pgRow struct {
	reserved                                        bool
	scope, endpoint, key, fp, state, token, les, rp string
	lockedUntil, startedAt, created, updated, exp   time.Time
	status                                          *int32
	header, body                                    []byte
	notReplayable                                   bool
	attempts                                        int
	ttl                                             *time.Duration
	reconcileAfter                                  *time.Time
	reconcileAttempts                               int
	reconcileError                                  string
}

func (r *pgRow) dest() []any {
	return []any{&r.scope, &r.endpoint, &r.key, &r.fp, &r.state, &r.token,
		&r.lockedUntil, &r.startedAt, &r.les, &r.status, &r.header, &r.body, &r.notReplayable,
		&r.rp, &r.attempts, &r.created, &r.updated, &r.exp, &r.ttl,
		&r.reconcileAfter, &r.reconcileAttempts, &r.reconcileError}
}

// rawReserve sends the recorded reserve and find statements for key with
// token at the current time, the lease and retention of the recorded one,
// as one batch, and reads find's row when reserve inserted nothing.
func rawReserve(ctx context.Context, pool *pgxpool.Pool, st, find recordedStmt, key, token string) (*pgRow, error) {
	args := append([]any(nil), st.args...)
	was := st.args[reserveArgNow].(time.Time)
	now := time.Now().Truncate(time.Microsecond)
	args[reserveArgKey], args[reserveArgToken], args[reserveArgNow] = key, token, now
	args[reserveArgLockedUntil] = now.Add(st.args[reserveArgLockedUntil].(time.Time).Sub(was))
	args[reserveArgExpiresAt] = now.Add(st.args[reserveArgExpiresAt].(time.Time).Sub(was))
	var row pgRow
	bt := &pgx.Batch{}
	bt.Queue(st.sql, args...)
	bt.Queue(find.sql, args[:4]...) // scope, endpoint, key, token
	br := pool.SendBatch(ctx, bt)
	tag, err := br.Exec()
	row.reserved = err == nil && tag.RowsAffected() == 1
	if err == nil && !row.reserved {
		err = br.QueryRow().Scan(row.dest()...)
	}
	return &row, cmp.Or(err, br.Close())
}

// BenchmarkRawPGNewKey is BenchmarkMiddlewarePGNewKey's two statements in
// a bare pgx loop.
func BenchmarkRawPGNewKey(b *testing.B) {
	for _, v := range benchkit.RawVariants {
		b.Run(v.Name, func(b *testing.B) { rawPGNewKey(b, v.Handler) })
	}
}

func rawPGNewKey(b *testing.B, handler bool) {
	p := newPGBench(b)
	reserve, find, complete := p.learn(b)
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(benchkit.Parallelism(pgBenchParallelism))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			key := "key-" + strconv.FormatInt(i, 10)
			row, err := rawReserve(ctx, p.pool, reserve, find, key, key)
			if err != nil || !row.reserved {
				b.Fatalf("reserve: %v (reserved %v)", err, row.reserved)
			}
			if handler {
				benchkit.BareRequest(key, benchkit.BodyN(i))
			}
			args := append([]any(nil), complete.args...)
			args[completeArgKey], args[completeArgToken] = key, key
			args[completeArgNow] = time.Now().Truncate(time.Microsecond)
			var notified int64 // a row: the record completed
			if err := p.pool.QueryRow(ctx, complete.sql, args...).Scan(&notified); err != nil {
				b.Fatalf("complete: %v", err)
			}
		}
	})
}

// BenchmarkRawPGReplay is BenchmarkMiddlewarePGReplay's statement in a bare
// pgx loop.
func BenchmarkRawPGReplay(b *testing.B) {
	for _, v := range benchkit.RawVariants {
		b.Run(v.Name, func(b *testing.B) { rawPGReplay(b, v.Handler) })
	}
}

func rawPGReplay(b *testing.B, handler bool) {
	p := newPGBench(b)
	reserve, find, _ := p.learn(b)
	ctx := context.Background()
	b.SetParallelism(benchkit.Parallelism(pgBenchParallelism))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			row, err := rawReserve(ctx, p.pool, reserve, find, "probe", "retry")
			if err != nil || row.reserved || row.state != "completed" {
				b.Fatalf("replay: %v (reserved %v, state %s)", err, row.reserved, row.state)
			}
			if handler {
				benchkit.BareRequest("probe", benchkit.Body)
			}
		}
	})
}
