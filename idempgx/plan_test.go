package idempgx

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// TestReservePlanUsesPrimaryKey pins down that the find and reclaim
// statements find their record by the primary key in a generic plan made on
// an empty table,
// which is what a pool's connections prepare when a store starts fresh: a
// branch that could use idem_keys_reap_idx (live completed records by
// expires_at) or a sequential scan instead reads every record on every
// reservation once the table has grown.
func TestReservePlanUsesPrimaryKey(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// A connection of its own: the setting and the prepared statement must
	// not reach the shared pool, whose connections pgx prepares statements on.
	conn, err := pgx.Connect(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct{ name, sql, args string }{
		{"find", s.q.find, "'', 'POST /v1/payments', 'key-1', 'token'"},
		{"reclaim", s.q.reclaim, reserveArgs},
	} {
		t.Run(st.name, func(t *testing.T) {
			checkPlanUsesPrimaryKey(ctx, t, conn, st.name, st.sql, st.args)
		})
	}
}

// reserveArgs are arguments of the reserve and reclaim statements.
const reserveArgs = `'', 'POST /v1/payments', 'key-1', 'token',
		'fp', now(), now(), now(), 'unknown', interval '1 day'`

// checkPlanUsesPrimaryKey prepares sql, one of the reserve statements, on
// conn and checks that every scan of idem_keys in its plan, executed with
// args, is by the primary key.
func checkPlanUsesPrimaryKey(ctx context.Context, t *testing.T, conn *pgx.Conn, name, sql, args string) {
	if _, err := conn.Exec(ctx, "PREPARE idem_"+name+"_plan AS "+sql); err != nil {
		t.Fatalf("preparing %s: %v", name, err)
	}
	rows, err := conn.Query(ctx, `EXPLAIN EXECUTE idem_`+name+`_plan(`+args+`)`)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	scans := 0
	for _, line := range plan {
		if !strings.Contains(line, "Scan") || !strings.Contains(line, " on idem_keys ") {
			continue
		}
		scans++
		if !strings.Contains(line, "Index Scan using idem_keys_pkey on idem_keys ") {
			t.Errorf("%s reads idem_keys other than by its primary key: %s", name, strings.TrimSpace(line))
		}
	}
	if scans == 0 {
		t.Errorf("no scan of idem_keys in the plan:\n%s", strings.Join(plan, "\n"))
	}
	if t.Failed() {
		t.Logf("plan:\n%s", strings.Join(plan, "\n"))
	}
}

// TestMaintenancePlansUseTheirIndexes pins down that the sweep, reap and
// reconciliation statements read their index in a generic plan made on an
// empty table, never the whole table.
func TestMaintenancePlansUseTheirIndexes(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct{ name, sql, args, index string }{
		{"sweep", s.q.sweep, "now(), 1000, now() - interval '10 seconds'", "idem_keys_sweep_idx"},
		{"reap", s.q.reap, "now(), 1000", "idem_keys_reap_idx"},
		{"reconcile_claim", s.q.reconcileClaim, "now(), now(), 100, NULL", "idem_keys_reconcile_idx"},
	} {
		t.Run(st.name, func(t *testing.T) {
			plan := explain(ctx, t, conn, st.name, st.sql, st.args)
			for _, line := range plan {
				if strings.Contains(line, "Seq Scan") {
					t.Errorf("%s scans idem_keys: %s", st.name, strings.TrimSpace(line))
				}
			}
			if !strings.Contains(strings.Join(plan, "\n"), " using "+st.index+" on idem_keys") {
				t.Errorf("%s does not read %s", st.name, st.index)
			}
			if t.Failed() {
				t.Logf("plan:\n%s", strings.Join(plan, "\n"))
			}
		})
	}
}

// explain prepares sql on conn as name and returns the plan of its
// execution with args.
func explain(ctx context.Context, t *testing.T, conn *pgx.Conn, name, sql, args string) []string {
	t.Helper()
	if _, err := conn.Exec(ctx, "PREPARE idem_"+name+"_plan AS "+sql); err != nil {
		t.Fatalf("preparing %s: %v", name, err)
	}
	exec := "EXPLAIN EXECUTE idem_" + name + "_plan"
	if args != "" {
		exec += "(" + args + ")"
	}
	rows, err := conn.Query(ctx, exec)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// TestSweepReadsFromItsWatermark: the sweep index holds finished records
// too; a pass after the first reads only the records whose lease ended
// since the previous pass, not every finished record, while a lease that
// ended since is swept.
func TestSweepReadsFromItsWatermark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const finished = 5000
	_, err := b.store.pool.Exec(b.ctx, `
INSERT INTO `+b.store.schema+`.idem_keys (scope, endpoint, key, fingerprint, state, token,
    locked_until, started_at, lease_expired_state, response_status, created_at, updated_at, expires_at)
SELECT 'tenant', 'POST /v1/payments', 'done-' || i, 'fp', 'completed', 'token-' || i,
    $1::timestamptz - interval '1 hour' + i * interval '1 millisecond', $1::timestamptz - interval '1 hour',
    'unknown', 201, $1::timestamptz - interval '1 hour', $1::timestamptz, $1::timestamptz + interval '1 day'
FROM generate_series(1, $2::int) AS i`, b.clock.Now(), finished)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.pool.Exec(b.ctx, "ANALYZE "+b.store.schema+".idem_keys"); err != nil {
		t.Fatal(err)
	}
	sweep := func() []*idemstore.Record {
		t.Helper()
		recs, err := b.store.KeySweep(b.ctx, &idemstore.SweepParams{})
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	if recs := sweep(); len(recs) != 0 { // the first pass, from the start
		t.Fatalf("swept %d records, want none", len(recs))
	}
	b.reserve(t, reserveParams("token-live", idemstore.StateUnknown))
	b.clock.Advance(lease)

	// The next pass's index scan returns the live lease and nothing else.
	now := b.store.now()
	from, deep := b.store.sweep.start(now)
	if from == nil || deep {
		t.Fatalf("the second pass starts from %v (deep %v), want a watermark", from, deep)
	}
	// EXPLAIN ANALYZE runs the statement: in a transaction rolled back.
	tx, err := b.store.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	rows, err := tx.Query(b.ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+b.store.q.sweep, now, 1000, *from)
	if err != nil {
		t.Fatal(err)
	}
	plans, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	scanned := indexRows(t, plans[0], "idem_keys_sweep_idx")
	if scanned < 0 || scanned > 10 {
		t.Errorf("the pass read %d rows of idem_keys_sweep_idx, want the 1 live lease, not the %d finished records\n%s",
			scanned, finished, plans[0])
	}
	if recs := sweep(); len(recs) != 1 || recs[0].Token != "token-live" {
		t.Fatalf("swept %d records, want the live lease", len(recs))
	}
}

// indexRows returns how many rows the scans of index read (the rows they
// returned and those their filter removed) in an EXPLAIN (ANALYZE, FORMAT
// JSON) plan, or -1 when no scan reads it.
func indexRows(t *testing.T, plan, index string) int {
	t.Helper()
	var doc []struct{ Plan planNode }
	if err := json.Unmarshal([]byte(plan), &doc); err != nil || len(doc) != 1 {
		t.Fatalf("reading the plan: %v\n%s", err, plan)
	}
	n, found := 0, false
	var walk func(p *planNode)
	walk = func(p *planNode) {
		if p.IndexName == index {
			n += p.ActualRows*max(p.ActualLoops, 1) + p.RowsRemovedByFilter
			found = true
		}
		for i := range p.Plans {
			walk(&p.Plans[i])
		}
	}
	walk(&doc[0].Plan)
	if !found {
		return -1
	}
	return n
}

// planNode is a node of an EXPLAIN (FORMAT JSON) plan.
type planNode struct {
	IndexName           string     `json:"Index Name"`
	ActualRows          int        `json:"Actual Rows"`
	ActualLoops         int        `json:"Actual Loops"`
	RowsRemovedByFilter int        `json:"Rows Removed by Filter"`
	Plans               []planNode `json:"Plans"`
}

// TestSweepFindsALateLease: a lease that becomes visible after the
// watermark passed its end (committed late, or by a node whose clock is
// behind) is swept by the next deep pass.
func TestSweepFindsALateLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sweep := func() int {
		t.Helper()
		recs, err := b.store.KeySweep(b.ctx, &idemstore.SweepParams{})
		if err != nil {
			t.Fatal(err)
		}
		return len(recs)
	}
	sweep()
	b.clock.Advance(time.Minute)
	sweep()
	// A lease that ended 10 minutes ago, below the watermark.
	_, err := b.store.pool.Exec(b.ctx, `
INSERT INTO `+b.store.schema+`.idem_keys (scope, endpoint, key, fingerprint, state, token,
    locked_until, started_at, lease_expired_state, created_at, updated_at, expires_at)
VALUES ('tenant', 'POST /v1/payments', 'late', 'fp', 'in_progress', 'token-late',
    $1::timestamptz - interval '10 minutes', $1::timestamptz - interval '11 minutes', 'unknown',
    $1::timestamptz - interval '11 minutes', $1::timestamptz - interval '11 minutes', $1::timestamptz + interval '1 day')`,
		b.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if n := sweep(); n != 0 {
		t.Fatalf("a pass from the watermark swept %d records, want none", n)
	}
	b.clock.Advance(sweepDeepEvery)
	if n := sweep(); n != 1 {
		t.Fatalf("the deep pass swept %d records, want the late lease", n)
	}
}

// TestUnknownSinceFollowsTheState: unknown_since, which the reap and
// reconcile indexes read, is set on every way into unknown (mark_unknown,
// sweep, the lapse branch of reclaim) and cleared on every way out
// (complete, release, resolve), and a completion of an in-progress record
// is a HOT update.
func TestUnknownSinceFollowsTheState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	check := func(step string) {
		t.Helper()
		var state string
		var since *time.Time
		err := b.store.pool.QueryRow(b.ctx, "SELECT state, unknown_since FROM "+b.store.schema+
			".idem_keys WHERE key = $1", testID.Key).Scan(&state, &since)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if (state == "unknown") != (since != nil) {
			t.Fatalf("after %s: state %s, unknown_since %v", step, state, since)
		}
	}
	finish := func(token string) *idemstore.FinishParams {
		return &idemstore.FinishParams{Identity: testID, Token: token}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	b.reserve(t, reserveParams("t1", idemstore.StateUnknown))
	check("reserve")
	must(b.store.KeyMarkUnknown(b.ctx, finish("t1")))
	check("mark_unknown")
	must(b.store.KeyResolve(b.ctx, &idemstore.ResolveParams{Identity: testID, Token: "t1", To: idemstore.StateReleased}))
	check("resolve")

	b.reserve(t, reserveParams("t2", idemstore.StateUnknown)) // takes the released record
	check("reclaim")
	b.clock.Advance(lease)
	if recs, err := b.store.KeySweep(b.ctx, &idemstore.SweepParams{}); err != nil || len(recs) != 1 {
		t.Fatalf("KeySweep = %d records, %v; want 1", len(recs), err)
	}
	check("sweep")
	must(b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: testID, Token: "t2", Response: sampleResponse()}))
	check("complete of an unknown record")

	// Past its retention, the record is taken; its lease expires into
	// unknown and a reservation with another fingerprint lapses it.
	b.clock.Advance(ttl)
	b.reserve(t, reserveParams("t3", idemstore.StateUnknown))
	check("reclaim of an expired record")
	b.clock.Advance(lease)
	p := reserveParams("t4", idemstore.StateUnknown)
	p.Fingerprint = fp2
	if res := b.reserve(t, p); res.Reserved || res.Record.State != idemstore.StateUnknown {
		t.Fatalf("reserve after the lease: reserved %v, %s; want the unknown record", res.Reserved, res.Record.State)
	}
	check("lapse")
	must(b.store.KeyRelease(b.ctx, finish("t3")))
	check("release of an unknown record")

	// A completion of an in-progress record is a HOT update.
	id := testID
	id.Key = "key-hot"
	p = reserveParams("t5", idemstore.StateUnknown)
	p.Identity = id
	b.reserve(t, p)
	// PostgreSQL counts them in the backend until it reports them: before
	// and after, on the transaction's connection.
	tx, err := b.store.pool.Begin(b.ctx)
	must(err)
	defer tx.Rollback(b.ctx)
	hotUpdates := func() int64 {
		t.Helper()
		var n int64
		must(tx.QueryRow(b.ctx, "SELECT pg_stat_get_xact_tuples_hot_updated($1::regclass)",
			b.store.schema+".idem_keys").Scan(&n))
		return n
	}
	before := hotUpdates()
	must(b.store.CompleteTx(b.ctx, tx, &idemstore.CompleteParams{Identity: id, Token: "t5", Response: sampleResponse()}))
	if hot := hotUpdates() - before; hot != 1 {
		t.Errorf("the completion made %d HOT updates, want 1", hot)
	}
}

