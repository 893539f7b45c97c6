// Package idempgx is the PostgreSQL store of idem, on pgx v5: the production
// reference for services that run on many nodes.
//
// Records live in one table, idem_keys, created by the embedded migrations
// (Store.Migrate). Every operation is a single statement: KeyReserve inserts
// a new record in one round trip, and re-claims a released or expired one
// atomically in a second (the rare path), and a replay of a completed key
// reads the record without writing or locking it.
// Writes that finish an attempt are conditional on the fencing token.
// CompleteTx and CheckpointTx run the same fenced writes inside the caller's
// transaction, so a key's completion commits or rolls back with the business
// writes (transactional mode and phased operations).
//
// Time comes from the store's clock (Config.Now) and is passed to every
// statement; the server's now() is never used.
//
// The store implements idemstore.Waiter with LISTEN/NOTIFY on a connection of
// its own, started by the first KeyWait and stopped by Close.
package idempgx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/headerjson"
	"github.com/idem-dev/idem/internal/neverstored"
)

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Schema is the PostgreSQL schema that holds the store's tables; Migrate
	// creates it when it is missing. Defaults to "public".
	Schema string
	// Now is the store's clock. Defaults to time.Now.
	Now func() time.Time
	// WaitPoll bounds how long KeyWait blocks without a notification before
	// it returns (a spurious wake-up, after which the caller reads the
	// record again). Defaults to 1 second.
	WaitPoll time.Duration
	// Logger receives the notification listener's failures. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Partitions, when above zero (at most MaxPartitions), makes Migrate
	// create the key table hash-partitioned by scope into that many
	// partitions, idem_keys_p0 …: every statement filters by scope and the
	// primary key starts with it. It applies when the first migration
	// creates the table; an existing table is left as it is (Partitions
	// tells which it is). KeyReap works partition by partition. Defaults to
	// 0: one table.
	Partitions int
	// GroupCommit sends the reserve and completion statements of
	// concurrent calls together once a quarter of the pool's connections
	// are busy with them: up to 16 statements in one write and one implicit
	// transaction, which share one commit (one WAL flush) and one wake-up
	// of the server process. A call alone is sent at once, as without it.
	// Every statement keeps its own outcome, except that one the server
	// refuses rolls back its group, whose other statements then run again
	// alone; what a statement waits for (a row another transaction holds)
	// holds up its group. Defaults to false.
	GroupCommit bool
}

// Default values of Config fields.
const (
	// DefaultSchema is the default Config.Schema.
	DefaultSchema = "public"
	// DefaultWaitPoll is the default Config.WaitPoll.
	DefaultWaitPoll = time.Second
)

