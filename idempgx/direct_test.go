package idempgx

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// batchRecorder is a pgx.QueryTracer and pgx.BatchTracer that keeps the
// statements it sees.
type batchRecorder struct {
	mu   sync.Mutex
	sqls []string
	args [][]any
	errs []error
}

func (r *batchRecorder) add(sql string, args []any, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sqls = append(r.sqls, sql)
	r.args = append(r.args, args)
	r.errs = append(r.errs, err)
}

func (r *batchRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.add(data.SQL, data.Args, nil)
	return ctx
}

func (r *batchRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *batchRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (r *batchRecorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	r.add(data.SQL, data.Args, data.Err)
}

func (r *batchRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestTracerSeesStatements checks that a tracer on the pool sees the
// statements of a new key and of a replay, alone and grouped, with their
// outcome and their arguments as values (the store passes some by
// pointer), although the store sends them through pgconn.
func TestTracerSeesStatements(t *testing.T) {
	t.Parallel()
	rec := &batchRecorder{}
	s, _ := ownPoolStore(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = rec
		cfg.MaxConns = 4
	})
	for _, grouped := range []bool{false, true} {
		s.group = nil
		if grouped {
			s.group = newGrouper(s.send)
		}
		rec.mu.Lock()
		rec.sqls, rec.args, rec.errs = nil, nil, nil
		rec.mu.Unlock()
		id := idemstore.Identity{Scope: "s", Endpoint: "POST /v1/payments", Key: "traced"}
		if grouped {
			id.Key = "traced-grouped"
		}
		p := &idemstore.ReserveParams{Identity: id, Fingerprint: fp1, Token: "t1", Lease: lease, TTL: ttl}
		if res, err := s.KeyReserve(t.Context(), p); err != nil || !res.Reserved {
			t.Fatalf("KeyReserve: %v", err)
		}
		if err := s.KeyComplete(t.Context(), &idemstore.CompleteParams{Identity: id, Token: "t1", Response: sampleResponse()}); err != nil {
			t.Fatalf("KeyComplete: %v", err)
		}
		p.Token = "t2"
		if res, err := s.KeyReserve(t.Context(), p); err != nil || res.Reserved {
			t.Fatalf("replay: %v", err)
		}
		want := []string{s.q.reserve, s.q.find, s.q.complete, s.q.reserve, s.q.find}
		rec.mu.Lock()
		got, errs := slices.Clone(rec.sqls), slices.Clone(rec.errs)
		rec.mu.Unlock()
		if !slices.Equal(got, want) {
			t.Errorf("grouped %v: the tracer saw %d statements, want %d (reserve, find, complete, reserve, find):\n%q", grouped, len(got), len(want), got)
		}
		for i, err := range errs {
			if err != nil {
				t.Errorf("grouped %v: statement %d traced with error %v", grouped, i, err)
			}
		}
		rec.mu.Lock()
		args := slices.Clone(rec.args)
		rec.mu.Unlock()
		for i, a := range args {
			if len(a) < 3 || a[0] != id.Scope {
				t.Errorf("grouped %v: statement %d traced with arguments %v, want the scope %q first", grouped, i, a, id.Scope)
			}
			for j, v := range a {
				switch v := v.(type) {
				case *string, *time.Time, *time.Duration:
					if !reflect.ValueOf(v).IsNil() {
						t.Errorf("grouped %v: statement %d traced with argument %d a pointer, %T", grouped, i, j, v)
					}
				}
			}
		}
	}
}

// TestStatementsPreparedAgainAfterTableChange checks that when the key
// table changes under the statements prepared on a connection (the record
// read by find changes type), the next call fails at most once, as with
// pgx's statement cache, and the one after it prepares them again and
// works.
func TestStatementsPreparedAgainAfterTableChange(t *testing.T) {
	t.Parallel()
	s, pool := ownPoolStore(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // one connection: the one that prepared them
	})
	ctx := t.Context()
	p := &idemstore.ReserveParams{Identity: testID, Fingerprint: fp1, Token: "t1", Lease: lease, TTL: ttl}
	if res, err := s.KeyReserve(ctx, p); err != nil || !res.Reserved {
		t.Fatalf("KeyReserve: %v", err)
	}
	if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()}); err != nil {
		t.Fatalf("KeyComplete: %v", err)
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE "+s.schema+".idem_keys ALTER COLUMN reconcile_error TYPE varchar(256)"); err != nil {
		t.Fatal(err)
	}
	p.Token = "t2"
	failed := 0
	for range 3 {
		res, err := s.KeyReserve(ctx, p)
		if err != nil {
			failed++
			continue
		}
		if res.Reserved || res.Record.State != idemstore.StateCompleted {
			t.Fatalf("replay: %+v", res)
		}
	}
	if failed > 1 {
		t.Errorf("%d replays of 3 failed after the table changed, want at most 1", failed)
	}
}

