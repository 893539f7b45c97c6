package outbox

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/internal/migrate"
	"github.com/idem-dev/idem/internal/sqlfile"
)

//go:embed queries/mysql.sql
var mysqlSQL string

// mysqlColumns are the columns scanMySQLMessages reads, in its order.
const mysqlColumns = `id, topic, payload, idempotency_key, state, attempts,
    available_at, claimed_until, last_error, created_at, updated_at`

// mysqlStatements are the MySQL statements by name, {{columns}} filled in.
var mysqlStatements = func() map[string]string {
	m := sqlfile.MustParse("outbox/queries/mysql.sql", mysqlSQL)
	for name, sql := range m {
		m[name] = strings.ReplaceAll(sql, "{{columns}}", mysqlColumns)
	}
	return m
}()

// mysqlMigrations are the MySQL dialect's embedded migrations.
var mysqlMigrations = migrate.MustLoad(migrationsFS, "migrations/mysql")

// MySQLStore is the outbox on MySQL 8 or MariaDB 10.6+ through database/sql
// with github.com/go-sql-driver/mysql. It is safe for concurrent use.
//
// Its table lives in the connection's database. The pool must scan DATETIME
// into time.Time in UTC (the DSN's parseTime=true&loc=UTC), as a pool of
// idemmysql.NewConnector does; claims run at READ COMMITTED whatever the
// pool's default. Config.Schema does not apply.
type MySQLStore struct {
	db  *sql.DB
	cfg Config
}

var _ Store = (*MySQLStore)(nil)

// NewMySQL returns the outbox store on db, which the caller owns. cfg may
// be nil. Call Migrate before use.
func NewMySQL(db *sql.DB, cfg *Config) *MySQLStore {
	return &MySQLStore{db: db, cfg: cfg.withDefaults()}
}

func (s *MySQLStore) now() time.Time { return micro(s.cfg.Now()).UTC() }

// Enqueue inserts m in the caller's transaction and returns its id: the
// message exists if and only if tx commits. AvailableAt defaults to now.
// It returns ErrInvalidMessage for a message that breaks the table's rules
// and ErrDuplicate when the topic and key were already enqueued.
func (s *MySQLStore) Enqueue(ctx context.Context, tx *sql.Tx, m Message) (int64, error) {
	if err := m.validate(); err != nil {
		return 0, err
	}
	now := s.now()
	avail := micro(orNow(m.AvailableAt, s.cfg.Now)).UTC()
	res, err := tx.ExecContext(ctx, mysqlStatements["enqueue"],
		[]byte(m.Topic), string(m.Payload), []byte(m.IdempotencyKey), avail, now, now)
	if err != nil {
		return 0, fmt.Errorf("enqueuing message: %w", interpretMySQLError(err))
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("enqueuing message: %w", err)
	}
	return id, nil
}

