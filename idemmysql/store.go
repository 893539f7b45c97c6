// Package idemmysql is the MySQL store of idem, for MySQL 8 and MariaDB
// 10.6+, on database/sql with github.com/go-sql-driver/mysql: for services
// whose data lives in MySQL.
//
// Records live in one table, idem_keys, created by the embedded migrations
// (Store.Migrate) in the connection's database. Identities, fingerprints
// and tokens are VARBINARY columns, so keys compare byte for byte whatever
// the server's collations: MySQL's default ones are case-insensitive and
// pad spaces, which would make Order-1, order-1 and "order-1 " one key.
//
// Every connection runs at READ COMMITTED (NewConnector): the default,
// REPEATABLE READ, takes gap locks on which concurrent reservations of new
// keys deadlock. A reservation is one round trip, an INSERT that adds the
// record only when no row has its identity and the SELECT that reads it
// back, sent together: a new key is one index lookup and an insert, and a
// replay two lookups that neither write nor lock (MySQL has no RETURNING on
// UPDATE; see queries.sql). Re-claiming a released or expired record is a
// second round trip (the rare path). Writes that finish an attempt are one
// UPDATE each, conditional on the fencing token. A deadlock or a lock wait
// timeout is run again within the call's context; it never reaches the
// caller as an outcome, and a reservation run again is decided by whether
// the record carries the attempt's token, so it never reserves twice.
//
// CompleteTx and CheckpointTx run the same fenced writes inside the
// caller's *sql.Tx, so a key's completion commits or rolls back with the
// business writes (transactional mode and phased operations).
//
// Time comes from the store's clock (Config.Now) and is passed to every
// statement; the server's NOW() is never used. Times are stored as UTC
// DATETIME(6), to the microsecond.
package idemmysql

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/headerjson"
	"github.com/idem-dev/idem/internal/neverstored"
)

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Now is the store's clock. Defaults to time.Now.
	Now func() time.Time
	// MaxConns bounds the connections of a pool made by Open. Defaults to
	// DefaultMaxConns.
	MaxConns int
}

// DefaultMaxConns is the default Config.MaxConns.
const DefaultMaxConns = 16

// withDefaults returns a copy of cfg (which may be nil) with every zero field
// set to its default. It is the only place defaults are applied.
func (cfg *Config) withDefaults() Config {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	return c
}

// Default batch and page sizes of KeySweep, KeyReap and KeyList.
const (
	defaultBatch     = 1000
	defaultListLimit = 100
)

// maxReserveTries bounds the round trips of KeyReserve that find a record
// it may re-claim but did not: each follows a concurrent change.
const maxReserveTries = 10

// Limits of the columns, in bytes: longer values are refused rather than
// cut (a cut identity would be another record's).
const (
	maxScopeLen    = 512  // scope
	maxEndpointLen = 2048 // endpoint
	maxKeyLen      = 512  // key
	maxTokenLen    = 255  // token, fingerprint
	maxPointLen    = 1024 // recovery_point
)

// Store is the MySQL idem store. It is safe for concurrent use.
type Store struct {
	db    *sql.DB
	cfg   Config
	owned bool // Close closes db (Open made it)
}

var _ idemstore.Store = (*Store)(nil)

// NewConnector returns a connector for sql.OpenDB on the MySQL or MariaDB
// server that dsn (go-sql-driver's form, user:pass@tcp(host:3306)/db)
// names, set up as the store needs whatever dsn says: DATETIME scanned as
// UTC time.Time (parseTime, loc=UTC), arguments interpolated into the
// statement so that one holds several and takes one round trip
// (interpolateParams, multiStatements), RowsAffected counting the rows
// matched rather than changed (clientFoundRows), and every session at
// READ COMMITTED. A pool shared by the application's own queries works the
// same way for them.
func NewConnector(dsn string) (driver.Connector, error) {
	mcfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("idemmysql: %w", err)
	}
	if mcfg.DBName == "" {
		return nil, errors.New("idemmysql: the DSN names no database")
	}
	mcfg.ParseTime = true
	mcfg.Loc = time.UTC
	mcfg.InterpolateParams = true
	mcfg.MultiStatements = true
	mcfg.ClientFoundRows = true
	base, err := mysql.NewConnector(mcfg)
	if err != nil {
		return nil, fmt.Errorf("idemmysql: %w", err)
	}
	return &connector{base: base}, nil
}

