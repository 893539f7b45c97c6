package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/internal/migrate"
)

// SQLiteStore is the outbox on SQLite through database/sql (tested with
// modernc.org/sqlite). It is safe for concurrent use.
//
// The database should be in WAL mode with a busy timeout, as idemsqlite.Open
// configures it; relays in several processes may share the file.
type SQLiteStore struct {
	db  *sql.DB
	cfg Config
	q   *queries
}

var _ Store = (*SQLiteStore)(nil)

// NewSQLite returns the outbox store on db, which the caller owns. cfg may
// be nil. Call Migrate before use.
func NewSQLite(db *sql.DB, cfg *Config) *SQLiteStore {
	return &SQLiteStore{db: db, cfg: cfg.withDefaults(), q: sqliteQueries}
}

func (s *SQLiteStore) now() time.Time { return micro(s.cfg.Now()) }

// Enqueue inserts m in the caller's transaction and returns its id: the
// message exists if and only if tx commits. AvailableAt defaults to now.
// It returns ErrInvalidMessage for a message that breaks the table's rules
// and ErrDuplicate when the topic and key were already enqueued.
func (s *SQLiteStore) Enqueue(ctx context.Context, tx *sql.Tx, m Message) (int64, error) {
	if err := m.validate(); err != nil {
		return 0, err
	}
	now := s.now()
	avail := orNow(m.AvailableAt, s.cfg.Now)
	var id int64
	err := tx.QueryRowContext(ctx, s.q.enqueue,
		m.Topic, string(m.Payload), m.IdempotencyKey, avail.UnixMicro(), now.UnixMicro()).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("enqueuing message: %w", interpretSQLiteError(err))
	}
	return id, nil
}

// MessageClaim implements Store.
func (s *SQLiteStore) MessageClaim(ctx context.Context, p *ClaimParams) ([]*Message, error) {
	now := orNow(p.Now, s.cfg.Now)
	limit := p.Limit
	if limit <= 0 {
		limit = defaultClaimLimit
	}
	rows, err := s.db.QueryContext(ctx, s.q.claim, now.UnixMicro(), micro(p.ClaimedUntil).UnixMicro(), limit)
	if err != nil {
		return nil, fmt.Errorf("claiming messages: %w", interpretSQLiteError(err))
	}
	msgs, err := scanSQLiteMessages(rows)
	if err != nil {
		return nil, fmt.Errorf("claiming messages: %w", err)
	}
	sortDue(msgs)
	return msgs, nil
}

// MessageFinish implements Store.
func (s *SQLiteStore) MessageFinish(ctx context.Context, p *FinishParams) error {
	if err := p.check(); err != nil {
		return err
	}
	now := orNow(p.Now, s.cfg.Now)
	avail := p.AvailableAt
	if avail.IsZero() {
		avail = now
	}
	var lastErr sql.NullString
	if p.LastError != "" {
		lastErr = sql.NullString{String: p.LastError, Valid: true}
	}
	res, err := s.db.ExecContext(ctx, s.q.finish, p.ID, p.Attempt, string(p.State),
		micro(avail).UnixMicro(), lastErr, now.UnixMicro())
	if err != nil {
		return fmt.Errorf("finishing message %d: %w", p.ID, interpretSQLiteError(err))
	}
	return oneRow(res, ErrClaimLost, "finishing message %d", p.ID)
}

// MessageUnclaim implements Store.
func (s *SQLiteStore) MessageUnclaim(ctx context.Context, p *UnclaimParams) error {
	now := orNow(p.Now, s.cfg.Now)
	res, err := s.db.ExecContext(ctx, s.q.unclaim, p.ID, p.Attempt, now.UnixMicro())
	if err != nil {
		return fmt.Errorf("unclaiming message %d: %w", p.ID, interpretSQLiteError(err))
	}
	return oneRow(res, ErrClaimLost, "unclaiming message %d", p.ID)
}

// MessageGet implements Store.
func (s *SQLiteStore) MessageGet(ctx context.Context, id int64) (*Message, error) {
	rows, err := s.db.QueryContext(ctx, s.q.get, id)
	if err != nil {
		return nil, fmt.Errorf("reading message %d: %w", id, interpretSQLiteError(err))
	}
	msgs, err := scanSQLiteMessages(rows)
	if err != nil {
		return nil, fmt.Errorf("reading message %d: %w", id, err)
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("reading message %d: %w", id, ErrNotFound)
	}
	return msgs[0], nil
}