// withDefaults returns a copy of cfg (which may be nil) with every zero field
// set to its default. It is the only place defaults are applied.
func (cfg *Config) withDefaults() Config {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.WaitPoll <= 0 {
		c.WaitPoll = DefaultWaitPoll
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Default batch and page sizes of KeySweep, KeyReap and KeyList.
const (
	defaultBatch     = 1000
	defaultListLimit = 100
)

// maxReserveTries bounds the statement re-runs of KeyReserve. A re-run is
// needed only when the statement's snapshot missed a concurrent commit (see
// KeyReserve), which a second run sees.
const maxReserveTries = 10

// reserveFindArgs is the number of KeyReserve's arguments that "find"
// takes: scope, endpoint, key and token.
const reserveFindArgs = 4

// Store is the PostgreSQL idem store. It is safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	cfg     Config
	schema  string // quoted identifier
	channel string // notification channel, see notifyChannel
	q       *queries
	notify  *notifier
	parts   partitionSet // read by KeyReap, see keyReap
	sweep   sweepMark    // where KeySweep starts
	group   *grouper     // nil unless Config.GroupCommit
	send    *sender      // sends the reservation's and fenced statements (through group, if set)
}

var (
	_ idemstore.Store  = (*Store)(nil)
	_ idemstore.Waiter = (*Store)(nil)
)

// New returns a store on pool. cfg may be nil. The schema must have been
// migrated (Migrate) before the store is used.
func New(pool *pgxpool.Pool, cfg *Config) *Store {
	c := cfg.withDefaults()
	schema := pgx.Identifier{c.Schema}.Sanitize()
	channel := notifyChannel(c.Schema)
	s := &Store{pool: pool, cfg: c, schema: schema, channel: channel, q: loadQueries(schema, channel), send: newSender(pool)}
	s.notify = newNotifier(s)
	if c.GroupCommit {
		s.group = s.newGroup()
	}
	return s
}

// newGroup returns a grouper for s's statements, which merges a group's
// reservations (see many.go).
func (s *Store) newGroup() *grouper {
	g := newGrouper(s.send)
	g.many = &manyStatements{reserve: s.q.reserve, find: s.q.find,
		reserveMany: s.q.reserveMany, findMany: s.q.findMany}
	return g
}

// querier is what a pool and a transaction have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// now reads the store's clock at PostgreSQL's precision, so times computed
// here compare exactly with the stored ones.
func (s *Store) now() time.Time {
	return s.cfg.Now().Truncate(time.Microsecond)
}

// KeyReserve inserts a new in_progress record or re-claims a released or
// expired one, and otherwise returns the existing record without writing to
// it. A replay or a new key is one round trip: "reserve", an insert that
// does nothing when the key is there, and "find", which reads the record
// when it did nothing, in one pipeline (queries.sql); a record found but may
// be re-claimed (claimable) takes a second round trip, "reclaim", which also
// does everything the first does.
//
// Under READ COMMITTED a statement reads with one snapshot: a record that a
// concurrent transaction inserted or re-claimed and committed after the
// snapshot was taken blocks this statement's writes but is invisible to its
// read. The statements then return no row, or the record as it was before
// the concurrent change; they are run again, and the next snapshot sees it.
// Under REPEATABLE READ or SERIALIZABLE (a pool whose default isolation is
// stricter) the same race is a serialization failure, also run again.
func (s *Store) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	les := p.LeaseExpiredState
	if les == "" {
		les = idemstore.StateUnknown
	}
	if les != idemstore.StateUnknown && les != idemstore.StateReleased {
		return nil, fmt.Errorf("reserving key: lease expired state %q is not unknown or released", les)
	}
	now := s.now()
	// At PostgreSQL's precision, as pgx sends them: a new record is the one
	// built here.
	lockedUntil := now.Add(p.Lease).Truncate(time.Microsecond)
	expiresAt := now.Add(p.TTL).Truncate(time.Microsecond)
	ttl := p.TTL.Truncate(time.Microsecond)
	// The arguments point into p and into a: an interface holding a
	// string, a time or a duration would be an allocation each. The first
	// four are find's (reserveFindArgs).
	a := &struct {
		now, lockedUntil, expiresAt time.Time
		les                         string
		ttl                         time.Duration
		args                        [10]any
	}{now: now, lockedUntil: lockedUntil, expiresAt: expiresAt, les: string(les), ttl: ttl}
	a.args = [10]any{&p.Scope, &p.Endpoint, &p.Key, &p.Token, &p.Fingerprint, &a.now,
		&a.lockedUntil, &a.expiresAt, &a.les, &a.ttl}
	args := a.args[:]
	sql := s.q.reserve
	for range maxReserveTries {
		var reserved bool
		var rs *recordScan
		var err error
		if sql == s.q.reserve {
			c := &groupCall{id: p.Identity, sql: sql, args: args, find: s.q.find}
			if s.group != nil {
				err = s.group.run(ctx, c)
			} else {
				err = c.alone(ctx, s.send)
			}
			reserved, rs = c.inserted, c.found
		} else {
			rs = new(recordScan)
			dest := rs.dest(new(bool))
			err = s.pool.QueryRow(ctx, sql, plainArgs(args)...).Scan(dest...)
			reserved = *dest[0].(*bool)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			// Changed by a transaction our snapshot missed. (Or, found by
			// reserve, it holds the caller's token, which find leaves out:
			// a token used twice. reclaim reads it whatever its token.)
			sql = s.q.reclaim
			continue
		}
		if retryable(err) {
			continue // changed by a transaction our snapshot missed
		}
		if err != nil {
			return nil, fmt.Errorf("reserving key: %w", interpretError(err))
		}
		if reserved && sql == s.q.reserve {
			// One allocation for the result and its record.
			b := &struct {
				res idemstore.ReserveResult
				rec idemstore.Record
			}{rec: idemstore.Record{
				Identity:          p.Identity,
				Fingerprint:       p.Fingerprint,
				State:             idemstore.StateInProgress,
				Token:             p.Token,
				LockedUntil:       lockedUntil,
				StartedAt:         now,
				LeaseExpiredState: les,
				Attempts:          1,
				CreatedAt:         now,
				UpdatedAt:         now,
				ExpiresAt:         expiresAt,
				TTL:               ttl,
			}}
			b.res = idemstore.ReserveResult{Reserved: true, Record: &b.rec}
			return &b.res, nil
		}
		rec, err := rs.record()
		if err != nil {
			return nil, fmt.Errorf("reserving key: %w", err)
		}
		if !reserved && claimable(rec, p.Fingerprint, now) {
			// Re-claimable: reserve leaves it to reclaim; found so by
			// reclaim, it changed in a transaction our snapshot missed.
			sql = s.q.reclaim
			continue
		}
		return &idemstore.ReserveResult{Reserved: reserved, Record: rec}, nil
	}
	return nil, fmt.Errorf("reserving key: record still changing after %d tries", maxReserveTries)
}