// connector sets up each new connection's session.
type connector struct{ base driver.Connector }

// sessionSetup runs on every new connection. SET SESSION TRANSACTION works
// on MySQL and MariaDB alike, where the variable's name differs
// (transaction_isolation, tx_isolation).
const sessionSetup = `SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED`

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("idemmysql: the driver's connection %T cannot run statements", conn)
	}
	if _, err := ex.ExecContext(ctx, sessionSetup, nil); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

func (c *connector) Driver() driver.Driver { return c.base.Driver() }

// Open opens a pool of at most cfg.MaxConns connections on dsn
// (NewConnector), checks that the server answers and returns a store on it,
// which Close closes. cfg may be nil. It does not migrate: call Migrate.
func Open(ctx context.Context, dsn string, cfg *Config) (*Store, error) {
	c, err := NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(c)
	s := New(db, cfg)
	db.SetMaxOpenConns(s.cfg.MaxConns)
	db.SetMaxIdleConns(s.cfg.MaxConns)
	db.SetConnMaxLifetime(5 * time.Minute)
	s.owned = true
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("idemmysql: %w", err)
	}
	return s, nil
}

// New returns a store on db, which the caller owns and closes, opened with
// sql.OpenDB(NewConnector(dsn)): the store's statements need its settings.
// cfg may be nil (Config.MaxConns does not apply). The database must have
// been migrated (Migrate) before the store is used.
func New(db *sql.DB, cfg *Config) *Store {
	return &Store{db: db, cfg: cfg.withDefaults()}
}

// DB returns the store's pool, for the application's own queries.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the pool Open made; for a store made by New it does
// nothing.
func (s *Store) Close() error {
	if !s.owned {
		return nil
	}
	return s.db.Close()
}

// querier is what the pool, a connection and a transaction have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ querier = (*sql.DB)(nil)
	_ querier = (*sql.Tx)(nil)
	_ querier = (*sql.Conn)(nil)
)

// now reads the store's clock at the columns' precision, so times computed
// here compare exactly with the stored ones.
func (s *Store) now() time.Time {
	return s.cfg.Now().UTC().Truncate(time.Microsecond)
}

// at is t at the columns' precision.
func at(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// idArgs are the arguments that name id's record.
func idArgs(id idemstore.Identity, now time.Time) args {
	return args{"scope": bin(id.Scope), "endpoint": bin(id.Endpoint), "key": bin(id.Key), "now": now}
}

// checkLengths refuses a reservation whose values the columns cannot hold.
func checkLengths(p *idemstore.ReserveParams) error {
	for _, f := range []struct {
		what string
		n    int
		max  int
	}{
		{"scope", len(p.Scope), maxScopeLen},
		{"endpoint", len(p.Endpoint), maxEndpointLen},
		{"key", len(p.Key), maxKeyLen},
		{"fingerprint", len(p.Fingerprint), maxTokenLen},
		{"token", len(p.Token), maxTokenLen},
	} {
		if f.n > f.max {
			return fmt.Errorf("the %s is %d bytes, more than the %d the MySQL store keeps", f.what, f.n, f.max)
		}
	}
	return nil
}

// KeyReserve inserts a new in_progress record or re-claims a released or
// expired one, and otherwise returns the existing record without writing to
// it. A replay or a new key is one round trip ("reserve" in queries.sql); a
// record that one finds but may be re-claimed (claimable) takes a second,
// "reclaim", which also does everything the first does. The attempt holds
// the lease when the record read back carries its token: tokens are new for
// every attempt, so only its own insert or takeover can have put it there,
// and a round trip run again (after a deadlock) cannot reserve twice.
func (s *Store) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	les := p.LeaseExpiredState
	if les == "" {
		les = idemstore.StateUnknown
	}
	if les != idemstore.StateUnknown && les != idemstore.StateReleased {
		return nil, fmt.Errorf("reserving key: lease expired state %q is not unknown or released", les)
	}
	if err := checkLengths(p); err != nil {
		return nil, fmt.Errorf("reserving key: %w", err)
	}
	now := s.now()
	a := idArgs(p.Identity, now)
	a["fingerprint"] = bin(p.Fingerprint)
	a["token"] = bin(p.Token)
	a["locked_until"] = at(now.Add(p.Lease))
	a["expires_at"] = at(now.Add(p.TTL))
	a["les"] = string(les)
	a["ttl"] = p.TTL.Microseconds()
	st := qReserve
	for range maxReserveTries {
		var rec *idemstore.Record
		err := s.retry(ctx, func() error {
			var err error
			rec, err = s.queryRecord(ctx, s.db, st, a)
			return err
		})
		if errors.Is(err, sql.ErrNoRows) {
			continue // deleted between the insert and the read
		}
		if err != nil {
			return nil, fmt.Errorf("reserving key: %w", interpretError(err))
		}
		reserved := rec.State == idemstore.StateInProgress && rec.Token == p.Token
		if !reserved && claimable(rec, p.Fingerprint, now) {
			// Re-claimable: reserve leaves it to reclaim; found so by
			// reclaim, it changed between its statements.
			st = qReclaim
			continue
		}
		return &idemstore.ReserveResult{Reserved: reserved, Record: rec}, nil
	}
	return nil, fmt.Errorf("reserving key: record still changing after %d tries", maxReserveTries)
}

