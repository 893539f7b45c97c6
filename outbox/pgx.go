package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/internal/migrate"
	"github.com/idem-dev/idem/internal/pgxmigrate"
)

// PgxStore is the outbox on PostgreSQL through pgx v5. It is safe for
// concurrent use.
//
// Its tables live in Config.Schema, or, when that is empty, in the first
// schema of the connection's search_path (set it in the pool's
// configuration, pgxpool.Config.ConnConfig.RuntimeParams).
type PgxStore struct {
	pool   *pgxpool.Pool
	cfg    Config
	schema string // quoted identifier, or "" for the search_path
	q      *queries
}

var _ Store = (*PgxStore)(nil)

// NewPgx returns the outbox store on pool, which the caller owns. cfg may
// be nil. Call Migrate before use.
func NewPgx(pool *pgxpool.Pool, cfg *Config) *PgxStore {
	c := cfg.withDefaults()
	var schema string
	if c.Schema != "" {
		schema = pgx.Identifier{c.Schema}.Sanitize()
	}
	return &PgxStore{pool: pool, cfg: c, schema: schema, q: postgresQueries(schema)}
}

func (s *PgxStore) now() time.Time { return micro(s.cfg.Now()) }

// Enqueue inserts m in the caller's transaction and returns its id: the
// message exists if and only if tx commits. AvailableAt defaults to now.
// It returns ErrInvalidMessage for a message that breaks the table's rules
// and ErrDuplicate when the topic and key were already enqueued (the
// transaction is then aborted, as after any failed statement).
func (s *PgxStore) Enqueue(ctx context.Context, tx pgx.Tx, m Message) (int64, error) {
	if err := m.validate(); err != nil {
		return 0, err
	}
	now := s.now()
	avail := orNow(m.AvailableAt, s.cfg.Now)
	var id int64
	err := tx.QueryRow(ctx, s.q.enqueue, m.Topic, string(m.Payload), m.IdempotencyKey, avail, now).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("enqueuing message: %w", interpretPgxError(err))
	}
	return id, nil
}

// MessageClaim implements Store.
func (s *PgxStore) MessageClaim(ctx context.Context, p *ClaimParams) ([]*Message, error) {
	now := orNow(p.Now, s.cfg.Now)
	limit := p.Limit
	if limit <= 0 {
		limit = defaultClaimLimit
	}
	msgs, err := s.query(ctx, s.q.claim, now, micro(p.ClaimedUntil), limit)
	if err != nil {
		return nil, fmt.Errorf("claiming messages: %w", err)
	}
	sortDue(msgs)
	return msgs, nil
}