// TestManyPlansUsePrimaryKey pins down that find_many, the read of a
// merged group of reservations, finds each call's record by the primary
// key, in a generic plan and in a custom one, on an empty table and on one
// of analyzed records: pulled up into a join, the planner hashes a small
// table's rows, and a generic plan made then would read every record on
// every group once the table has grown. (A completion over arrays, an
// UPDATE … FROM, could not be pinned so in PostgreSQL 15: its target is
// joined as the planner chooses, and it chose a scan of the table, even for
// ctid = ANY of the rows a lateral subquery found; completions go one
// statement each.)
func TestManyPlansUsePrimaryKey(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const findArgs = `'{"",""}', '{POST /v1/payments,POST /v1/payments}', '{key-1,key-2}', '{t1,t2}'`
	for _, table := range []string{"empty", "analyzed"} {
		if table == "analyzed" {
			_, err := s.pool.Exec(ctx, `INSERT INTO `+s.schema+`.idem_keys (scope, endpoint, key, fingerprint,
    state, token, locked_until, started_at, lease_expired_state, attempts, created_at, updated_at,
    expires_at, ttl, response_status, response_header, response_body)
SELECT '', 'POST /v1/payments', 'old-' || i, 'fp', 'completed', 't-' || i, now(), now(), 'unknown', 1,
    now(), now(), now() + interval '1 day', interval '1 day', 201, '{}', ''::bytea
FROM generate_series(1, 2000) AS i`)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.pool.Exec(ctx, "ANALYZE "+s.schema+".idem_keys"); err != nil {
				t.Fatal(err)
			}
		}
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			t.Run(table+"/"+mode, func(t *testing.T) {
				conn, err := pgx.Connect(ctx, testenv.PostgresURL(t))
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(context.Background())
				if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
					t.Fatal(err)
				}
				checkPlanUsesPrimaryKey(ctx, t, conn, "find_many", s.q.findMany, findArgs)
			})
		}
	}
}