// claimable reports whether the reclaim statement would write rec.
func claimable(rec *idemstore.Record, fingerprint string, now time.Time) bool {
	if rec.Expired(now) || rec.LeaseExpired(now) {
		return true
	}
	return rec.State == idemstore.StateReleased && rec.Fingerprint == fingerprint
}

// queryRecord runs st, whose last statement reads one record, and returns
// it, or sql.ErrNoRows.
func (s *Store) queryRecord(ctx context.Context, q querier, st stmt, a args) (*idemstore.Record, error) {
	recs, err := s.queryRecords(ctx, q, st, a)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, sql.ErrNoRows
	}
	return recs[0], nil
}

// queryRecords runs st, whose last statement reads records, and returns
// them. The statements before it return no rows: the driver reads past
// their results, and returns the error of the first that fails.
func (s *Store) queryRecords(ctx context.Context, q querier, st stmt, a args) ([]*idemstore.Record, error) {
	query, qargs := st.bind(a)
	rows, err := q.QueryContext(ctx, query, qargs...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var recs []*idemstore.Record
	for rows.Next() {
		var rs recordScan
		if err := rows.Scan(rs.dest()...); err != nil {
			return nil, err
		}
		rec, err := rs.record()
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return recs, rows.Close()
}

// KeyGet returns the record, or idemstore.ErrNotFound. An in_progress record
// whose lease expired is reported in the state it turns into.
func (s *Store) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	now := s.now()
	var rec *idemstore.Record
	err := s.retry(ctx, func() error {
		var err error
		rec, err = s.get(ctx, s.db, id, now)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("getting key: %w", interpretError(err))
	}
	return rec, nil
}

// get reads a live record through q and reports it as it stands at now.
func (s *Store) get(ctx context.Context, q querier, id idemstore.Identity, now time.Time) (*idemstore.Record, error) {
	rec, err := s.queryRecord(ctx, q, qGet, idArgs(id, now))
	if err != nil {
		return nil, err
	}
	settle(rec, now)
	return rec, nil
}

// settle reports an in_progress record whose lease expired in the state it
// turns into.
func settle(rec *idemstore.Record, now time.Time) {
	if rec.LeaseExpired(now) {
		rec.State = rec.LeaseExpiredState
	}
}

// KeyComplete stores the response and moves an in_progress or unknown
// record to completed when the token matches.
func (s *Store) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	if err := s.complete(ctx, s.db, p); err != nil {
		return fmt.Errorf("completing key: %w", err)
	}
	return nil
}

func (s *Store) complete(ctx context.Context, q querier, p *idemstore.CompleteParams) error {
	resp, err := encodeResponse(p.Response, p.NotReplayable)
	if err != nil {
		return err
	}
	a := idArgs(p.Identity, s.now())
	a["token"] = bin(p.Token)
	resp.into(a)
	return s.fenced(ctx, q, qComplete, a)
}

// KeyRelease moves an in_progress or unknown record to released when the
// token matches, keeping its recovery point.
func (s *Store) KeyRelease(ctx context.Context, p *idemstore.FinishParams) error {
	if err := s.finish(ctx, qRelease, p); err != nil {
		return fmt.Errorf("releasing key: %w", err)
	}
	return nil
}

// KeyMarkUnknown moves an in_progress record to unknown when the token
// matches.
func (s *Store) KeyMarkUnknown(ctx context.Context, p *idemstore.FinishParams) error {
	if err := s.finish(ctx, qMarkUnknown, p); err != nil {
		return fmt.Errorf("marking key unknown: %w", err)
	}
	return nil
}

// KeyDelete removes an in_progress record when the token matches.
func (s *Store) KeyDelete(ctx context.Context, p *idemstore.FinishParams) error {
	if err := s.finish(ctx, qDelete, p); err != nil {
		return fmt.Errorf("deleting key: %w", err)
	}
	return nil
}

func (s *Store) finish(ctx context.Context, st stmt, p *idemstore.FinishParams) error {
	a := idArgs(p.Identity, s.now())
	a["token"] = bin(p.Token)
	return s.fenced(ctx, s.db, st, a)
}

// KeyRenew extends the lease of an in_progress record to now + p.Lease when
// the token matches.
func (s *Store) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	now := s.now()
	a := idArgs(p.Identity, now)
	a["token"] = bin(p.Token)
	a["locked_until"] = at(now.Add(p.Lease))
	if err := s.fenced(ctx, s.db, qRenew, a); err != nil {
		return fmt.Errorf("renewing key: %w", err)
	}
	return nil
}

