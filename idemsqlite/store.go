// Package idemsqlite is the embedded default idem store: one SQLite file in
// WAL mode, on database/sql with the pure-Go driver modernc.org/sqlite.
//
// Open configures the file for durability (synchronous=FULL by default, so a
// completed key survives power loss), serialises writes through one
// connection whose transactions begin IMMEDIATE, serves reads from a small
// read-only pool, and applies the embedded migrations. SQLite allows one
// writer at a time, so the store suits one process; several processes may
// share the file (maintenance, the CLI), waiting up to BusyTimeout for the
// lock.
//
// The store's writes commit in groups: writes that arrive while the writer
// is busy share the next transaction, and so one fsync, instead of queueing
// for one each (group commit, see batcher). A lone write commits at once;
// none is answered before the commit that holds it; one write's failure
// fails only that write. Config.MaxBatch bounds a group.
//
// CompleteTx completes a key inside the caller's transaction, so the
// completion commits or rolls back with the business writes (transactional
// mode).
package idemsqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/headerjson"
	"github.com/idem-dev/idem/internal/neverstored"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Default batch sizes, as documented on the idemstore params.
const (
	defaultSweepLimit = 1000
	defaultReapLimit  = 1000
	defaultListLimit  = 100
)

// Store is an idemstore.Store on SQLite.
type Store struct {
	cfg Config
	// db takes the writes; rdb serves reads. They are the same pool when the
	// store was made by New.
	db, rdb *sql.DB
	// owned reports that Close closes the pools (Open made them).
	owned bool
	// batch groups the store's writes into shared transactions (group
	// commit, batch.go).
	batch *batcher
	// wst and rst are the statements prepared on db and rdb (prepared.go);
	// empty for a store made by New.
	wst, rst statements
	// seen steers KeyReserve between reading first and writing first
	// (readFirst); pin, when set (tests), fixes the choice: 1 reads first,
	// -1 writes first.
	seen atomic.Int32
	pin  int
}

var _ idemstore.Store = (*Store)(nil)

// Open opens (creating it if needed) the SQLite database at path, configures
// it (WAL, busy timeout, foreign keys, synchronous) and applies the pending
// migrations. Close the store when done.
func Open(path string, cfg *Config) (*Store, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if path == "" || path == ":memory:" || strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("idemsqlite: Open(%q): want a file path (for memory use idemmem)", path)
	}
	q := url.Values{}
	q.Set("_busy_timeout", strconv.FormatInt(c.BusyTimeout.Milliseconds(), 10))
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", c.Synchronous)
	q.Set("_foreign_keys", "1")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: opening %s: %w", path, err)
	}
	// One writer connection: SQLite admits one writer at a time anyway, and
	// queueing in the pool beats polling for the lock in the busy handler.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)

	s := &Store{cfg: c, db: db, rdb: db, owned: true, batch: &batcher{db: db, max: c.MaxBatch}}
	ctx, cancel := context.WithTimeout(context.Background(), c.BusyTimeout+10*time.Second)
	defer cancel()
	if _, err := s.Migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("idemsqlite: opening %s: %w", path, err)
	}

	rq := url.Values{}
	rq.Set("_busy_timeout", strconv.FormatInt(c.BusyTimeout.Milliseconds(), 10))
	rq.Set("_query_only", "1")
	rdb, err := sql.Open("sqlite", path+"?"+rq.Encode())
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("idemsqlite: opening %s: %w", path, err)
	}
	rdb.SetMaxOpenConns(c.MaxReadConns)
	rdb.SetMaxIdleConns(c.MaxReadConns)
	s.rdb = rdb
	if s.wst, err = prepareAll(ctx, db, writeStatements); err == nil {
		s.rst, err = prepareAll(ctx, rdb, readStatements)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("idemsqlite: opening %s: preparing statements: %w", path, err), s.Close())
	}
	return s, nil
}

// New returns a Store on db, which the caller owns and closes. It does not
// migrate: call Migrate. db should be opened in WAL mode with a busy timeout
// and "_txlock=immediate", so that the store's read-then-write transactions
// take the write lock up front; with several connections and deferred
// transactions, concurrent reservations can fail with SQLITE_BUSY.
func New(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("idemsqlite: New: nil *sql.DB")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Store{cfg: c, db: db, rdb: db, batch: &batcher{db: db, max: c.MaxBatch}}, nil
}

