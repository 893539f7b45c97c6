package idempgx

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// exec runs the statements of calls in one write and one implicit
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
func (sn *sender) exec(ctx context.Context, calls []*groupCall) (err error) {
	if !sn.prepare {
		return sn.execPgx(ctx, calls)
	}
	tracer := sn.tracer
	conn, err := sn.pool.Acquire(ctx)
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
	add := func(sql string, args []any) error {
		sd, err := pc.Prepare(ctx, sql, sql)
		if err != nil {
			return err
		}
		formats := sn.resultFormats(sd, pc.TypeMap())
		if bb.encode(sd, args) {
			batch.ExecStatement(sd, bb.values, bb.paramFormats, formats)
			return nil
		}
		eqb := &bb.eqb
		if err := eqb.Build(pc.TypeMap(), sd, args); err != nil {
			return fmt.Errorf("encoding the arguments of %q: %w", sql, err)
		}
		batch.ExecStatement(sd, eqb.ParamValues, eqb.ParamFormats, formats)
		return nil
	}
	for _, c := range calls {
		err = add(c.sql, c.args)
		if err == nil && c.find != "" {
			err = add(c.find, c.args[:reserveFindArgs])
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

// sender sends calls' statements on pool (exec).
type sender struct {
	pool   *pgxpool.Pool
	tracer pgx.BatchTracer // the pool's, or nil
	// prepare: the pool's connections cache prepared statements (pgx's
	// default QueryExecModeCacheStatement). Otherwise (a pool set up for
	// a pooler that keeps no prepared statement, say), the statements go
	// as pgx sends them in the pool's mode.
	prepare  bool
	formats  sync.Map     // *pgconn.StatementDescription → []int16, see resultFormats
	nformats atomic.Int32 // entries of formats
}

func newSender(pool *pgxpool.Pool) *sender {
	cc := pool.Config().ConnConfig
	bt, _ := cc.Tracer.(pgx.BatchTracer)
	return &sender{pool: pool, tracer: bt,
		prepare: cc.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement && cc.StatementCacheCapacity > 0}
}

// execPgx is exec through pgx's batch, in the pool's query mode.
func (sn *sender) execPgx(ctx context.Context, calls []*groupCall) error {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2*len(calls))}
	for _, c := range calls {
		c.queue(b)
	}
	br := sn.pool.SendBatch(ctx, b)
	var refused error
	for _, c := range calls {
		if c.err = c.read(br); refused == nil && isPgError(c.err) {
			refused = c.err
		}
	}
	err := cmp.Or(refused, br.Close())
	if err != nil {
		for _, c := range calls {
			c.err = err
		}
	}
	return err
}

// read reads c's results from br. A reservation's record is not decoded
// when its insert wrote one: the caller built it.
func (c *groupCall) read(br pgx.BatchResults) error {
	if c.find == "" {
		return br.QueryRow().Scan(c.dest...)
	}
	tag, err := br.Exec()
	c.inserted = err == nil && tag.RowsAffected() == 1
	if err != nil || c.inserted {
		rows, ferr := br.Query()
		if ferr == nil {
			rows.Close()
			ferr = rows.Err()
		}
		return cmp.Or(err, ferr)
	}
	c.found = new(recordScan)
	return br.QueryRow().Scan(c.found.dest()...)
}

// maxFormats bounds the statements whose result formats a sender keeps.
const maxFormats = 256

// resultFormats returns the formats pgx would ask for the columns of sd,
// found once per prepared statement instead of once per column at every
// call. They are kept by statement description, which a connection keeps
// as long as the statement is prepared and never changes (a statement
// prepared again is described anew): a pointer is hashed in a few
// instructions, a statement's text in hundreds. At most maxFormats are
// kept; when full, the cache starts afresh, so that the descriptions of
// closed connections do not pile up.
func (sn *sender) resultFormats(sd *pgconn.StatementDescription, m *pgtype.Map) []int16 {
	if v, ok := sn.formats.Load(sd); ok {
		return v.([]int16)
	}
	formats := make([]int16, len(sd.Fields))
	for i, f := range sd.Fields {
		formats[i] = m.FormatCodeForOID(f.DataTypeOID)
	}
	if sn.nformats.Add(1) > maxFormats {
		sn.formats.Clear()
		sn.nformats.Store(1)
	}
	sn.formats.Store(sd, formats)
	return formats
}

// builder encodes the arguments of a batch's statements, reused from one
// batch to the next.
type builder struct {
	eqb          pgx.ExtendedQueryBuilder
	buf          []byte
	values       [][]byte
	paramFormats []int16
}

var builders = sync.Pool{New: func() any { return new(builder) }}

// encode encodes args, the arguments of sd, into b.values and
// b.paramFormats as pgx's ExtendedQueryBuilder would (strings as text,
// the other types the store sends in binary, each also behind a pointer,
// nil pointers as NULL), or
// reports false for an argument of another type or an unexpected
// parameter type: pgx's builder then encodes them.
func (b *builder) encode(sd *pgconn.StatementDescription, args []any) bool {
	if len(args) != len(sd.ParamOIDs) {
		return false
	}
	b.buf, b.values, b.paramFormats = b.buf[:0], b.values[:0], b.paramFormats[:0]
	for i, a := range args {
		oid := sd.ParamOIDs[i]
		format := int16(pgtype.BinaryFormatCode)
		start := len(b.buf)
		null := false
		switch v := a.(type) {
		case string:
			format = pgtype.TextFormatCode
			b.buf = append(b.buf, v...)
		case *string:
			format = pgtype.TextFormatCode
			if null = v == nil; !null {
				b.buf = append(b.buf, *v...)
			}
		case time.Time:
			if oid != pgtype.TimestamptzOID {
				return false
			}
			b.buf = appendTimestamptz(b.buf, v)
		case *time.Time:
			if oid != pgtype.TimestamptzOID {
				return false
			}
			if null = v == nil; !null {
				b.buf = appendTimestamptz(b.buf, *v)
			}
		case time.Duration:
			if oid != pgtype.IntervalOID {
				return false
			}
			b.buf = appendInterval(b.buf, v)
		case *time.Duration:
			if oid != pgtype.IntervalOID {
				return false
			}
			if null = v == nil; !null {
				b.buf = appendInterval(b.buf, *v)
			}
		case *manyArg:
			var ok bool
			if b.buf, ok = appendArray(b.buf, v, oid); !ok {
				return false
			}
		case bool:
			if oid != pgtype.BoolOID {
				return false
			}
			if v {
				b.buf = append(b.buf, 1)
			} else {
				b.buf = append(b.buf, 0)
			}
		case *int32:
			if oid != pgtype.Int4OID {
				return false
			}
			if null = v == nil; !null {
				b.buf = binary.BigEndian.AppendUint32(b.buf, uint32(*v))
			}
		case []byte:
			if oid != pgtype.ByteaOID {
				return false
			}
			if null = v == nil; !null {
				b.buf = append(b.buf, v...)
			}
		default:
			return false
		}
		b.paramFormats = append(b.paramFormats, format)
		switch {
		case null:
			b.values = append(b.values, nil)
		case start == len(b.buf):
			b.values = append(b.values, empty) // not NULL
		default:
			// A later append may move b.buf: what it held stays where
			// this slice points.
			b.values = append(b.values, b.buf[start:len(b.buf):len(b.buf)])
		}
	}
	return true
}

// appendTimestamptz appends t as a binary timestamptz: microseconds since
// PostgreSQL's epoch.
func appendTimestamptz(buf []byte, t time.Time) []byte {
	us := t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - y2kMicroseconds
	return binary.BigEndian.AppendUint64(buf, uint64(us))
}

// appendInterval appends d as a binary interval of microseconds, no days
// or months.
func appendInterval(buf []byte, d time.Duration) []byte {
	buf = binary.BigEndian.AppendUint64(buf, uint64(int64(d)/1000))
	return binary.BigEndian.AppendUint64(buf, 0) // days, months
}

// empty is an empty value, which a nil slice is not: NULL.
var empty = []byte{}

// y2kMicroseconds is PostgreSQL's epoch, 2000-01-01 UTC, in microseconds
// since the Unix epoch.
const y2kMicroseconds = 946_684_800 * 1_000_000

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

// directResults reads the results of a batch exec sent, one statement
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
	if ok, tag, err := scanInt64s(rr, dest); ok {
		r.trace(sql, args, tag, err)
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

// scanInt64s scans the first row of rr into dest, as queryRow, when every
// destination is an *int64 and every column a bigint in binary (the fenced
// writes' counts), without pgx's scan plans; otherwise it reports false
// and reads nothing.
func scanInt64s(rr *pgconn.ResultReader, dest []any) (ok bool, tag pgconn.CommandTag, err error) {
	fds := rr.FieldDescriptions()
	if len(fds) != len(dest) {
		return false, tag, nil
	}
	for i, fd := range fds {
		if _, ok := dest[i].(*int64); !ok || fd.DataTypeOID != pgtype.Int8OID || fd.Format != pgtype.BinaryFormatCode {
			return false, tag, nil
		}
	}
	found := rr.NextRow()
	if found {
		for i, v := range rr.Values() {
			if len(v) != 8 {
				err = fmt.Errorf("can't scan column %d (%s): %d bytes for a bigint", i, fds[i].Name, len(v))
				break
			}
			*dest[i].(*int64) = int64(binary.BigEndian.Uint64(v))
		}
	}
	tag, cerr := rr.Close()
	switch {
	case err != nil:
	case cerr != nil:
		err = cerr
	case !found:
		err = pgx.ErrNoRows
	}
	return true, tag, err
}

func (r *directResults) trace(sql string, args []any, tag pgconn.CommandTag, err error) {
	if r.tracer != nil {
		r.tracer.TraceBatchQuery(r.ctx, r.conn, pgx.TraceBatchQueryData{SQL: sql, Args: plainArgs(args), CommandTag: tag, Err: err})
	}
}

// readDirect reads c's results from r. A reservation's record is not
// decoded when its insert wrote one: the caller built it.
func (c *groupCall) readDirect(r *directResults) error {
	if c.members != nil {
		return c.readMany(r)
	}
	if c.find == "" {
		return r.queryRow(c.sql, c.args, c.dest)
	}
	tag, err := r.exec(c.sql, c.args)
	if err != nil {
		return err
	}
	c.inserted = tag.RowsAffected() == 1
	if c.inserted {
		_, err = r.exec(c.find, c.args[:reserveFindArgs])
		return err
	}
	c.found = new(recordScan)
	return r.queryRow(c.find, c.args[:reserveFindArgs], c.found.dest())
}