// fenced runs a write conditional on the token. When it changes no record,
// the record is missing, belongs to another attempt or is in a state the
// write may not change: all three are idemstore.ErrLeaseLost for the
// attempt. On the pool a deadlock or lock wait timeout runs it again; in
// the caller's transaction it is the caller's to handle (a deadlock rolled
// the whole transaction back).
func (s *Store) fenced(ctx context.Context, q querier, st stmt, a args) error {
	query, qargs := st.bind(a)
	var n int64
	run := func() error {
		res, err := q.ExecContext(ctx, query, qargs...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	}
	var err error
	if q == querier(s.db) {
		err = s.retry(ctx, run)
	} else {
		err = run()
	}
	if err != nil {
		return interpretError(err)
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// KeyResolve settles an unknown record to completed or released.
func (s *Store) KeyResolve(ctx context.Context, p *idemstore.ResolveParams) error {
	if err := s.resolve(ctx, p); err != nil {
		return fmt.Errorf("resolving key: %w", err)
	}
	return nil
}

func (s *Store) resolve(ctx context.Context, p *idemstore.ResolveParams) error {
	var resp encodedResponse
	switch p.To {
	case idemstore.StateCompleted:
		var err error
		if resp, err = encodeResponse(p.Response, p.Response == nil); err != nil {
			return err
		}
	case idemstore.StateReleased:
	default:
		return fmt.Errorf("%w: cannot resolve to %q", idemstore.ErrInvalidState, p.To)
	}
	now := s.now()
	a := idArgs(p.Identity, now)
	a["token"] = bin(p.Token)
	a["state"] = string(p.To)
	resp.into(a)
	err := s.fenced(ctx, s.db, qResolve, a)
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	rec, err := s.get(ctx, s.db, p.Identity, now)
	switch {
	case err != nil:
		return interpretError(err)
	case rec.Token != p.Token:
		return idemstore.ErrLeaseLost
	default:
		return fmt.Errorf("%w: record is %s", idemstore.ErrInvalidState, rec.State)
	}
}

// KeyPurge deletes a record for an operator in one transaction: it locks
// the record, checks it may be purged, and deletes it.
func (s *Store) KeyPurge(ctx context.Context, p *idemstore.PurgeParams) (*idemstore.Record, error) {
	var purged *idemstore.Record
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		now := s.now()
		a := idArgs(p.Identity, now)
		rec, err := s.queryRecord(ctx, tx, qPurgeLock, a)
		if err != nil {
			return err
		}
		settle(rec, now)
		switch {
		case p.Token != "" && rec.Token != p.Token:
			return idemstore.ErrLeaseLost
		case !p.Force && (rec.State == idemstore.StateUnknown || rec.State == idemstore.StateInProgress):
			return fmt.Errorf("%w: the record is %s: purging it needs force", idemstore.ErrInvalidState, rec.State)
		}
		query, qargs := qPurge.bind(a)
		if _, err := tx.ExecContext(ctx, query, qargs...); err != nil {
			return err
		}
		purged = rec
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("purging key: %w", interpretError(err))
	}
	return purged, nil
}

// inTx runs f in a transaction of the store's own, committed when f
// succeeds, and runs it again after a deadlock or a lock wait timeout.
func (s *Store) inTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	return s.retry(ctx, func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := f(tx); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	})
}