// Close closes the connections Open made. For a store made by New it does
// nothing: the caller owns the *sql.DB.
func (s *Store) Close() error {
	if !s.owned {
		return nil
	}
	err := errors.Join(s.wst.close(), s.rst.close(), s.rdb.Close())
	if s.rdb != s.db {
		err = errors.Join(err, s.db.Close())
	}
	return err
}

// DB returns the pool the store writes through. Transactions begun on it
// hold SQLite's write lock (they begin IMMEDIATE when the store was opened
// by Open), so keep them short: the store's own writes wait for them.
func (s *Store) DB() *sql.DB { return s.db }

// now reads the store's clock at the microsecond precision of the columns.
func (s *Store) now() time.Time {
	return time.UnixMicro(s.cfg.Now().UnixMicro()).UTC()
}

// querier is what the store's statements run on: the pools, or a caller's
// transaction.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ querier = (*sql.DB)(nil)
	_ querier = (*sql.Tx)(nil)
	_ querier = (*sql.Conn)(nil)
)

// rowScanner is *sql.Row or *sql.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}

// scanRecord reads the recordColumns of one row.
func scanRecord(row rowScanner) (*idemstore.Record, error) {
	var (
		r                                               idemstore.Record
		state, les                                      string
		lockedUntil, startedAt, created, updated, until int64
		ttl, reconcileAfter                             int64
		status                                          sql.NullInt64
		header                                          sql.NullString
		body                                            []byte
		notReplayable                                   int64
	)
	err := row.Scan(&r.Scope, &r.Endpoint, &r.Key, &r.Fingerprint, &state, &r.Token, &lockedUntil, &startedAt,
		&les, &status, &header, &body, &notReplayable, &r.RecoveryPoint, &r.Attempts, &created, &updated, &until,
		&ttl, &reconcileAfter, &r.ReconcileAttempts, &r.ReconcileError)
	if err != nil {
		return nil, err
	}
	r.State = idemstore.State(state)
	r.LeaseExpiredState = idemstore.State(les)
	r.LockedUntil = fromMicros(lockedUntil)
	r.StartedAt = fromMicros(startedAt)
	r.CreatedAt = fromMicros(created)
	r.UpdatedAt = fromMicros(updated)
	r.ExpiresAt = fromMicros(until)
	r.TTL = time.Duration(ttl) * time.Microsecond
	if reconcileAfter != 0 {
		r.ReconcileAfter = fromMicros(reconcileAfter)
	}
	r.NotReplayable = notReplayable != 0
	if status.Valid {
		r.Response = &idemstore.Response{Status: int(status.Int64), Body: body}
		if header.Valid {
			h, err := headerjson.Decode(header.String)
			if err != nil {
				return nil, fmt.Errorf("decoding the stored header of record %s: %w", r.LogHash(), err)
			}
			r.Response.Header, r.Response.Sealed = neverstored.Unpack(h)
		}
		if r.Response.Body == nil {
			r.Response.Body = []byte{}
		}
	}
	return &r, nil
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func micros(t time.Time) int64 { return t.UnixMicro() }

// responseArgs are the status, header JSON, body and not_replayable columns
// that store resp (nil: not replayable).
func responseArgs(resp *idemstore.Response, notReplayable bool) (status, header, body, nr any, err error) {
	if notReplayable || resp == nil {
		return nil, nil, nil, 1, nil
	}
	h := neverstored.Pack(resp.Header, resp.Sealed)
	if h == nil {
		h = http.Header{}
	}
	b, err := headerjson.Encode(h)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("encoding the response header: %w", err)
	}
	rb := resp.Body
	if rb == nil {
		rb = []byte{}
	}
	return resp.Status, string(b), rb, 0, nil
}

// leaseExpiredState is the state an expired lease turns into, given the
// record's (or the reservation's) LeaseExpiredState: unknown unless released.
func leaseExpiredState(s idemstore.State) idemstore.State {
	if s == idemstore.StateReleased {
		return idemstore.StateReleased
	}
	return idemstore.StateUnknown
}

// view is r as a reader sees it at now: an expired lease in the state it
// turns into.
func view(r *idemstore.Record, now time.Time) *idemstore.Record {
	if r.LeaseExpired(now) {
		r.State = leaseExpiredState(r.LeaseExpiredState)
	}
	return r
}

