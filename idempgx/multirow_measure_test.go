package idempgx

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

const reserveMultiSQL = `INSERT INTO {{schema}}.idem_keys AS k (
    scope, endpoint, key, fingerprint, state, token, locked_until,
    started_at, lease_expired_state, attempts, created_at, updated_at,
    expires_at, ttl)
SELECT u.scope, u.endpoint, u.key, u.fingerprint, 'in_progress', u.token,
    u.locked_until, u.now, u.les, 1, u.now, u.now, u.expires_at, u.ttl
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
    $6::timestamptz[], $7::timestamptz[], $8::timestamptz[], $9::text[], $10::interval[])
    AS u(scope, endpoint, key, token, fingerprint, now, locked_until, expires_at, les, ttl)
ON CONFLICT ON CONSTRAINT idem_keys_pkey DO NOTHING`

const findMultiSQL = `SELECT u.ord, {{columns}}
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(scope, endpoint, key, token, ord)
JOIN {{schema}}.idem_keys AS k ON k.scope = u.scope AND k.endpoint = u.endpoint AND k.key = u.key
WHERE k.token <> u.token`

const findLateralSQL = `SELECT u.ord, k.*
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(scope, endpoint, key, token, ord),
LATERAL (SELECT {{columns}} FROM {{schema}}.idem_keys AS k
  WHERE k.scope = u.scope AND k.endpoint = u.endpoint AND k.key = u.key AND k.token <> u.token) AS k`

const completeMultiSQL = `UPDATE {{schema}}.idem_keys AS k SET
    state = 'completed',
    response_status = u.status,
    response_header = u.header,
    response_body = u.body,
    not_replayable = u.not_replayable,
    updated_at = u.now,
    unknown_since = NULL,
    expires_at = CASE WHEN (k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= u.now
               AND k.lease_expired_state = 'unknown'))
        THEN u.now + coalesce(k.ttl, k.expires_at - k.created_at)
        ELSE k.expires_at END
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],
    $6::integer[], $7::jsonb[], $8::bytea[], $9::boolean[]) WITH ORDINALITY
    AS u(scope, endpoint, key, token, now, status, header, body, not_replayable, ord)
WHERE k.scope = u.scope AND k.endpoint = u.endpoint AND k.key = u.key AND k.token = u.token
  AND k.state IN ('in_progress', 'unknown')
  AND (k.expires_at > u.now OR k.state = 'unknown'
       OR (k.state = 'in_progress' AND k.locked_until <= u.now
           AND k.lease_expired_state = 'unknown'))
RETURNING u.ord,
    CASE WHEN NOT k.waiters THEN 0::bigint
         WHEN pg_notify({{channel}}, {{notify_payload_k}}) IS NULL THEN 1::bigint
         ELSE 1::bigint END`

const reserveSubsSQL = `INSERT INTO {{schema}}.idem_keys AS k (
    scope, endpoint, key, fingerprint, state, token, locked_until,
    started_at, lease_expired_state, attempts, created_at, updated_at,
    expires_at, ttl)
SELECT ($1::text[])[i], ($2::text[])[i], ($3::text[])[i], ($5::text[])[i], 'in_progress', ($4::text[])[i],
    ($7::timestamptz[])[i], ($6::timestamptz[])[i], ($9::text[])[i], 1, ($6::timestamptz[])[i],
    ($6::timestamptz[])[i], ($8::timestamptz[])[i], ($10::interval[])[i]
FROM generate_subscripts($3::text[], 1) AS i
ON CONFLICT ON CONSTRAINT idem_keys_pkey DO NOTHING`

const findSubsSQL = `SELECT i, k.*
FROM generate_subscripts($3::text[], 1) AS i,
LATERAL (SELECT {{columns}} FROM {{schema}}.idem_keys AS k
  WHERE k.scope = ($1::text[])[i] AND k.endpoint = ($2::text[])[i] AND k.key = ($3::text[])[i]
    AND k.token <> ($4::text[])[i]) AS k`

// findPinnedSQL: the lateral subquery fenced (OFFSET 0), so that it is
// not pulled up into a join the planner may hash.
const findPinnedSQL = `SELECT i, k.*
FROM generate_subscripts($3::text[], 1) AS i,
LATERAL (SELECT {{columns}} FROM {{schema}}.idem_keys AS k
  WHERE k.scope = ($1::text[])[i] AND k.endpoint = ($2::text[])[i] AND k.key = ($3::text[])[i]
    AND k.token <> ($4::text[])[i] OFFSET 0) AS k`