// lockIDs runs st, which locks records and returns their identities.
func lockIDs(ctx context.Context, tx *sql.Tx, st stmt, a args) ([]idemstore.Identity, error) {
	query, qargs := st.bind(a)
	rows, err := tx.QueryContext(ctx, query, qargs...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []idemstore.Identity
	for rows.Next() {
		var id idemstore.Identity
		if err := rows.Scan(&id.Scope, &id.Endpoint, &id.Key); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// KeyReconcileClaim claims due unknown records with FOR UPDATE SKIP LOCKED,
// as the outbox relay claims rows: rows another claimer holds are skipped.
func (s *Store) KeyReconcileClaim(ctx context.Context, p *idemstore.ReconcileClaimParams) ([]*idemstore.Record, error) {
	limit := cmp.Or(max(p.Limit, 0), defaultListLimit)
	var recs []*idemstore.Record
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		now := s.now()
		graceEnd := time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC) // no grace: any lease's end
		if p.Grace > 0 {
			graceEnd = now.Add(-p.Grace)
		}
		ids, err := lockIDs(ctx, tx, qReconcileLock, args{"now": now, "limit": limit, "grace_end": at(graceEnd)})
		if err != nil || len(ids) == 0 {
			recs = nil
			return err
		}
		recs, err = s.queryRecords(ctx, tx, qReconcileClaim, args{"ids": ids, "hold": at(now.Add(p.Hold))})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claiming unknown keys: %w", interpretError(err))
	}
	// The longest unknown first.
	slices.SortFunc(recs, func(a, b *idemstore.Record) int {
		return cmp.Or(a.UpdatedAt.Compare(b.UpdatedAt), strings.Compare(a.Scope, b.Scope),
			strings.Compare(a.Endpoint, b.Endpoint), strings.Compare(a.Key, b.Key))
	})
	return recs, nil
}

// KeyReconcileFail records a failed reconciliation attempt, fenced on the
// token.
func (s *Store) KeyReconcileFail(ctx context.Context, p *idemstore.ReconcileFailParams) error {
	now := s.now()
	a := idArgs(p.Identity, now)
	a["token"] = bin(p.Token)
	a["error"] = bin(idemstore.TruncateReconcileError(p.Error))
	a["reconcile_after"] = at(now.Add(p.Delay))
	if err := s.fenced(ctx, s.db, qReconcileFail, a); err != nil {
		return fmt.Errorf("recording a reconciliation failure: %w", err)
	}
	return nil
}

// KeyBacklog counts the unknown records with one query on
// idem_keys_reconcile_idx.
func (s *Store) KeyBacklog(ctx context.Context) (*idemstore.Backlog, error) {
	var (
		n      int
		oldest sql.NullTime
	)
	query, qargs := qBacklog.bind(nil)
	err := s.retry(ctx, func() error {
		return s.db.QueryRowContext(ctx, query, qargs...).Scan(&n, &oldest)
	})
	if err != nil {
		return nil, fmt.Errorf("counting unknown keys: %w", interpretError(err))
	}
	b := &idemstore.Backlog{Unknown: n}
	if oldest.Valid {
		b.OldestUnknownSince = oldest.Time.UTC()
	}
	return b, nil
}

// KeySweep turns at most p.Limit in_progress records whose lease expired
// into their LeaseExpiredState and returns them. Rows another transaction
// holds are skipped.
func (s *Store) KeySweep(ctx context.Context, p *idemstore.SweepParams) ([]*idemstore.Record, error) {
	limit := cmp.Or(max(p.Limit, 0), defaultBatch)
	var recs []*idemstore.Record
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		now := s.now()
		ids, err := lockIDs(ctx, tx, qSweepLock, args{"now": now, "limit": limit})
		if err != nil || len(ids) == 0 {
			recs = nil
			return err
		}
		recs, err = s.queryRecords(ctx, tx, qSweep, args{"ids": ids, "now": now})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sweeping keys: %w", interpretError(err))
	}
	return recs, nil
}