// getRaw reads the record of id as stored, or returns nil when it is missing
// or expired at now (idemstore.Record.Expired: never when unknown).
func getRaw(ctx context.Context, q querier, id idemstore.Identity, now time.Time) (*idemstore.Record, error) {
	r, err := scanRecord(q.QueryRowContext(ctx, selectKey, id.Scope, id.Endpoint, id.Key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if r.Expired(now) {
		return nil, nil
	}
	return r, nil
}

// needsWrite reports whether a reservation with p finding r must write:
// r is missing, its lease expired, or it is released for p's fingerprint.
func needsWrite(r *idemstore.Record, p *idemstore.ReserveParams, now time.Time) bool {
	return r == nil || r.LeaseExpired(now) ||
		(r.State == idemstore.StateReleased && r.Fingerprint == p.Fingerprint)
}

// KeyReserve implements idemstore.Store. A record that needs no write (a
// replay, a key in use, a reused key) is answered from the read pool without
// taking the write lock; otherwise one write of the group commit makes the
// reservation. A key the read found free (the common case: a new key) is
// inserted at once, by a statement that also replaces an expired record and
// does nothing to a live one, which the write then reads and settles as a
// key found taken would be.
//
// While reservations keep finding new keys, the read is skipped: it would
// find nothing, and the write finds what it would have found (see
// readFirst).
func (s *Store) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	free := true
	if s.readFirst() {
		now := s.now()
		r, err := getRaw(ctx, s.reader(), p.Identity, now)
		if err != nil {
			return nil, interpretError("reserving key", err)
		}
		if !needsWrite(r, p, now) {
			s.found(true)
			return &idemstore.ReserveResult{Record: r}, nil
		}
		free = r == nil
	}

	var res *idemstore.ReserveResult
	err := s.writeTx(ctx, true, func(ctx context.Context, tx querier) error {
		now := s.now()
		if free {
			// Another write may have taken the key since the read (or
			// there was no read): then the insert changes nothing and the
			// record is read below.
			r, err := s.insert(ctx, tx, p, now)
			if err != nil || r != nil {
				res = &idemstore.ReserveResult{Reserved: r != nil, Record: r}
				return err
			}
		}
		r, err := getRaw(ctx, tx, p.Identity, now)
		if err != nil {
			return err
		}
		if r == nil {
			if r, err = s.insert(ctx, tx, p, now); err == nil && r == nil {
				err = fmt.Errorf("record %s is neither live nor replaceable", p.Identity.LogHash())
			}
			res = &idemstore.ReserveResult{Reserved: true, Record: r}
			return err
		}
		// Each branch writes at most once, so that a write that fails
		// leaves nothing behind (see batcher).
		takeover := r.Fingerprint == p.Fingerprint && (r.State == idemstore.StateReleased ||
			r.LeaseExpired(now) && leaseExpiredState(r.LeaseExpiredState) == idemstore.StateReleased)
		switch {
		case takeover: // takeoverKey also takes an expired lease that turns released
			r, err = scanRecord(tx.QueryRowContext(ctx, takeoverKey, p.Scope, p.Endpoint, p.Key, p.Token,
				micros(now.Add(p.Lease)), micros(now), string(leaseExpiredState(p.LeaseExpiredState))))
		case r.LeaseExpired(now):
			r, err = scanRecord(tx.QueryRowContext(ctx, expireLease, p.Scope, p.Endpoint, p.Key, micros(now)))
		}
		res = &idemstore.ReserveResult{Reserved: takeover, Record: r}
		return err
	})
	if err != nil {
		return nil, interpretError("reserving key", err)
	}
	s.found(!res.Reserved)
	return res, nil
}

// Reading first.
//
// A reservation that finds a record needing no write (a replay, a key in
// use) is best answered by a read on the read pool, off the one writer; a
// new key is best written at once, as the read before would find nothing
// and cost about a tenth of the reservation. KeyReserve reads first while
// recent reservations found records: a found record raises seen by
// seenFound (up to seenMax), a reservation that wrote lowers it by one, and
// the reads stop at zero. Replays keep reading first even when one in
// seenFound+1 reservations finds a record; under new keys alone the read
// stops within seenMax reservations of the last replay. Either way the
// write settles every case as the read would, so this steers only cost.
const (
	seenFound = 16
	seenMax   = 256
)

// readFirst reports whether KeyReserve reads before it writes.
func (s *Store) readFirst() bool {
	if s.pin != 0 {
		return s.pin > 0
	}
	return s.seen.Load() > 0
}

// found records that a reservation found a record needing no write (true)
// or wrote (false).
func (s *Store) found(record bool) {
	for {
		n := s.seen.Load()
		m := max(n-1, 0)
		if record {
			m = min(n+seenFound, seenMax)
		}
		if m == n || s.seen.CompareAndSwap(n, m) {
			return
		}
	}
}

// insert creates p's record at now, replacing an expired one, and returns
// it, or nil when the key holds a live record (which it leaves as it is).
func (s *Store) insert(ctx context.Context, tx querier, p *idemstore.ReserveParams, now time.Time) (*idemstore.Record, error) {
	les := leaseExpiredState(p.LeaseExpiredState)
	r := &idemstore.Record{
		Identity:          p.Identity,
		Fingerprint:       p.Fingerprint,
		State:             idemstore.StateInProgress,
		Token:             p.Token,
		LockedUntil:       fromMicros(micros(now.Add(p.Lease))),
		StartedAt:         now,
		LeaseExpiredState: les,
		Attempts:          1,
		CreatedAt:         now,
		UpdatedAt:         now,
		ExpiresAt:         fromMicros(micros(now.Add(p.TTL))),
		TTL:               time.Duration(p.TTL.Microseconds()) * time.Microsecond,
	}
	res, err := tx.ExecContext(ctx, insertKey, p.Scope, p.Endpoint, p.Key, p.Fingerprint, p.Token,
		micros(r.LockedUntil), micros(now), string(les), micros(r.ExpiresAt), p.TTL.Microseconds())
	if err != nil {
		return nil, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return nil, err
	}
	return r, nil
}

// writeTx runs f in a write transaction, which it may share with other
// writes that arrive together (group commit, see batcher), and returns once
// that transaction committed (nil or f's error) or failed. f's writes
// commit when f succeeds and are undone when it fails; f writes only
// through tx (which runs the prepared statements through their
// preparation), with the ctx it is given. atomic marks f as a write whose
// last statement is the only one that writes and that returns
// idemstore.ErrLeaseLost only when that statement changed nothing: it runs
// without a savepoint. f may run more than once (see batcher).
func (s *Store) writeTx(ctx context.Context, atomic bool, f func(ctx context.Context, tx querier) error) error {
	return s.batch.do(ctx, atomic, func(ctx context.Context, tx *sql.Tx) error {
		return f(ctx, preparedQuerier{q: tx, tx: tx, st: s.wst, txst: s.batch.stmts})
	})
}

// reader returns the read pool, with its prepared statements.
func (s *Store) reader() querier { return preparedQuerier{q: s.rdb, st: s.rst} }

// rollback rolls tx back, ignoring that it is already done.
func rollback(tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// KeyGet implements idemstore.Store.
func (s *Store) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	now := s.now()
	r, err := getRaw(ctx, s.reader(), id, now)
	if err != nil {
		return nil, interpretError("getting key", err)
	}
	if r == nil {
		return nil, idemstore.ErrNotFound
	}
	return view(r, now), nil
}

// KeyComplete implements idemstore.Store.
func (s *Store) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	status, header, body, nr, err := responseArgs(p.Response, p.NotReplayable)
	if err != nil {
		return err
	}
	return s.fencedWrite(ctx, "completing key", completeKey, p.Identity, p.Token, status, header, body, nr)
}