// MessageFinish implements Store.
func (s *PgxStore) MessageFinish(ctx context.Context, p *FinishParams) error {
	if err := p.check(); err != nil {
		return err
	}
	now := orNow(p.Now, s.cfg.Now)
	avail := p.AvailableAt
	if avail.IsZero() {
		avail = now
	}
	var lastErr *string
	if p.LastError != "" {
		lastErr = &p.LastError
	}
	tag, err := s.pool.Exec(ctx, s.q.finish, p.ID, p.Attempt, string(p.State), micro(avail), lastErr, now)
	if err != nil {
		return fmt.Errorf("finishing message %d: %w", p.ID, interpretPgxError(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("finishing message %d: %w", p.ID, ErrClaimLost)
	}
	return nil
}

// MessageUnclaim implements Store.
func (s *PgxStore) MessageUnclaim(ctx context.Context, p *UnclaimParams) error {
	now := orNow(p.Now, s.cfg.Now)
	tag, err := s.pool.Exec(ctx, s.q.unclaim, p.ID, p.Attempt, now)
	if err != nil {
		return fmt.Errorf("unclaiming message %d: %w", p.ID, interpretPgxError(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("unclaiming message %d: %w", p.ID, ErrClaimLost)
	}
	return nil
}

// MessageGet implements Store.
func (s *PgxStore) MessageGet(ctx context.Context, id int64) (*Message, error) {
	msgs, err := s.query(ctx, s.q.get, id)
	if err != nil {
		return nil, fmt.Errorf("reading message %d: %w", id, err)
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("reading message %d: %w", id, ErrNotFound)
	}
	return msgs[0], nil
}

// MessageList implements Store.
func (s *PgxStore) MessageList(ctx context.Context, p *ListParams) ([]*Message, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	msgs, err := s.query(ctx, s.q.list, string(p.State), p.AfterID, limit)
	if err != nil {
		return nil, fmt.Errorf("listing messages: %w", err)
	}
	return msgs, nil
}

// MessageRedrive implements Store.
func (s *PgxStore) MessageRedrive(ctx context.Context, id int64) error {
	tag, err := s.pool.Exec(ctx, s.q.redrive, id, s.now())
	if err != nil {
		return fmt.Errorf("redriving message %d: %w", id, interpretPgxError(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("redriving message %d: %w", id, ErrNotFound)
	}
	return nil
}

// MessagePrune implements Store.
func (s *PgxStore) MessagePrune(ctx context.Context, p *PruneParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultPruneLimit
	}
	tag, err := s.pool.Exec(ctx, s.q.prune, micro(p.Before), limit)
	if err != nil {
		return 0, fmt.Errorf("pruning messages: %w", interpretPgxError(err))
	}
	return int(tag.RowsAffected()), nil
}

// MessageCounts implements Store.
func (s *PgxStore) MessageCounts(ctx context.Context) (map[State]int, error) {
	rows, err := s.pool.Query(ctx, s.q.counts)
	if err != nil {
		return nil, fmt.Errorf("counting messages: %w", interpretPgxError(err))
	}
	counts := make(map[State]int)
	var st string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&st, &n}, func() error {
		counts[State(st)] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("counting messages: %w", interpretPgxError(err))
	}
	return counts, nil
}

// query runs a statement that returns message rows.
func (s *PgxStore) query(ctx context.Context, sql string, args ...any) ([]*Message, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, interpretPgxError(err)
	}
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Message, error) {
		var (
			m       Message
			state   string
			claimed *time.Time
			lastErr *string
		)
		err := row.Scan(&m.ID, &m.Topic, &m.Payload, &m.IdempotencyKey, &state, &m.Attempts,
			&m.AvailableAt, &claimed, &lastErr, &m.CreatedAt, &m.UpdatedAt)
		if err != nil {
			return nil, err
		}
		m.State = State(state)
		if claimed != nil {
			m.ClaimedUntil = claimed.UTC()
		}
		if lastErr != nil {
			m.LastError = *lastErr
		}
		m.AvailableAt = m.AvailableAt.UTC()
		m.CreatedAt = m.CreatedAt.UTC()
		m.UpdatedAt = m.UpdatedAt.UTC()
		return &m, nil
	})
	if err != nil {
		return nil, interpretPgxError(err)
	}
	return msgs, nil
}

// interpretPgxError maps pgx's errors to the package's sentinels; others are
// returned unchanged.
func interpretPgxError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "idem_outbox_topic_idempotency_key_key" {
		return fmt.Errorf("%w: %w", ErrDuplicate, err)
	}
	return err
}

// migrator runs the PostgreSQL migrations in the store's schema, recording
// them in idem_outbox_migrations there.
func (s *PgxStore) migrator() *migrate.Runner {
	return &migrate.Runner{
		Migrations: postgresMigrations,
		Dialect: &pgxmigrate.Postgres{
			DB:       s.pool,
			Schema:   s.cfg.Schema,
			Table:    migrationsTable,
			LockName: "outbox.migrate",
		},
		Now:    s.now,
		Expand: func(sql string) string { return withSchema(sql, s.schema) },
	}
}

// Migrate applies the pending migrations in the first schema of the
// search_path and returns those it applied. It runs in one transaction
// under an advisory lock, so processes that start at once apply each
// migration once.
func (s *PgxStore) Migrate(ctx context.Context) ([]Migration, error) {
	return migrateUp(ctx, s.migrator())
}

// MigrateDown reverts the latest applied migration and returns it, or nil
// when none is applied.
func (s *PgxStore) MigrateDown(ctx context.Context) (*Migration, error) {
	return migrateDown(ctx, s.migrator())
}

// MigrationStatus returns every embedded migration with its state in the
// database. It writes nothing.
func (s *PgxStore) MigrationStatus(ctx context.Context) ([]Migration, error) {
	return migrationStatus(ctx, s.migrator())
}