// KeyReap deletes at most p.Limit records past their ExpiresAt, never an
// unknown one, skipping rows another transaction holds.
func (s *Store) KeyReap(ctx context.Context, p *idemstore.ReapParams) (int, error) {
	limit := cmp.Or(max(p.Limit, 0), defaultBatch)
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		now := s.now()
		ids, err := lockIDs(ctx, tx, qReapDone, args{"now": now, "limit": limit})
		if err != nil {
			return err
		}
		if len(ids) < limit {
			live, err := lockIDs(ctx, tx, qReapLive, args{"now": now, "limit": limit - len(ids)})
			if err != nil {
				return err
			}
			ids = append(ids, live...)
		}
		if len(ids) == 0 {
			n = 0
			return nil
		}
		query, qargs := qReap.bind(args{"ids": ids})
		res, err := tx.ExecContext(ctx, query, qargs...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("reaping keys: %w", interpretError(err))
	}
	return int(n), nil
}

// KeyList returns live records ordered by (Scope, Endpoint, Key), a page of
// at most p.Limit after the cursor p.After. The State filter and the listed
// states see expired leases in the state they turn into, as KeyGet does.
func (s *Store) KeyList(ctx context.Context, p *idemstore.ListParams) ([]*idemstore.Record, error) {
	now := s.now()
	a := args{"now": now}
	recs, err := s.queryRecordsRetry(ctx, compile(listSQL(p, a)), a)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", interpretError(err))
	}
	for _, rec := range recs {
		settle(rec, now)
	}
	return recs, nil
}

// listSQL returns the SQL of KeyList for p, adding the filters' arguments
// to a.
func listSQL(p *idemstore.ListParams, a args) string {
	var b strings.Builder
	b.WriteString(listHead)
	if p.State != "" {
		b.WriteString(" AND " + stateNow + " = :state")
		a["state"] = string(p.State)
	}
	if p.Scope != "" {
		b.WriteString(" AND k.scope = :scope")
		a["scope"] = bin(p.Scope)
	}
	if p.Endpoint != "" {
		b.WriteString(" AND k.endpoint = :endpoint")
		a["endpoint"] = bin(p.Endpoint)
	}
	if !p.CreatedBefore.IsZero() {
		// Strictly before; created_at is whole microseconds, so a bound
		// with a fraction of one keeps the microsecond it falls in.
		cb := at(p.CreatedBefore)
		if p.CreatedBefore.After(cb) {
			cb = cb.Add(time.Microsecond)
		}
		b.WriteString(" AND k.created_at < :created_before")
		a["created_before"] = cb
	}
	if p.After != nil {
		b.WriteString(" AND (k.scope, k.endpoint, k.idem_key) > (:after_scope, :after_endpoint, :after_key)")
		a["after_scope"] = bin(p.After.Scope)
		a["after_endpoint"] = bin(p.After.Endpoint)
		a["after_key"] = bin(p.After.Key)
	}
	b.WriteString(" ORDER BY k.scope, k.endpoint, k.idem_key LIMIT :limit")
	a["limit"] = cmp.Or(max(p.Limit, 0), defaultListLimit)
	return b.String()
}