// claimable reports whether the reclaim statement would have written rec:
// found unwritten by reclaim, rec is an old snapshot of a row another
// transaction changed.
func claimable(rec *idemstore.Record, fingerprint string, now time.Time) bool {
	if rec.Expired(now) || rec.LeaseExpired(now) {
		return true
	}
	return rec.State == idemstore.StateReleased && rec.Fingerprint == fingerprint
}

// KeyGet returns the record, or idemstore.ErrNotFound. An in_progress record
// whose lease expired is reported in the state it turns into.
func (s *Store) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	now := s.now()
	rec, err := s.get(ctx, s.pool, id, now)
	if err != nil {
		return nil, fmt.Errorf("getting key: %w", err)
	}
	return rec, nil
}

// get reads a live record through q and reports it as it stands at now.
func (s *Store) get(ctx context.Context, q querier, id idemstore.Identity, now time.Time) (*idemstore.Record, error) {
	var rs recordScan
	err := q.QueryRow(ctx, s.q.get, id.Scope, id.Endpoint, id.Key, now).Scan(rs.dest()...)
	if err != nil {
		return nil, interpretError(err)
	}
	rec, err := rs.record()
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
	if err := s.complete(ctx, s.pool, p); err != nil {
		return fmt.Errorf("completing key: %w", err)
	}
	return nil
}

func (s *Store) complete(ctx context.Context, q querier, p *idemstore.CompleteParams) error {
	resp, err := encodeResponse(p.Response, p.NotReplayable)
	if err != nil {
		return err
	}
	// The arguments point into p and into a (see KeyReserve).
	a := &struct {
		now  time.Time
		args [9]any
	}{now: s.now()}
	a.args = [9]any{&p.Scope, &p.Endpoint, &p.Key, &p.Token, &a.now,
		resp.status, resp.header, resp.body, resp.notReplayable}
	var notified int64
	return s.fencedRow(ctx, q, p.Identity, s.q.complete, []any{&notified}, a.args[:]...)
}