// completePinnedSQL: the subscripts capped (LIMIT 16, the planner's
// estimate too), the state's and fencing conditions in a CASE (no
// selectivity estimate from the state's statistics).
const completePinnedSQL = `UPDATE {{schema}}.idem_keys AS k SET
    state = 'completed',
    response_status = ($6::integer[])[i],
    response_header = ($7::jsonb[])[i],
    response_body = ($8::bytea[])[i],
    not_replayable = ($9::boolean[])[i],
    updated_at = ($5::timestamptz[])[i],
    unknown_since = NULL,
    expires_at = CASE WHEN (k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= ($5::timestamptz[])[i]
               AND k.lease_expired_state = 'unknown'))
        THEN ($5::timestamptz[])[i] + coalesce(k.ttl, k.expires_at - k.created_at)
        ELSE k.expires_at END
FROM (SELECT i FROM generate_subscripts($3::text[], 1) AS i LIMIT 16) AS v
WHERE k.scope = ($1::text[])[i] AND k.endpoint = ($2::text[])[i] AND k.key = ($3::text[])[i]
  AND CASE WHEN k.state IN ('in_progress', 'unknown')
      THEN k.token = ($4::text[])[i]
       AND (k.expires_at > ($5::timestamptz[])[i] OR k.state = 'unknown'
            OR (k.state = 'in_progress' AND k.locked_until <= ($5::timestamptz[])[i]
                AND k.lease_expired_state = 'unknown'))
      ELSE false END
RETURNING i,
    CASE WHEN NOT k.waiters THEN 0::bigint
         WHEN pg_notify({{channel}}, {{notify_payload_k}}) IS NULL THEN 1::bigint
         ELSE 1::bigint END`

const completeSubsSQL = `UPDATE {{schema}}.idem_keys AS k SET
    state = 'completed',
    response_status = ($6::integer[])[i],
    response_header = ($7::jsonb[])[i],
    response_body = ($8::bytea[])[i],
    not_replayable = ($9::boolean[])[i],
    updated_at = ($5::timestamptz[])[i],
    unknown_since = NULL,
    expires_at = CASE WHEN (k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= ($5::timestamptz[])[i]
               AND k.lease_expired_state = 'unknown'))
        THEN ($5::timestamptz[])[i] + coalesce(k.ttl, k.expires_at - k.created_at)
        ELSE k.expires_at END
FROM generate_subscripts($3::text[], 1) AS i
WHERE k.scope = ($1::text[])[i] AND k.endpoint = ($2::text[])[i] AND k.key = ($3::text[])[i]
  AND k.token = ($4::text[])[i]
  AND k.state IN ('in_progress', 'unknown')
  AND (k.expires_at > ($5::timestamptz[])[i] OR k.state = 'unknown'
       OR (k.state = 'in_progress' AND k.locked_until <= ($5::timestamptz[])[i]
           AND k.lease_expired_state = 'unknown'))
RETURNING i,
    CASE WHEN NOT k.waiters THEN 0::bigint
         WHEN pg_notify({{channel}}, {{notify_payload_k}}) IS NULL THEN 1::bigint
         ELSE 1::bigint END`