// fencedWrite runs one fenced write (see fenced) in a write transaction.
func (s *Store) fencedWrite(ctx context.Context, op, query string, id idemstore.Identity, token string, extra ...any) error {
	return interpretError(op, s.writeTx(ctx, true, func(ctx context.Context, tx querier) error {
		return s.fenced(ctx, tx, query, id, token, extra...)
	}))
}

// fencedExec runs one fenced write (see fenced) on q.
func (s *Store) fencedExec(ctx context.Context, q querier, op, query string, id idemstore.Identity, token string, extra ...any) error {
	return interpretError(op, s.fenced(ctx, q, query, id, token, extra...))
}

// fenced runs one fenced write with the identity as ?1-?3, the token as ?4,
// now as ?5 and extra from ?6 on, and returns idemstore.ErrLeaseLost when it
// changed no row.
func (s *Store) fenced(ctx context.Context, q querier, query string, id idemstore.Identity, token string, extra ...any) error {
	args := append([]any{id.Scope, id.Endpoint, id.Key, token, micros(s.now())}, extra...)
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// KeyRelease implements idemstore.Store.
func (s *Store) KeyRelease(ctx context.Context, p *idemstore.FinishParams) error {
	return s.fencedWrite(ctx, "releasing key", releaseKey, p.Identity, p.Token)
}

// KeyMarkUnknown implements idemstore.Store.
func (s *Store) KeyMarkUnknown(ctx context.Context, p *idemstore.FinishParams) error {
	return s.fencedWrite(ctx, "marking key unknown", markUnknownKey, p.Identity, p.Token)
}

// KeyDelete implements idemstore.Store.
func (s *Store) KeyDelete(ctx context.Context, p *idemstore.FinishParams) error {
	return s.fencedWrite(ctx, "deleting key", deleteKey, p.Identity, p.Token)
}

// KeyRenew implements idemstore.Store.
func (s *Store) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	return s.fencedWrite(ctx, "renewing key", renewKey, p.Identity, p.Token, micros(s.now().Add(p.Lease)))
}