// KeyRelease moves an in_progress or unknown record to released when the
// token matches, keeping its recovery point.
func (s *Store) KeyRelease(ctx context.Context, p *idemstore.FinishParams) error {
	now := s.now()
	err := s.fenced(ctx, s.pool, p.Identity, s.q.release,
		p.Scope, p.Endpoint, p.Key, p.Token, now)
	if err != nil {
		return fmt.Errorf("releasing key: %w", err)
	}
	return nil
}

// KeyMarkUnknown moves an in_progress record to unknown when the token
// matches.
func (s *Store) KeyMarkUnknown(ctx context.Context, p *idemstore.FinishParams) error {
	now := s.now()
	err := s.fenced(ctx, s.pool, p.Identity, s.q.markUnknown,
		p.Scope, p.Endpoint, p.Key, p.Token, now)
	if err != nil {
		return fmt.Errorf("marking key unknown: %w", err)
	}
	return nil
}

// KeyDelete removes an in_progress record when the token matches.
func (s *Store) KeyDelete(ctx context.Context, p *idemstore.FinishParams) error {
	now := s.now()
	err := s.fenced(ctx, s.pool, p.Identity, s.q.delete,
		p.Scope, p.Endpoint, p.Key, p.Token, now)
	if err != nil {
		return fmt.Errorf("deleting key: %w", err)
	}
	return nil
}

// KeyRenew extends the lease of an in_progress record to now + p.Lease when
// the token matches.
func (s *Store) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	now := s.now()
	err := s.fencedExec(ctx, s.pool, s.q.renew,
		p.Scope, p.Endpoint, p.Key, p.Token, now, now.Add(p.Lease))
	if err != nil {
		return fmt.Errorf("renewing key: %w", err)
	}
	return nil
}