// completeCTESQL is g "complete" statements in one (the forms cte and
// cte1, with the store's merged reservations): a data-modifying CTE per
// call, its parameters renumbered (call j's are $9j+1 … $9j+9), each an
// UPDATE by the whole primary key, and a row per call completed: the
// call's number and complete's one column.
func completeCTESQL(complete string, g int) string {
	var b strings.Builder
	for j := range g {
		if j == 0 {
			b.WriteString("WITH ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "u%d AS (\n", j+1)
		b.WriteString(renumber(strings.TrimSuffix(complete, ";"), 9*j))
		b.WriteString("\n)")
	}
	for j := range g {
		if j > 0 {
			b.WriteString("\nUNION ALL ")
		} else {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "SELECT %d, * FROM u%d", j+1, j+1)
	}
	return b.String()
}

// completeCTE1SQL is completeCTESQL returning one row of g columns, call
// j's complete column in column j (NULL: not completed).
func completeCTE1SQL(complete string, g int) string {
	sql := completeCTESQL(complete, g)
	sql = sql[:strings.Index(sql, "\nSELECT 1, * FROM u1")]
	var b strings.Builder
	b.WriteString(sql)
	b.WriteString("\nSELECT ")
	for j := range g {
		if j > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(SELECT * FROM u%d)", j+1)
	}
	return b.String()
}

var paramRE = regexp.MustCompile(`\$[0-9]+`)

// renumber adds off to every parameter number of sql.
func renumber(sql string, off int) string {
	return paramRE.ReplaceAllStringFunc(sql, func(p string) string {
		n, _ := strconv.Atoi(p[1:])
		return "$" + strconv.Itoa(n+off)
	})
}

// TestMeasureMultiRow drives one backend with IDEM_PGMULTI_N groups of
// IDEM_PGMULTI_G new keys (form IDEM_PGMULTI_FORM: cur, multi, lateral,
// ret, subs, pinned, pinnedret, half, cte, cte1) on schema IDEM_PGMULTI_SCHEMA, for
// scripts/bench/pgmultirow.sh (a measurement, not a test: skipped unless
// IDEM_PGMULTI_SCHEMA is set; IDEM_PGMULTI_SETUP=1 migrates the schema and
// writes IDEM_PGMULTI_POPULATE completed records).
func TestMeasureMultiRow(t *testing.T) {
	schemaName := os.Getenv("IDEM_PGMULTI_SCHEMA")
	if schemaName == "" {
		t.Skip("IDEM_PGMULTI_SCHEMA not set")
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s := New(p, &Config{Schema: schemaName})
	if os.Getenv("IDEM_PGMULTI_SETUP") != "" {
		if _, err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if rows := os.Getenv("IDEM_PGMULTI_POPULATE"); rows != "" {
			_, err := p.Exec(ctx, expand(`INSERT INTO {{schema}}.idem_keys (scope, endpoint, key, fingerprint, state, token,
    locked_until, started_at, lease_expired_state, attempts, created_at, updated_at, expires_at, ttl,
    response_status, response_header, response_body)
SELECT 'bench', 'POST /v1/payments', 'old-' || i, repeat('f', 64), 'completed', 'tok-' || i,
    now(), now(), 'unknown', 1, now(), now(), now() + interval '1 day', interval '1 day',
    201, '{"Content-Type": ["application/json"]}', 'x'::bytea
FROM generate_series(1, `+rows+`) AS i`, s.schema, s.channel))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Exec(ctx, "VACUUM ANALYZE "+s.schema+".idem_keys"); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	g, _ := strconv.Atoi(os.Getenv("IDEM_PGMULTI_G"))
	n, _ := strconv.Atoi(os.Getenv("IDEM_PGMULTI_N"))
	form := os.Getenv("IDEM_PGMULTI_FORM")
	x := func(sql string) string { return expand(sql, s.schema, s.channel) }
	reserveM, completeM := x(reserveMultiSQL), x(completeMultiSQL)
	findM := x(findMultiSQL)
	if form == "lateral" {
		findM = x(findLateralSQL)
	}
	if form == "subs" {
		reserveM, findM, completeM = x(reserveSubsSQL), x(findSubsSQL), x(completeSubsSQL)
	}
	if form == "pinned" || form == "half" || form == "cte" || form == "cte1" || form == "pinnedret" {
		reserveM, findM, completeM = x(reserveSubsSQL), x(findPinnedSQL), x(completePinnedSQL)
	}
	if form == "pinnedret" {
		reserveM += " RETURNING k.token"
	}
	if form == "half" || form == "cte" || form == "cte1" { // the store's statements (queries.sql), completions alone
		reserveM, findM = s.q.reserveMany, s.q.findMany
	}
	if form == "ret" {
		reserveM += " RETURNING k.token"
	}
	resp, _ := encodeResponse(sampleResponse(), false)
	run := fmt.Sprintf("%d-%d", time.Now().UnixNano(), n)
	for i := range n {
		ids := make([]idemstore.Identity, g)
		tokens := make([]string, g)
		for j := range g {
			ids[j] = idemstore.Identity{Scope: "bench", Endpoint: "POST /v1/payments", Key: fmt.Sprintf("key-%s-%06d-%02d", run, i, j)}
			tokens[j] = fmt.Sprintf("token-%s-%06d-%02d", run, i, j)
		}
		now := s.now()
		lockedUntil, expiresAt := now.Add(lease), now.Add(ttl)
		if form == "cur" {
			calls := make([]*groupCall, g)
			for j := range g {
				calls[j] = &groupCall{id: ids[j], sql: s.q.reserve, find: s.q.find,
					args: []any{ids[j].Scope, ids[j].Endpoint, ids[j].Key, tokens[j], fp1, now, lockedUntil, expiresAt, "unknown", ttl}}
			}
			if err := s.send.exec(ctx, calls); err != nil {
				t.Fatal(err)
			}
			for _, c := range calls {
				if !c.inserted {
					t.Fatalf("not inserted: %v", c.err)
				}
			}
			var notified int64
			for j := range g {
				calls[j] = &groupCall{id: ids[j], sql: s.q.complete, dest: []any{&notified},
					args: []any{ids[j].Scope, ids[j].Endpoint, ids[j].Key, tokens[j], now, resp.status, resp.header, resp.body, false}}
			}
			if err := s.send.exec(ctx, calls); err != nil {
				t.Fatal(err)
			}
			for _, c := range calls {
				if c.err != nil {
					t.Fatal(c.err)
				}
			}
			continue
		}
		sc, ep, ks := make([]string, g), make([]string, g), make([]string, g)
		fps, les := make([]string, g), make([]string, g)
		nows, lus, eas := make([]time.Time, g), make([]time.Time, g), make([]time.Time, g)
		ttls := make([]time.Duration, g)
		sts, hs, bs, nrs := make([]int32, g), make([]string, g), make([][]byte, g), make([]bool, g)
		for j := range g {
			sc[j], ep[j], ks[j] = ids[j].Scope, ids[j].Endpoint, ids[j].Key
			fps[j], les[j] = fp1, "unknown"
			nows[j], lus[j], eas[j], ttls[j] = now, lockedUntil, expiresAt, ttl
			sts[j], hs[j], bs[j] = *resp.status, *resp.header, resp.body
		}
		var tok string
		var ord int64
		rc := &groupCall{sql: reserveM, args: []any{sc, ep, ks, tokens, fps, nows, lus, eas, les, ttls}, dest: []any{&tok}}
		fc := &groupCall{sql: findM, args: []any{sc, ep, ks, tokens}, dest: []any{&ord}}
		err := s.send.exec(ctx, []*groupCall{rc, fc})
		if err != nil {
			t.Fatal(err)
		}
		var notified int64
		if (form == "cte" || form == "cte1") && g > 1 {
			args := make([]any, 0, 9*g)
			for j := range g {
				args = append(args, ids[j].Scope, ids[j].Endpoint, ids[j].Key, tokens[j], now, resp.status, resp.header, resp.body, false)
			}
			cc := &groupCall{sql: completeCTESQL(s.q.complete, g), args: args, dest: []any{&ord, &notified}}
			if form == "cte1" {
				dest := make([]any, g)
				for j := range dest {
					dest[j] = new(int64)
				}
				cc = &groupCall{sql: completeCTE1SQL(s.q.complete, g), args: args, dest: dest}
			}
			if err := s.send.exec(ctx, []*groupCall{cc}); err != nil || cc.err != nil {
				t.Fatal(err, cc.err)
			}
			continue
		}
		if form == "half" || form == "cte" || form == "cte1" {
			calls := make([]*groupCall, g)
			for j := range g {
				calls[j] = &groupCall{id: ids[j], sql: s.q.complete, dest: []any{&notified},
					args: []any{ids[j].Scope, ids[j].Endpoint, ids[j].Key, tokens[j], now, resp.status, resp.header, resp.body, false}}
			}
			if err := s.send.exec(ctx, calls); err != nil {
				t.Fatal(err)
			}
			for _, c := range calls {
				if c.err != nil {
					t.Fatal(c.err)
				}
			}
			continue
		}
		cc := &groupCall{sql: completeM, args: []any{sc, ep, ks, tokens, nows, sts, hs, bs, nrs}, dest: []any{&ord, &notified}}
		if err := s.send.exec(ctx, []*groupCall{cc}); err != nil || cc.err != nil {
			t.Fatal(err, cc.err)
		}
	}
}

// BenchmarkEncodeGroup4 encodes the arguments of a group of four
// reservations: today's (four statements of ten scalars, and their finds)
// against one statement of ten arrays (pgx's encoding).
func BenchmarkEncodeGroup4(b *testing.B) {
	const g = 4
	now := time.Now()
	ids := make([]string, g)
	for j := range ids {
		ids[j] = fmt.Sprintf("key-%d", j)
	}
	scalar := &pgconn.StatementDescription{ParamOIDs: []uint32{pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID,
		pgtype.TextOID, pgtype.TimestamptzOID, pgtype.TimestamptzOID, pgtype.TimestamptzOID, pgtype.TextOID, pgtype.IntervalOID}}
	arrays := &pgconn.StatementDescription{ParamOIDs: []uint32{pgtype.TextArrayOID, pgtype.TextArrayOID, pgtype.TextArrayOID, pgtype.TextArrayOID,
		pgtype.TextArrayOID, pgtype.TimestamptzArrayOID, pgtype.TimestamptzArrayOID, pgtype.TimestamptzArrayOID, pgtype.TextArrayOID, pgtype.IntervalArrayOID}}
	b.Run("statements", func(b *testing.B) {
		b.ReportAllocs()
		bb := new(builder)
		for b.Loop() {
			for j := range g {
				s, e, k, tk, f, l := "bench", "POST /v1/payments", ids[j], "token", fp1, "unknown"
				t1, t2, t3, d := now, now, now, ttl
				args := [10]any{&s, &e, &k, &tk, &f, &t1, &t2, &t3, &l, &d}
				bb.encode(scalar, args[:])
				bb.encode(&pgconn.StatementDescription{ParamOIDs: scalar.ParamOIDs[:4]}, args[:4])
			}
		}
	})
	b.Run("merged", func(b *testing.B) {
		b.ReportAllocs()
		bb := new(builder)
		m := &manyStatements{reserve: "r", find: "f", reserveMany: "rm", findMany: "fm"}
		group := make([]*groupCall, g)
		for b.Loop() {
			for j := range g {
				a := &struct {
					s, e, k, tk, f, l string
					t1, t2, t3        time.Time
					d                 time.Duration
					args              [10]any
				}{s: "bench", e: "POST /v1/payments", k: ids[j], tk: ids[j], f: fp1, l: "unknown", t1: now, t2: now, t3: now, d: ttl}
				a.args = [10]any{&a.s, &a.e, &a.k, &a.tk, &a.f, &a.t1, &a.t2, &a.t3, &a.l, &a.d}
				group[j] = &groupCall{sql: "r", find: "f", args: a.args[:]}
			}
			out := m.merge(group)
			if len(out) != 1 || !bb.encode(arrays, out[0].args) || !bb.encode(&pgconn.StatementDescription{ParamOIDs: arrays.ParamOIDs[:4]}, out[0].args[:4]) {
				b.Fatal("not merged and encoded")
			}
		}
	})
	b.Run("singles", func(b *testing.B) {
		b.ReportAllocs()
		bb := new(builder)
		group := make([]*groupCall, g)
		for b.Loop() {
			for j := range g {
				a := &struct {
					s, e, k, tk, f, l string
					t1, t2, t3        time.Time
					d                 time.Duration
					args              [10]any
				}{s: "bench", e: "POST /v1/payments", k: ids[j], tk: ids[j], f: fp1, l: "unknown", t1: now, t2: now, t3: now, d: ttl}
				a.args = [10]any{&a.s, &a.e, &a.k, &a.tk, &a.f, &a.t1, &a.t2, &a.t3, &a.l, &a.d}
				group[j] = &groupCall{sql: "r", find: "f", args: a.args[:]}
			}
			for _, c := range group {
				bb.encode(scalar, c.args)
				bb.encode(&pgconn.StatementDescription{ParamOIDs: scalar.ParamOIDs[:4]}, c.args[:4])
			}
		}
	})
	b.Run("arrays", func(b *testing.B) {
		b.ReportAllocs()
		m := pgtype.NewMap()
		var eqb pgx.ExtendedQueryBuilder
		for b.Loop() {
			sc, ep, ks, tk, fps, les := make([]string, g), make([]string, g), make([]string, g), make([]string, g), make([]string, g), make([]string, g)
			nows, lus, eas, ttls := make([]time.Time, g), make([]time.Time, g), make([]time.Time, g), make([]time.Duration, g)
			for j := range g {
				sc[j], ep[j], ks[j], tk[j], fps[j], les[j] = "bench", "POST /v1/payments", ids[j], "token", fp1, "unknown"
				nows[j], lus[j], eas[j], ttls[j] = now, now, now, ttl
			}
			if err := eqb.Build(m, arrays, []any{sc, ep, ks, tk, fps, nows, lus, eas, les, ttls}); err != nil {
				b.Fatal(err)
			}
			if err := eqb.Build(m, &pgconn.StatementDescription{ParamOIDs: arrays.ParamOIDs[:4]}, []any{sc, ep, ks, tk}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