// KeyResolve implements idemstore.Store.
func (s *Store) KeyResolve(ctx context.Context, p *idemstore.ResolveParams) error {
	if p.To != idemstore.StateCompleted && p.To != idemstore.StateReleased {
		return idemstore.ErrInvalidState
	}
	var status, header, body, nr any = nil, nil, nil, 0
	if p.To == idemstore.StateCompleted {
		var err error
		if status, header, body, nr, err = responseArgs(p.Response, false); err != nil {
			return err
		}
	}
	err := s.writeTx(ctx, false, func(ctx context.Context, tx querier) error {
		now := s.now()
		r, err := getRaw(ctx, tx, p.Identity, now)
		switch {
		case err != nil:
			return err
		case r == nil:
			return idemstore.ErrNotFound
		case r.Token != p.Token:
			return idemstore.ErrLeaseLost
		case view(r, now).State != idemstore.StateUnknown:
			return idemstore.ErrInvalidState
		}
		_, err = tx.ExecContext(ctx, resolveKey, p.Scope, p.Endpoint, p.Key, string(p.To), micros(now), status, header, body, nr)
		return err
	})
	return interpretError("resolving key", err)
}

// KeySweep implements idemstore.Store.
func (s *Store) KeySweep(ctx context.Context, p *idemstore.SweepParams) ([]*idemstore.Record, error) {
	rows, err := s.db.QueryContext(ctx, sweepKeys, micros(s.now()), cmp.Or(p.Limit, defaultSweepLimit))
	if err != nil {
		return nil, interpretError("sweeping keys", err)
	}
	recs, err := scanRecords(rows)
	return recs, interpretError("sweeping keys", err)
}

// KeyReap implements idemstore.Store.
func (s *Store) KeyReap(ctx context.Context, p *idemstore.ReapParams) (int, error) {
	res, err := s.db.ExecContext(ctx, reapKeys, micros(s.now()), cmp.Or(p.Limit, defaultReapLimit))
	if err != nil {
		return 0, interpretError("reaping keys", err)
	}
	n, err := res.RowsAffected()
	return int(n), interpretError("reaping keys", err)
}

