package idempgx

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// execCalls runs the statements of calls in one write and one implicit
// transaction on a connection of pool, and sets each call's outcome
// (c.err). It returns the batch's error, which is every call's: the
// server's error (the transaction rolled back) or a failure of the
// connection.
//
// It sends the statements as pgconn's batch of prepared statements (Bind
// and Execute for each, one Sync), not as pgx's batch, which runs in
// pipeline mode and keeps a list element per message sent and received:
// about a quarter of a new key's allocations. The statements are prepared
// on each connection once, named by their text as pgx.Conn.Prepare names
// them, which pgx's own batches and queries then use too. A tracer on the
// pool sees them as a batch, as it saw pgx's.
func execCalls(ctx context.Context, pool *pgxpool.Pool, tracer pgx.BatchTracer, calls []*groupCall) (err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		for _, c := range calls {
			c.err = err
		}
		return err
	}
	defer conn.Release()
	pc := conn.Conn()
	if tracer != nil {
		var b pgx.Batch
		for _, c := range calls {
			c.queue(&b)
		}
		ctx = tracer.TraceBatchStart(ctx, pc, pgx.TraceBatchStartData{Batch: &b})
		defer func() { tracer.TraceBatchEnd(ctx, pc, pgx.TraceBatchEndData{Err: err}) }()
	}
	var batch pgconn.Batch
	bb := builders.Get().(*builder)
	defer builders.Put(bb)
	bb.formats = bb.formats[:0]
	add := func(sql string, args []any) error {
		sd, err := pc.Prepare(ctx, sql, sql)
		if err != nil {
			return err
		}
		eqb := &bb.eqb
		if err := eqb.Build(pc.TypeMap(), sd, args); err != nil {
			return fmt.Errorf("encoding the arguments of %q: %w", sql, err)
		}
		// The batch keeps the result formats until it is read; the
		// builder reuses its slice.
		n := len(bb.formats)
		bb.formats = append(bb.formats, eqb.ResultFormats...)
		batch.ExecStatement(sd, eqb.ParamValues, eqb.ParamFormats, bb.formats[n:len(bb.formats):len(bb.formats)])
		return nil
	}
	for _, c := range calls {
		err = add(c.sql, c.args)
		if err == nil && c.find != "" {
			err = add(c.find, c.args[:3])
		}
		if err != nil {
			for _, c := range calls {
				c.err = err
			}
			forgetStatements(ctx, pc, err, calls)
			return err
		}
	}
	r := &directResults{mrr: pc.PgConn().ExecBatch(ctx, &batch), typeMap: pc.TypeMap(), tracer: tracer, ctx: ctx, conn: pc}
	for _, c := range calls {
		// After an error of the server or the connection, every later
		// read returns it.
		c.err = c.readDirect(r)
	}
	if err = r.mrr.Close(); err != nil {
		for _, c := range calls {
			c.err = err
		}
		forgetStatements(ctx, pc, err, calls)
	}
	return err
}

// builder encodes the arguments of a batch's statements: the builder's
// buffers, and the result formats of every statement, kept for reading the
// results, are reused from one batch to the next.
type builder struct {
	eqb     pgx.ExtendedQueryBuilder
	formats []int16
}

var builders = sync.Pool{New: func() any { return new(builder) }}

// forgetStatements deallocates the statements of calls on pc after the
// server said that one of them is no longer valid as prepared (its table
// changed under it, or the session lost it), so that the next use prepares
// them again, as pgx does for the statements it caches.
func forgetStatements(ctx context.Context, pc *pgx.Conn, err error, calls []*groupCall) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Code != "0A000" && pgErr.Code != "26000") {
		return
	}
	ctx = context.WithoutCancel(ctx)
	for _, c := range calls {
		pc.Deallocate(ctx, c.sql)
		if c.find != "" {
			pc.Deallocate(ctx, c.find)
		}
	}
}

// directResults reads the results of a batch execCalls sent, one statement
// after the other.
type directResults struct {
	mrr     *pgconn.MultiResultReader
	typeMap *pgtype.Map
	tracer  pgx.BatchTracer
	ctx     context.Context
	conn    *pgx.Conn
}

// next returns the next statement's result.
func (r *directResults) next() (*pgconn.ResultReader, error) {
	if !r.mrr.NextResult() {
		if err := r.mrr.Close(); err != nil {
			return nil, err
		}
		return nil, errors.New("idempgx: the batch returned fewer results than it has statements")
	}
	return r.mrr.ResultReader(), nil
}

// exec reads a statement's result and returns its command tag, discarding
// any rows.
func (r *directResults) exec(sql string, args []any) (pgconn.CommandTag, error) {
	rr, err := r.next()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = rr.Close()
	}
	r.trace(sql, args, tag, err)
	return tag, err
}

// queryRow scans the first row of a statement's result into dest, or
// returns pgx.ErrNoRows when it has none.
func (r *directResults) queryRow(sql string, args []any, dest []any) error {
	rr, err := r.next()
	if err != nil {
		r.trace(sql, args, pgconn.CommandTag{}, err)
		return err
	}
	rows := pgx.RowsFromResultReader(r.typeMap, rr)
	found := rows.Next()
	if found {
		err = rows.Scan(dest...)
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err == nil && !found {
		err = pgx.ErrNoRows
	}
	r.trace(sql, args, rows.CommandTag(), err)
	return err
}

func (r *directResults) trace(sql string, args []any, tag pgconn.CommandTag, err error) {
	if r.tracer != nil {
		r.tracer.TraceBatchQuery(r.ctx, r.conn, pgx.TraceBatchQueryData{SQL: sql, Args: args, CommandTag: tag, Err: err})
	}
}

// readDirect reads c's results from r. A reservation's record is not
// decoded when its insert wrote one: the caller built it.
func (c *groupCall) readDirect(r *directResults) error {
	if c.find == "" {
		return r.queryRow(c.sql, c.args, c.dest)
	}
	tag, err := r.exec(c.sql, c.args)
	if err != nil {
		return err
	}
	c.inserted = tag.RowsAffected() == 1
	if c.inserted {
		_, err = r.exec(c.find, c.args[:3])
		return err
	}
	c.found = new(recordScan)
	return r.queryRow(c.find, c.args[:3], c.found.dest())
}

// batchTracer returns the tracer of pool's connections as a pgx.BatchTracer,
// or nil.
func batchTracer(pool *pgxpool.Pool) pgx.BatchTracer {
	bt, _ := pool.Config().ConnConfig.Tracer.(pgx.BatchTracer)
	return bt
}