// fenced runs a write conditional on the token, a statement that returns
// how many records it changed and how many waiters' notifications it sent,
// in one row. When it changes no record, the record is missing, belongs to
// another attempt or is in a state the write may not change: all three are
// idemstore.ErrLeaseLost for the attempt.
func (s *Store) fenced(ctx context.Context, q querier, id idemstore.Identity, sql string, args ...any) error {
	var changed, notified int64
	if err := s.fencedRow(ctx, q, id, sql, []any{&changed, &notified}, args...); err != nil {
		return err
	}
	if changed == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// fencedRow runs a write conditional on the token that returns a row,
// scanned into dest, for the record it changed ("complete"), or is fenced's
// statement. No row is idemstore.ErrLeaseLost. On the pool, it is grouped
// with concurrent statements when Config.GroupCommit is set.
func (s *Store) fencedRow(ctx context.Context, q querier, id idemstore.Identity, sql string, dest []any, args ...any) error {
	var err error
	switch {
	case s.group != nil && q == querier(s.pool):
		err = s.group.queryRow(ctx, id, sql, dest, args...)
	case q == querier(s.pool):
		err = (&groupCall{id: id, sql: sql, args: args, dest: dest}).alone(ctx, s.send)
	default:
		err = q.QueryRow(ctx, sql, plainArgs(args)...).Scan(dest...)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return idemstore.ErrLeaseLost
	}
	if err != nil {
		return interpretError(err)
	}
	return nil
}

// fencedExec is fenced for a plain UPDATE that notifies nobody.
func (s *Store) fencedExec(ctx context.Context, q querier, sql string, args ...any) error {
	tag, err := q.Exec(ctx, sql, args...)
	if err != nil {
		return interpretError(err)
	}
	if tag.RowsAffected() == 0 {
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
	var changed, notified int64
	err := s.pool.QueryRow(ctx, s.q.resolve,
		p.Scope, p.Endpoint, p.Key, p.Token, now, string(p.To),
		resp.status, resp.header, resp.body, resp.notReplayable).Scan(&changed, &notified)
	if err != nil {
		return interpretError(err)
	}
	if changed > 0 {
		return nil
	}
	rec, err := s.get(ctx, s.pool, p.Identity, now)
	switch {
	case err != nil:
		return err
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
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		now := s.now()
		var rs recordScan
		err := tx.QueryRow(ctx, s.q.purgeLock, p.Scope, p.Endpoint, p.Key, now).Scan(rs.dest()...)
		if err != nil {
			return interpretError(err)
		}
		rec, err := rs.record()
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
		var changed, notified int64
		if err := tx.QueryRow(ctx, s.q.purge, p.Scope, p.Endpoint, p.Key).Scan(&changed, &notified); err != nil {
			return interpretError(err)
		}
		purged = rec
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("purging key: %w", err)
	}
	return purged, nil
}

// KeyReconcileClaim claims due unknown records with FOR UPDATE SKIP LOCKED,
// as the outbox relay claims rows (see queries.sql, "reconcile_claim").
func (s *Store) KeyReconcileClaim(ctx context.Context, p *idemstore.ReconcileClaimParams) ([]*idemstore.Record, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	now := s.now()
	var graceOver *time.Time // nil: no grace
	if p.Grace > 0 {
		t := now.Add(-p.Grace)
		graceOver = &t
	}
	recs, err := s.queryRecords(ctx, s.q.reconcileClaim, now, now.Add(p.Hold), limit, graceOver)
	if err != nil {
		return nil, fmt.Errorf("claiming unknown keys: %w", err)
	}
	// RETURNING has no order: the longest unknown first.
	slices.SortFunc(recs, func(a, b *idemstore.Record) int {
		return cmp.Or(a.UpdatedAt.Compare(b.UpdatedAt), strings.Compare(a.Scope, b.Scope),
			strings.Compare(a.Endpoint, b.Endpoint), strings.Compare(a.Key, b.Key))
	})
	return recs, nil
}

// KeyReconcileFail records a failed reconciliation attempt, fenced on the
// token.
func (s *Store) KeyReconcileFail(ctx context.Context, p *idemstore.ReconcileFailParams) error {
	err := s.fencedExec(ctx, s.pool, s.q.reconcileFail, p.Scope, p.Endpoint, p.Key, p.Token,
		idemstore.TruncateReconcileError(p.Error), s.now().Add(p.Delay))
	if err != nil {
		return fmt.Errorf("recording a reconciliation failure: %w", err)
	}
	return nil
}

// KeyBacklog counts the unknown records with one query on
// idem_keys_reconcile_idx.
func (s *Store) KeyBacklog(ctx context.Context) (*idemstore.Backlog, error) {
	var (
		n      int
		oldest *time.Time
	)
	if err := s.pool.QueryRow(ctx, s.q.backlog).Scan(&n, &oldest); err != nil {
		return nil, fmt.Errorf("counting unknown keys: %w", interpretError(err))
	}
	b := &idemstore.Backlog{Unknown: n}
	if oldest != nil {
		b.OldestUnknownSince = *oldest
	}
	return b, nil
}

// KeySweep turns at most p.Limit in_progress records whose lease expired
// into their LeaseExpiredState and returns them. It reads the sweep index,
// which holds finished records too, from a watermark forward (see
// sweepMark), so that a pass does not read the table's history again.
func (s *Store) KeySweep(ctx context.Context, p *idemstore.SweepParams) ([]*idemstore.Record, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultBatch
	}
	now := s.now()
	from, deep := s.sweep.start(now)
	recs, err := s.queryRecords(ctx, s.q.sweep, now, limit, from)
	if err != nil {
		return nil, fmt.Errorf("sweeping keys: %w", err)
	}
	if len(recs) < limit {
		s.sweep.done(now, deep)
	}
	return recs, nil
}

// KeyReap deletes at most p.Limit records past their ExpiresAt; on a
// partitioned key table, partition by partition (see Config.Partitions).
func (s *Store) KeyReap(ctx context.Context, p *idemstore.ReapParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultBatch
	}
	return s.keyReap(ctx, limit)
}