// listHead is the list statement of queries.sql, before its filters.
var listHead = func() string {
	var b strings.Builder
	for i, name := range qList.names {
		b.WriteString(qList.text[i] + ":" + name)
	}
	b.WriteString(qList.text[len(qList.names)])
	return strings.TrimSuffix(b.String(), ";")
}()

// queryRecordsRetry runs a one-statement query of records on the pool,
// again after a deadlock or a lock wait timeout.
func (s *Store) queryRecordsRetry(ctx context.Context, st stmt, a args) ([]*idemstore.Record, error) {
	var recs []*idemstore.Record
	err := s.retry(ctx, func() error {
		var err error
		recs, err = s.queryRecords(ctx, s.db, st, a)
		return err
	})
	return recs, err
}

// recordScan receives one row of {{columns}}.
type recordScan struct {
	rec    idemstore.Record
	state  string
	les    string
	status sql.NullInt32
	header []byte
	body   []byte
	ttl    int64
	after  sql.NullTime
}

func (rs *recordScan) dest() []any {
	r := &rs.rec
	return []any{&r.Scope, &r.Endpoint, &r.Key, &r.Fingerprint, &rs.state, &r.Token,
		&r.LockedUntil, &r.StartedAt, &rs.les, &rs.status,
		&rs.header, &rs.body, &r.NotReplayable, &r.RecoveryPoint,
		&r.Attempts, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &rs.ttl,
		&rs.after, &r.ReconcileAttempts, &r.ReconcileError}
}

func (rs *recordScan) record() (*idemstore.Record, error) {
	rec := &rs.rec
	rec.State = idemstore.State(rs.state)
	rec.LeaseExpiredState = idemstore.State(rs.les)
	rec.TTL = time.Duration(rs.ttl) * time.Microsecond
	for _, t := range []*time.Time{&rec.LockedUntil, &rec.StartedAt, &rec.CreatedAt, &rec.UpdatedAt, &rec.ExpiresAt} {
		*t = t.UTC()
	}
	if rs.after.Valid {
		rec.ReconcileAfter = rs.after.Time.UTC()
	}
	if rs.status.Valid {
		resp := &idemstore.Response{Status: int(rs.status.Int32), Body: rs.body}
		if resp.Body == nil {
			resp.Body = []byte{}
		}
		if rs.header != nil {
			h, err := headerjson.Decode(string(rs.header))
			if err != nil {
				return nil, fmt.Errorf("decoding the stored header of record %s: %w", rec.LogHash(), err)
			}
			resp.Header, resp.Sealed = neverstored.Unpack(h)
		}
		rec.Response = resp
	}
	return rec, nil
}

// encodedResponse is a response as the statements take it.
type encodedResponse struct {
	status        any // int32 or nil
	header        any // []byte or nil
	body          any // []byte or nil
	notReplayable bool
}

// into adds the response's arguments to a.
func (r encodedResponse) into(a args) {
	a["status"] = r.status
	a["header"] = r.header
	a["body"] = r.body
	a["not_replayable"] = r.notReplayable
}

// encodeResponse prepares resp for storage. A not replayable record, or one
// without a response, stores none.
func encodeResponse(resp *idemstore.Response, notReplayable bool) (encodedResponse, error) {
	if notReplayable || resp == nil {
		return encodedResponse{notReplayable: true}, nil
	}
	if resp.Status < 100 || resp.Status > 999 {
		return encodedResponse{}, fmt.Errorf("invalid response status %d", resp.Status)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	out := encodedResponse{status: int32(resp.Status), body: body}
	if resp.Header != nil || resp.Sealed != "" {
		b, err := headerjson.Encode(neverstored.Pack(resp.Header, resp.Sealed))
		if err != nil {
			return encodedResponse{}, fmt.Errorf("encoding header: %w", err)
		}
		out.header = b
	}
	return out, nil
}