// MessageClaim implements Store. One transaction at READ COMMITTED locks
// the due rows with FOR UPDATE SKIP LOCKED, claims them and reads them:
// concurrent relays claim disjoint batches and never wait for each other.
func (s *MySQLStore) MessageClaim(ctx context.Context, p *ClaimParams) ([]*Message, error) {
	now := micro(orNow(p.Now, s.cfg.Now)).UTC()
	limit := p.Limit
	if limit <= 0 {
		limit = defaultClaimLimit
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("claiming messages: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, mysqlStatements["claim_lock"], now, now, limit)
	if err != nil {
		return nil, fmt.Errorf("claiming messages: %w", interpretMySQLError(err))
	}
	var ids []any
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("claiming messages: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claiming messages: %w", err)
	}
	if len(ids) == 0 {
		return nil, tx.Commit()
	}
	in := strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")
	claim := strings.ReplaceAll(mysqlStatements["claim"], "{{ids}}", in)
	if _, err := tx.ExecContext(ctx, claim, append([]any{micro(p.ClaimedUntil).UTC(), now}, ids...)...); err != nil {
		return nil, fmt.Errorf("claiming messages: %w", interpretMySQLError(err))
	}
	rows, err = tx.QueryContext(ctx, strings.ReplaceAll(mysqlStatements["get_many"], "{{ids}}", in), ids...)
	if err != nil {
		return nil, fmt.Errorf("claiming messages: %w", interpretMySQLError(err))
	}
	msgs, err := scanMySQLMessages(rows)
	if err != nil {
		return nil, fmt.Errorf("claiming messages: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("claiming messages: %w", err)
	}
	sortDue(msgs)
	return msgs, nil
}

// MessageFinish implements Store.
func (s *MySQLStore) MessageFinish(ctx context.Context, p *FinishParams) error {
	if err := p.check(); err != nil {
		return err
	}
	now := micro(orNow(p.Now, s.cfg.Now)).UTC()
	avail := p.AvailableAt
	if avail.IsZero() {
		avail = now
	}
	var lastErr sql.NullString
	if p.LastError != "" {
		lastErr = sql.NullString{String: p.LastError, Valid: true}
	}
	res, err := s.db.ExecContext(ctx, mysqlStatements["finish"], string(p.State), micro(avail).UTC(), lastErr, now, p.ID, p.Attempt)
	if err != nil {
		return fmt.Errorf("finishing message %d: %w", p.ID, interpretMySQLError(err))
	}
	return oneRow(res, ErrClaimLost, "finishing message %d", p.ID)
}

// MessageUnclaim implements Store.
func (s *MySQLStore) MessageUnclaim(ctx context.Context, p *UnclaimParams) error {
	now := micro(orNow(p.Now, s.cfg.Now)).UTC()
	res, err := s.db.ExecContext(ctx, mysqlStatements["unclaim"], now, p.ID, p.Attempt)
	if err != nil {
		return fmt.Errorf("unclaiming message %d: %w", p.ID, interpretMySQLError(err))
	}
	return oneRow(res, ErrClaimLost, "unclaiming message %d", p.ID)
}

// MessageGet implements Store.
func (s *MySQLStore) MessageGet(ctx context.Context, id int64) (*Message, error) {
	rows, err := s.db.QueryContext(ctx, mysqlStatements["get"], id)
	if err != nil {
		return nil, fmt.Errorf("reading message %d: %w", id, interpretMySQLError(err))
	}
	msgs, err := scanMySQLMessages(rows)
	if err != nil {
		return nil, fmt.Errorf("reading message %d: %w", id, err)
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("reading message %d: %w", id, ErrNotFound)
	}
	return msgs[0], nil
}

// MessageList implements Store.
func (s *MySQLStore) MessageList(ctx context.Context, p *ListParams) ([]*Message, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	rows, err := s.db.QueryContext(ctx, mysqlStatements["list"], string(p.State), string(p.State), p.AfterID, limit)
	if err != nil {
		return nil, fmt.Errorf("listing messages: %w", interpretMySQLError(err))
	}
	msgs, err := scanMySQLMessages(rows)
	if err != nil {
		return nil, fmt.Errorf("listing messages: %w", err)
	}
	return msgs, nil
}

// MessageRedrive implements Store.
func (s *MySQLStore) MessageRedrive(ctx context.Context, id int64) error {
	now := s.now()
	res, err := s.db.ExecContext(ctx, mysqlStatements["redrive"], now, now, id)
	if err != nil {
		return fmt.Errorf("redriving message %d: %w", id, interpretMySQLError(err))
	}
	return oneRow(res, ErrNotFound, "redriving message %d", id)
}

// MessagePrune implements Store.
func (s *MySQLStore) MessagePrune(ctx context.Context, p *PruneParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultPruneLimit
	}
	res, err := s.db.ExecContext(ctx, mysqlStatements["prune"], micro(p.Before).UTC(), limit)
	if err != nil {
		return 0, fmt.Errorf("pruning messages: %w", interpretMySQLError(err))
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// MessageCounts implements Store.
func (s *MySQLStore) MessageCounts(ctx context.Context) (map[State]int, error) {
	rows, err := s.db.QueryContext(ctx, mysqlStatements["counts"])
	if err != nil {
		return nil, fmt.Errorf("counting messages: %w", interpretMySQLError(err))
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

func scanMySQLMessages(rows *sql.Rows) ([]*Message, error) {
	defer rows.Close()
	var out []*Message
	for rows.Next() {
		var (
			m              Message
			topic, key     []byte
			payload, state string
			claimed        sql.NullTime
			lastErr        sql.NullString
		)
		err := rows.Scan(&m.ID, &topic, &payload, &key, &state, &m.Attempts,
			&m.AvailableAt, &claimed, &lastErr, &m.CreatedAt, &m.UpdatedAt)
		if err != nil {
			return nil, err
		}
		m.Topic, m.IdempotencyKey = string(topic), string(key)
		m.Payload = []byte(payload)
		m.State = State(state)
		m.AvailableAt = m.AvailableAt.UTC()
		if claimed.Valid {
			m.ClaimedUntil = claimed.Time.UTC()
		}
		m.LastError = lastErr.String
		m.CreatedAt = m.CreatedAt.UTC()
		m.UpdatedAt = m.UpdatedAt.UTC()
		out = append(out, &m)
	}
	return out, rows.Err()
}

// mysqlDuplicateEntry is ER_DUP_ENTRY, a unique key's violation.
const mysqlDuplicateEntry = 1062

// interpretMySQLError maps the driver's errors to the package's sentinels;
// others are returned unchanged.
func interpretMySQLError(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == mysqlDuplicateEntry &&
		strings.Contains(me.Message, "idem_outbox_topic_idempotency_key_key") {
		return fmt.Errorf("%w: %w", ErrDuplicate, err)
	}
	return err
}

// migrator runs the MySQL migrations in the connection's database,
// recording them in idem_outbox_migrations there.
func (s *MySQLStore) migrator() *migrate.Runner {
	return &migrate.Runner{
		Migrations: mysqlMigrations,
		Dialect:    &migrate.MySQL{DB: s.db, Table: migrationsTable, LockName: "outbox.migrate"},
		Now:        s.now,
	}
}

// Migrate applies the pending migrations and returns those it applied. It
// holds a named lock (GET_LOCK), so processes that start at once apply each
// migration once; MySQL commits DDL at once (see migrate.MySQL).
func (s *MySQLStore) Migrate(ctx context.Context) ([]Migration, error) {
	return migrateUp(ctx, s.migrator())
}

// MigrateDown reverts the latest applied migration and returns it, or nil
// when none is applied.
func (s *MySQLStore) MigrateDown(ctx context.Context) (*Migration, error) {
	return migrateDown(ctx, s.migrator())
}

// MigrationStatus returns every embedded migration with its state in the
// database. It writes nothing.
func (s *MySQLStore) MigrationStatus(ctx context.Context) ([]Migration, error) {
	return migrationStatus(ctx, s.migrator())
}