// KeyList returns live records ordered by (Scope, Endpoint, Key), a page of
// at most p.Limit after the cursor p.After.
func (s *Store) KeyList(ctx context.Context, p *idemstore.ListParams) ([]*idemstore.Record, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	var createdBefore *time.Time
	if !p.CreatedBefore.IsZero() {
		createdBefore = &p.CreatedBefore
	}
	var after idemstore.Identity
	if p.After != nil {
		after = *p.After
	}
	now := s.now()
	recs, err := s.queryRecords(ctx, s.q.list, now, string(p.State), p.Scope, p.Endpoint,
		createdBefore, p.After != nil, after.Scope, after.Endpoint, after.Key, limit)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	for _, rec := range recs {
		settle(rec, now)
	}
	return recs, nil
}

// queryRecords runs a statement that returns records.
func (s *Store) queryRecords(ctx context.Context, sql string, args ...any) ([]*idemstore.Record, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, interpretError(err)
	}
	defer rows.Close()
	var recs []*idemstore.Record
	for rows.Next() {
		var rs recordScan
		if err := rows.Scan(rs.dest()...); err != nil {
			return nil, interpretError(err)
		}
		rec, err := rs.record()
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, interpretError(err)
	}
	return recs, nil
}

// interpretError maps pgx's native errors to the idemstore sentinels. Every
// other error means the store is unavailable and is returned unchanged.
func interpretError(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return idemstore.ErrNotFound
	}
	return err
}

// retryable reports whether err is a serialization failure or a deadlock,
// after which the statement may simply run again.
func retryable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) &&
		(pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// recordScan receives one row of {{columns}}.
type recordScan struct {
	rec    idemstore.Record
	state  string
	les    string
	status *int32
	header []byte
	body   []byte
	ttl    *time.Duration
	after  *time.Time
}

func (rs *recordScan) dest(before ...any) []any {
	r := &rs.rec
	return append(append(make([]any, 0, len(before)+22), before...), &r.Scope, &r.Endpoint, &r.Key, &r.Fingerprint, &rs.state, &r.Token,
		&r.LockedUntil, &r.StartedAt, &rs.les, &rs.status,
		&rs.header, &rs.body, &r.NotReplayable, &r.RecoveryPoint,
		&r.Attempts, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &rs.ttl,
		&rs.after, &r.ReconcileAttempts, &r.ReconcileError)
}

func (rs *recordScan) record() (*idemstore.Record, error) {
	// One allocation for the record and its response.
	b := &struct {
		rec  idemstore.Record
		resp idemstore.Response
	}{rec: rs.rec}
	rec := &b.rec
	rec.State = idemstore.State(rs.state)
	rec.LeaseExpiredState = idemstore.State(rs.les)
	if rs.ttl != nil {
		rec.TTL = *rs.ttl
	} else {
		// A record made before the ttl column: its retention as made.
		rec.TTL = rec.ExpiresAt.Sub(rec.CreatedAt)
	}
	if rs.after != nil {
		rec.ReconcileAfter = *rs.after
	}
	if rs.status != nil {
		resp := &b.resp
		*resp = idemstore.Response{Status: int(*rs.status), Body: rs.body}
		if rs.header != nil {
			h, err := headerjson.Decode(string(rs.header))
			if err != nil {
				return nil, fmt.Errorf("decoding stored header: %w", err)
			}
			resp.Header, resp.Sealed = neverstored.Unpack(h)
		}
		rec.Response = resp
	}
	return rec, nil
}

// encodedResponse is a response as the statements take it.
type encodedResponse struct {
	status        *int32
	header        *string
	body          []byte
	notReplayable bool
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
	status := int32(resp.Status)
	out := encodedResponse{status: &status, body: resp.Body}
	if resp.Header != nil || resp.Sealed != "" {
		b, err := headerjson.Encode(neverstored.Pack(resp.Header, resp.Sealed))
		if err != nil {
			return encodedResponse{}, fmt.Errorf("encoding header: %w", err)
		}
		h := string(b)
		out.header = &h
	}
	return out, nil
}