// MessageList implements Store.
func (s *SQLiteStore) MessageList(ctx context.Context, p *ListParams) ([]*Message, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	rows, err := s.db.QueryContext(ctx, s.q.list, string(p.State), p.AfterID, limit)
	if err != nil {
		return nil, fmt.Errorf("listing messages: %w", interpretSQLiteError(err))
	}
	msgs, err := scanSQLiteMessages(rows)
	if err != nil {
		return nil, fmt.Errorf("listing messages: %w", err)
	}
	return msgs, nil
}

// MessageRedrive implements Store.
func (s *SQLiteStore) MessageRedrive(ctx context.Context, id int64) error {
	res, err := s.db.ExecContext(ctx, s.q.redrive, id, s.now().UnixMicro())
	if err != nil {
		return fmt.Errorf("redriving message %d: %w", id, interpretSQLiteError(err))
	}
	return oneRow(res, ErrNotFound, "redriving message %d", id)
}

// MessagePrune implements Store.
func (s *SQLiteStore) MessagePrune(ctx context.Context, p *PruneParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultPruneLimit
	}
	res, err := s.db.ExecContext(ctx, s.q.prune, micro(p.Before).UnixMicro(), limit)
	if err != nil {
		return 0, fmt.Errorf("pruning messages: %w", interpretSQLiteError(err))
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// MessageCounts implements Store.
func (s *SQLiteStore) MessageCounts(ctx context.Context) (map[State]int, error) {
	rows, err := s.db.QueryContext(ctx, s.q.counts)
	if err != nil {
		return nil, fmt.Errorf("counting messages: %w", interpretSQLiteError(err))
	}
	defer rows.Close()
	counts := make(map[State]int)
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("counting messages: %w", err)
		}
		counts[State(st)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("counting messages: %w", err)
	}
	return counts, nil
}

// oneRow turns an UPDATE that matched nothing into the sentinel miss.
func oneRow(res sql.Result, miss error, format string, args ...any) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf(format+": %w", append(args, err)...)
	}
	if n == 0 {
		return fmt.Errorf(format+": %w", append(args, miss)...)
	}
	return nil
}

func scanSQLiteMessages(rows *sql.Rows) ([]*Message, error) {
	defer rows.Close()
	var out []*Message
	for rows.Next() {
		var (
			m                       Message
			payload, state          string
			avail, created, updated int64
			claimed                 sql.NullInt64
			lastErr                 sql.NullString
		)
		err := rows.Scan(&m.ID, &m.Topic, &payload, &m.IdempotencyKey, &state, &m.Attempts,
			&avail, &claimed, &lastErr, &created, &updated)
		if err != nil {
			return nil, err
		}
		m.Payload = []byte(payload)
		m.State = State(state)
		m.AvailableAt = time.UnixMicro(avail).UTC()
		if claimed.Valid {
			m.ClaimedUntil = time.UnixMicro(claimed.Int64).UTC()
		}
		m.LastError = lastErr.String
		m.CreatedAt = time.UnixMicro(created).UTC()
		m.UpdatedAt = time.UnixMicro(updated).UTC()
		out = append(out, &m)
	}
	return out, rows.Err()
}

// SQLite's extended result codes for constraint violations of a key.
const (
	sqliteConstraintPrimaryKey = 1555
	sqliteConstraintUnique     = 2067
)

// interpretSQLiteError maps the driver's errors to the package's sentinels;
// others are returned unchanged.
func interpretSQLiteError(err error) error {
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		switch coded.Code() {
		case sqliteConstraintUnique, sqliteConstraintPrimaryKey:
			return fmt.Errorf("%w: %w", ErrDuplicate, err)
		}
	}
	return err
}

// migrator runs the SQLite migrations, recording them in
// idem_outbox_migrations.
func (s *SQLiteStore) migrator() *migrate.Runner {
	return &migrate.Runner{
		Migrations: sqliteMigrations,
		Dialect:    &migrate.SQLite{DB: s.db, Table: migrationsTable},
		Now:        s.now,
	}
}

// Migrate applies the pending migrations and returns those it applied. It
// runs in one IMMEDIATE transaction, so processes that start at once apply
// each migration once.
func (s *SQLiteStore) Migrate(ctx context.Context) ([]Migration, error) {
	return migrateUp(ctx, s.migrator())
}

// MigrateDown reverts the latest applied migration and returns it, or nil
// when none is applied.
func (s *SQLiteStore) MigrateDown(ctx context.Context) (*Migration, error) {
	return migrateDown(ctx, s.migrator())
}

// MigrationStatus returns every embedded migration with its state in the
// database. It writes nothing.
func (s *SQLiteStore) MigrationStatus(ctx context.Context) ([]Migration, error) {
	return migrationStatus(ctx, s.migrator())
}