// TestEncodeAsPgx checks that the store's encoding of its arguments is
// pgx's, byte for byte, NULLs and empty values included, and that it leaves
// the types it does not know to pgx.
func TestEncodeAsPgx(t *testing.T) {
	t.Parallel()
	status, header := int32(201), `{"a":["b"]}`
	when := time.Date(2026, 11, 27, 13, 31, 52, 123456789, time.FixedZone("x", 3600))
	dur := 90*time.Minute + 7*time.Microsecond
	tests := []struct {
		name string
		oid  uint32
		arg  any
	}{
		{"text", pgtype.TextOID, "tenant"},
		{"empty text", pgtype.TextOID, ""},
		{"text as jsonb", pgtype.JSONBOID, &header},
		{"nil text", pgtype.JSONBOID, (*string)(nil)},
		{"empty pointed text", pgtype.TextOID, new(string)},
		{"time", pgtype.TimestamptzOID, when},
		{"time before 2000", pgtype.TimestamptzOID, time.Date(1999, 12, 31, 23, 59, 59, 999999000, time.UTC)},
		{"pointed time", pgtype.TimestamptzOID, &when},
		{"nil time", pgtype.TimestamptzOID, (*time.Time)(nil)},
		{"duration", pgtype.IntervalOID, 36*time.Hour + 1500*time.Nanosecond},
		{"pointed duration", pgtype.IntervalOID, &dur},
		{"nil duration", pgtype.IntervalOID, (*time.Duration)(nil)},
		{"negative duration", pgtype.IntervalOID, -90 * time.Second},
		{"true", pgtype.BoolOID, true},
		{"false", pgtype.BoolOID, false},
		{"int4", pgtype.Int4OID, &status},
		{"nil int4", pgtype.Int4OID, (*int32)(nil)},
		{"bytea", pgtype.ByteaOID, []byte("body")},
		{"empty bytea", pgtype.ByteaOID, []byte{}},
		{"nil bytea", pgtype.ByteaOID, []byte(nil)},
	}
	// All at once, as a statement's arguments, and each alone.
	sd := &pgconn.StatementDescription{}
	var args []any
	for _, tt := range tests {
		sd.ParamOIDs = append(sd.ParamOIDs, tt.oid)
		args = append(args, tt.arg)
	}
	var want pgx.ExtendedQueryBuilder
	if err := want.Build(pgtype.NewMap(), sd, args); err != nil {
		t.Fatal(err)
	}
	var b builder
	if !b.encode(sd, args) {
		t.Fatal("encode refused the store's argument types")
	}
	for i, tt := range tests {
		if got, w := b.values[i], want.ParamValues[i]; !bytes.Equal(got, w) || (got == nil) != (w == nil) {
			t.Errorf("%s: value %x (nil %v), pgx's %x (nil %v)", tt.name, got, got == nil, w, w == nil)
		}
		if got, w := b.paramFormats[i], want.ParamFormats[i]; got != w {
			t.Errorf("%s: format %d, pgx's %d", tt.name, got, w)
		}
	}
	for i, tt := range tests {
		var alone builder
		if !alone.encode(&pgconn.StatementDescription{ParamOIDs: []uint32{tt.oid}}, []any{tt.arg}) {
			t.Fatalf("%s alone: refused", tt.name)
		}
		if got, w := alone.values[0], want.ParamValues[i]; !bytes.Equal(got, w) || (got == nil) != (w == nil) {
			t.Errorf("%s alone: value %x (nil %v), pgx's %x (nil %v)", tt.name, got, got == nil, w, w == nil)
		}
	}
	for _, unknown := range []struct {
		oid uint32
		arg any
	}{{pgtype.Int8OID, int64(1)}, {pgtype.TextOID, time.Now()}, {pgtype.Int8OID, &status}} {
		if b.encode(&pgconn.StatementDescription{ParamOIDs: []uint32{unknown.oid}}, []any{unknown.arg}) {
			t.Errorf("encode took a %T for type %d", unknown.arg, unknown.oid)
		}
	}
}

// TestNoPreparedStatementsInOtherModes checks that on a pool whose
// connections do not cache prepared statements (QueryExecModeExec, as for a
// pooler in transaction mode) the store prepares none, grouped or not.
func TestNoPreparedStatementsInOtherModes(t *testing.T) {
	t.Parallel()
	s, pool := ownPoolStore(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		cfg.MaxConns = 1 // one session, whose prepared statements are counted
	})
	ctx := t.Context()
	for _, grouped := range []bool{false, true} {
		s.group = nil
		if grouped {
			s.group = newGrouper(s.send)
		}
		id := idemstore.Identity{Scope: "s", Endpoint: "POST /v1/payments", Key: fmt.Sprint("k-", grouped)}
		p := &idemstore.ReserveParams{Identity: id, Fingerprint: fp1, Token: "t1", Lease: lease, TTL: ttl}
		if res, err := s.KeyReserve(ctx, p); err != nil || !res.Reserved {
			t.Fatalf("KeyReserve: %v", err)
		}
		if err := s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t1", Response: sampleResponse()}); err != nil {
			t.Fatalf("KeyComplete: %v", err)
		}
		p.Token = "t2"
		if res, err := s.KeyReserve(ctx, p); err != nil || res.Reserved || res.Record.State != idemstore.StateCompleted {
			t.Fatalf("replay: %v", err)
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("grouped %v: %d prepared statements in the session, want 0", grouped, n)
		}
	}
}

// ownPoolStore returns a migrated store in a schema of its own on a pool of
// its own, configured by set, and the pool; both go with the test.
func ownPoolStore(t *testing.T, set func(*pgxpool.Config)) (*Store, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	set(cfg)
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := newSchemaName()
	s := New(pool, &Config{Schema: schema})
	t.Cleanup(func() {
		if _, err := testPool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s, pool
}