// KeyList implements idemstore.Store. The State filter and the listed
// states see expired leases in the state they turn into, as KeyGet does.
func (s *Store) KeyList(ctx context.Context, p *idemstore.ListParams) ([]*idemstore.Record, error) {
	now := s.now()
	var query strings.Builder
	query.WriteString(listKeys)
	args := []any{micros(now)}
	arg := func(v any) string {
		args = append(args, v)
		return "?" + strconv.Itoa(len(args))
	}
	if p.State != "" {
		query.WriteString(" AND " + effectiveState + " = " + arg(string(p.State)))
	}
	if p.Scope != "" {
		query.WriteString(" AND scope = " + arg(p.Scope))
	}
	if p.Endpoint != "" {
		query.WriteString(" AND endpoint = " + arg(p.Endpoint))
	}
	if !p.CreatedBefore.IsZero() {
		// Strictly before; created_at is whole microseconds, so a bound
		// with a fraction of one keeps the microsecond it falls in.
		us := p.CreatedBefore.UnixMicro()
		if p.CreatedBefore.After(time.UnixMicro(us)) {
			us++
		}
		query.WriteString(" AND created_at < " + arg(us))
	}
	if p.After != nil {
		query.WriteString(" AND (scope, endpoint, key) > (" + arg(p.After.Scope) + ", " + arg(p.After.Endpoint) + ", " + arg(p.After.Key) + ")")
	}
	query.WriteString(" ORDER BY scope, endpoint, key LIMIT " + arg(cmp.Or(p.Limit, defaultListLimit)))

	rows, err := s.rdb.QueryContext(ctx, query.String(), args...)
	if err != nil {
		return nil, interpretError("listing keys", err)
	}
	recs, err := scanRecords(rows)
	if err != nil {
		return nil, interpretError("listing keys", err)
	}
	for _, r := range recs {
		view(r, now)
	}
	return recs, nil
}

// KeyPurge implements idemstore.Store.
func (s *Store) KeyPurge(ctx context.Context, p *idemstore.PurgeParams) (*idemstore.Record, error) {
	var purged *idemstore.Record
	err := s.writeTx(ctx, false, func(ctx context.Context, tx querier) error {
		now := s.now()
		r, err := getRaw(ctx, tx, p.Identity, now)
		switch {
		case err != nil:
			return err
		case r == nil:
			return idemstore.ErrNotFound
		case p.Token != "" && r.Token != p.Token:
			return idemstore.ErrLeaseLost
		}
		r = view(r, now)
		if !p.Force && (r.State == idemstore.StateUnknown || r.State == idemstore.StateInProgress) {
			return idemstore.ErrInvalidState
		}
		if _, err := tx.ExecContext(ctx, purgeKey, p.Scope, p.Endpoint, p.Key); err != nil {
			return err
		}
		purged = r
		return nil
	})
	if err != nil {
		return nil, interpretError("purging key", err)
	}
	return purged, nil
}

// KeyReconcileClaim implements idemstore.Store.
func (s *Store) KeyReconcileClaim(ctx context.Context, p *idemstore.ReconcileClaimParams) ([]*idemstore.Record, error) {
	now := s.now()
	rows, err := s.db.QueryContext(ctx, claimKeys, micros(now), micros(now.Add(p.Hold)), cmp.Or(p.Limit, defaultListLimit), p.Grace.Microseconds())
	if err != nil {
		return nil, interpretError("claiming unknown keys", err)
	}
	recs, err := scanRecords(rows)
	if err != nil {
		return nil, interpretError("claiming unknown keys", err)
	}
	sortClaimed(recs)
	return recs, nil
}

// sortClaimed orders claimed records as they were picked (RETURNING has no
// order): the longest unknown first.
func sortClaimed(recs []*idemstore.Record) {
	slices.SortFunc(recs, func(a, b *idemstore.Record) int {
		return cmp.Or(a.UpdatedAt.Compare(b.UpdatedAt), strings.Compare(a.Scope, b.Scope),
			strings.Compare(a.Endpoint, b.Endpoint), strings.Compare(a.Key, b.Key))
	})
}

// KeyReconcileFail implements idemstore.Store.
func (s *Store) KeyReconcileFail(ctx context.Context, p *idemstore.ReconcileFailParams) error {
	return s.fencedWrite(ctx, "recording a reconciliation failure", failReconcileKey, p.Identity, p.Token,
		idemstore.TruncateReconcileError(p.Error), micros(s.now().Add(p.Delay)))
}

// KeyBacklog implements idemstore.Store.
func (s *Store) KeyBacklog(ctx context.Context) (*idemstore.Backlog, error) {
	var (
		n      int
		oldest int64
	)
	if err := s.rdb.QueryRowContext(ctx, backlogKeys).Scan(&n, &oldest); err != nil {
		return nil, interpretError("counting unknown keys", err)
	}
	b := &idemstore.Backlog{Unknown: n}
	if n > 0 {
		b.OldestUnknownSince = fromMicros(oldest)
	}
	return b, nil
}

// scanRecords reads and closes rows.
func scanRecords(rows *sql.Rows) ([]*idemstore.Record, error) {
	defer rows.Close()
	var recs []*idemstore.Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	return recs, rows.Err()
}
