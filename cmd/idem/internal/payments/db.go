package payments

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/migrate"
	"github.com/idem-dev/idem/internal/pgxmigrate"
	"github.com/idem-dev/idem/internal/sqlfile"
	"github.com/idem-dev/idem/outbox"
)

//go:embed queries/sqlite.sql
var sqliteSQL string

//go:embed queries/postgres.sql
var postgresSQL string

// The statements of each dialect, by name.
var (
	sqliteStatements   = sqlfile.MustParse("cmd/idem/internal/payments/queries/sqlite.sql", sqliteSQL)
	postgresStatements = sqlfile.MustParse("cmd/idem/internal/payments/queries/postgres.sql", postgresSQL)
)

//go:embed migrations
var migrationsFS embed.FS

// database is the service's one database: the idem store's table, the
// outbox and the payments, so that a payment, its outbox row and the key's
// completion commit in one transaction.
type database struct {
	kind   string // storeurl.KindSQLite, storeurl.KindPostgres or storeurl.KindMySQL
	store  idemstore.TxStore
	outbox outbox.Store
	repo   repo
	close  func() error
}

// openDatabase opens the store rawURL names (sqlite:PATH, postgres://…
// with ?schema=NAME, or mysql://…) and applies the embedded migrations of the idem store,
// the outbox and the payments table.
func openDatabase(ctx context.Context, rawURL string, now func() time.Time) (*database, error) {
	switch storeurl.Kind(rawURL) {
	case storeurl.KindSQLite:
		return openSQLite(ctx, rawURL, now)
	case storeurl.KindPostgres:
		return openPostgres(ctx, rawURL, now)
	case storeurl.KindMySQL:
		return openMySQL(ctx, rawURL, now)
	}
	return nil, fmt.Errorf("store %s: want sqlite:PATH, postgres://… or mysql://… (payments need a SQL store for transactional mode)", storeurl.Redact(rawURL))
}

func openSQLite(ctx context.Context, rawURL string, now func() time.Time) (*database, error) {
	p, cfg, err := storeurl.ParseSQLite(rawURL)
	if err != nil {
		return nil, err
	}
	cfg.Now = now
	store, err := idemsqlite.Open(p, &cfg)
	if err != nil {
		return nil, err
	}
	ob := outbox.NewSQLite(store.DB(), &outbox.Config{Now: now})
	r := &sqliteRepo{db: store.DB(), q: newQueries(sqliteStatements, "")}
	d := &database{kind: storeurl.KindSQLite, store: store, outbox: ob, repo: r, close: store.Close}
	if err := d.migrate(ctx, ob.Migrate, r.migrator(now)); err != nil {
		store.Close()
		return nil, fmt.Errorf("store %q: %w", rawURL, err)
	}
	return d, nil
}

func openPostgres(ctx context.Context, rawURL string, now func() time.Time) (*database, error) {
	pcfg, schema, err := storeurl.ParsePostgres(rawURL)
	if err != nil {
		return nil, err
	}
	if schema == "" {
		schema = idempgx.DefaultSchema
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, storeurl.Wrap(rawURL, err)
	}
	store := idempgx.New(pool, &idempgx.Config{Schema: schema, Now: now})
	ob := outbox.NewPgx(pool, &outbox.Config{Schema: schema, Now: now})
	quoted := pgx.Identifier{schema}.Sanitize() + "."
	r := &pgxRepo{pool: pool, schemaName: schema, schema: quoted, q: newQueries(postgresStatements, quoted)}
	closeAll := func() error { store.Close(); pool.Close(); return nil }
	d := &database{kind: storeurl.KindPostgres, store: store, outbox: ob, repo: r, close: closeAll}
	migrateIdem := func(ctx context.Context) error { _, err := store.Migrate(ctx); return err }
	if err := migrateIdem(ctx); err != nil {
		closeAll()
		return nil, storeurl.Wrap(rawURL, err)
	}
	if err := d.migrate(ctx, ob.Migrate, r.migrator(now)); err != nil {
		closeAll()
		return nil, storeurl.Wrap(rawURL, err)
	}
	return d, nil
}

// migrate applies the outbox's migrations, then the payments table's.
func (d *database) migrate(ctx context.Context, migrateOutbox func(context.Context) ([]outbox.Migration, error), payments *migrate.Runner) error {
	if _, err := migrateOutbox(ctx); err != nil {
		return fmt.Errorf("migrating the outbox: %w", err)
	}
	if _, err := payments.Up(ctx); err != nil {
		return fmt.Errorf("migrating the payments table: %w", err)
	}
	return nil
}

// migrationsTable records the payments table's migrations, apart from the
// idem store's and the outbox's, which share the database. Its layout is
// internal/migrate's, so the databases of releases that migrated the
// payments table themselves keep their history.
const migrationsTable = "payments_migrations"

// The embedded migrations of each dialect, in version order.
var (
	sqliteMigrations   = migrate.MustLoad(migrationsFS, "migrations/sqlite")
	postgresMigrations = migrate.MustLoad(migrationsFS, "migrations/postgres")
)

// queries are one dialect's statements.
type queries struct {
	insert, getByKey, get, getByID, list                 string
	markSucceeded, markFailed, markUnknown, deferRecheck string
	unsettled                                            string
	settingGet, settingAdd, anyPayment                   string
	// The provider-side reconciliation (ledger.go).
	ledgerWatermark, ledgerAdvance, ledgerReport, ledgerList, ledgerCounts, ledgerResolve, ledgerPayments string
}

// newQueries picks the service's statements out of one dialect's and puts
// schema (a quoted identifier and a dot, or "") in place of {{schema}}.
func newQueries(statements map[string]string, schema string) queries {
	q := func(name string) string {
		s, ok := statements[name]
		if !ok {
			panic("payments: no statement " + name)
		}
		return strings.ReplaceAll(s, "{{schema}}", schema)
	}
	return queries{
		insert:        q("insert"),
		getByKey:      q("get_by_key"),
		get:           q("get"),
		getByID:       q("get_by_id"),
		list:          q("list"),
		markSucceeded: q("mark_succeeded"),
		markFailed:    q("mark_failed"),
		markUnknown:   q("mark_unknown"),
		deferRecheck:  q("defer_reconcile"),
		unsettled:     q("unsettled"),
		settingGet:    q("setting_get"),
		settingAdd:    q("setting_add"),
		anyPayment:    q("any_payment"),

		ledgerWatermark: q("ledger_watermark"),
		ledgerAdvance:   q("ledger_advance"),
		ledgerReport:    q("ledger_report"),
		ledgerList:      q("ledger_list"),
		ledgerCounts:    q("ledger_counts"),
		ledgerResolve:   q("ledger_resolve"),
		ledgerPayments:  q("ledger_payments"),
	}
}

// unsettledPayment is a payment the reconciler looks at, with the state of
// its outbox row.
type unsettledPayment struct {
	*Payment
	// outboxState is the outbox row's state, or "missing".
	outboxState string
	// outboxUpdatedAt is when the outbox row last changed: for a dead row,
	// when its last attempt ended.
	outboxUpdatedAt time.Time
}

// repo is the payments table in one SQL dialect.
type repo interface {
	// setting returns the setting name, storing value first when the
	// database has none (the first caller's value wins).
	setting(ctx context.Context, name, value string) (string, error)
	// anyPayment reports whether the database holds a payment.
	anyPayment(ctx context.Context) (bool, error)
	// migrator returns the runner of the payments table's migrations,
	// which dates them by now.
	migrator(now func() time.Time) *migrate.Runner
	// insertTx inserts p (pending) inside the request's transaction.
	insertTx(ctx context.Context, tx idemstore.Tx, p *Payment, key string) error
	// byKeyTx returns the tenant's payment made with the idempotency key,
	// inside the request's transaction, or errNotFound.
	byKeyTx(ctx context.Context, tx idemstore.Tx, tenant, key string) (*Payment, error)
	// enqueueTx enqueues m inside the request's transaction.
	enqueueTx(ctx context.Context, tx idemstore.Tx, ob outbox.Store, m outbox.Message) (int64, error)
	// get returns the tenant's payment id, or errNotFound.
	get(ctx context.Context, tenant, id string) (*Payment, error)
	// byID returns the payment id of any tenant, or errNotFound.
	byID(ctx context.Context, id string) (*Payment, error)
	// list returns at most limit payments of the tenant with a seq below
	// before, newest first.
	list(ctx context.Context, tenant string, before int64, limit int) ([]*Payment, error)
	// markSucceeded settles a payment that is not succeeded yet; it reports
	// whether it changed a row. When event is not nil and the row changed,
	// it enqueues event in ob in the same transaction (a duplicate is left
	// as it is).
	markSucceeded(ctx context.Context, ob outbox.Store, id, chargeID string, now time.Time, event *outbox.Message) (bool, error)
	// markFailed fails a pending or unreconciled payment.
	markFailed(ctx context.Context, id, reason string, now time.Time) (bool, error)
	// markUnknown marks a pending payment requires_reconciliation.
	markUnknown(ctx context.Context, id string, now time.Time) (bool, error)
	// deferReconcile counts a reconciliation attempt and sets the next.
	deferReconcile(ctx context.Context, id string, next time.Time) error
	// unsettled returns at most limit payments the reconciler should look
	// at now.
	unsettled(ctx context.Context, now time.Time, limit int) ([]*unsettledPayment, error)
	// ledgerRepo is the provider-side reconciliation's state (ledger.go).
	ledgerRepo
}

// sqliteRepo is the payments table on SQLite; times are unix microseconds.
type sqliteRepo struct {
	db *sql.DB
	q  queries
}

func sqlTx(tx idemstore.Tx) (*sql.Tx, error) {
	stx, ok := idemsqlite.TxFrom(tx)
	if !ok {
		return nil, fmt.Errorf("payments: the request's transaction is a %T, not an idemsqlite one", tx)
	}
	return stx, nil
}

func (r *sqliteRepo) migrator(now func() time.Time) *migrate.Runner {
	return &migrate.Runner{
		Migrations: sqliteMigrations,
		Dialect:    &migrate.SQLite{DB: r.db, Table: migrationsTable},
		Now:        now,
	}
}

func (r *sqliteRepo) insertTx(ctx context.Context, tx idemstore.Tx, p *Payment, key string) error {
	stx, err := sqlTx(tx)
	if err != nil {
		return err
	}
	return stx.QueryRowContext(ctx, r.q.insert, p.ID, p.tenant, key, p.CustomerID, p.AmountCents,
		p.Currency, p.providerKey, p.outboxID, p.CreatedAt.UnixMicro()).Scan(&p.seq)
}

func (r *sqliteRepo) byKeyTx(ctx context.Context, tx idemstore.Tx, tenant, key string) (*Payment, error) {
	stx, err := sqlTx(tx)
	if err != nil {
		return nil, err
	}
	return scanSQLite(stx.QueryRowContext(ctx, r.q.getByKey, tenant, key))
}

func (r *sqliteRepo) enqueueTx(ctx context.Context, tx idemstore.Tx, ob outbox.Store, m outbox.Message) (int64, error) {
	stx, err := sqlTx(tx)
	if err != nil {
		return 0, err
	}
	return ob.(*outbox.SQLiteStore).Enqueue(ctx, stx, m)
}

func (r *sqliteRepo) setting(ctx context.Context, name, value string) (string, error) {
	if _, err := r.db.ExecContext(ctx, r.q.settingAdd, name, value); err != nil {
		return "", err
	}
	var v string
	err := r.db.QueryRowContext(ctx, r.q.settingGet, name).Scan(&v)
	return v, err
}

func (r *sqliteRepo) anyPayment(ctx context.Context) (bool, error) {
	var exists bool
	err := r.db.QueryRowContext(ctx, r.q.anyPayment).Scan(&exists)
	return exists, err
}

func (r *sqliteRepo) get(ctx context.Context, tenant, id string) (*Payment, error) {
	return scanSQLite(r.db.QueryRowContext(ctx, r.q.get, tenant, id))
}

func (r *sqliteRepo) byID(ctx context.Context, id string) (*Payment, error) {
	return scanSQLite(r.db.QueryRowContext(ctx, r.q.getByID, id))
}

func (r *sqliteRepo) list(ctx context.Context, tenant string, before int64, limit int) ([]*Payment, error) {
	rows, err := r.db.QueryContext(ctx, r.q.list, tenant, before, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Payment
	for rows.Next() {
		p, err := scanSQLite(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

func (r *sqliteRepo) exec(ctx context.Context, query string, args ...any) (bool, error) {
	res, err := r.db.ExecContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

func (r *sqliteRepo) markSucceeded(ctx context.Context, ob outbox.Store, id, chargeID string, now time.Time, event *outbox.Message) (bool, error) {
	if event == nil {
		return r.exec(ctx, r.q.markSucceeded, id, chargeID, now.UnixMicro())
	}
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, r.q.markSucceeded, id, chargeID, now.UnixMicro())
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	if _, err := ob.(*outbox.SQLiteStore).Enqueue(ctx, tx, *event); err != nil && !errors.Is(err, outbox.ErrDuplicate) {
		return false, fmt.Errorf("enqueueing the %s event: %w", event.Topic, err)
	}
	return true, tx.Commit()
}

func (r *sqliteRepo) markFailed(ctx context.Context, id, reason string, now time.Time) (bool, error) {
	return r.exec(ctx, r.q.markFailed, id, reason, now.UnixMicro())
}

func (r *sqliteRepo) markUnknown(ctx context.Context, id string, now time.Time) (bool, error) {
	return r.exec(ctx, r.q.markUnknown, id, now.UnixMicro())
}

func (r *sqliteRepo) deferReconcile(ctx context.Context, id string, next time.Time) error {
	_, err := r.exec(ctx, r.q.deferRecheck, id, next.UnixMicro())
	return err
}

func (r *sqliteRepo) unsettled(ctx context.Context, now time.Time, limit int) ([]*unsettledPayment, error) {
	rows, err := r.db.QueryContext(ctx, r.q.unsettled, now.UnixMicro(), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*unsettledPayment
	for rows.Next() {
		var s sqliteScan
		u := &unsettledPayment{}
		var obUpdated int64
		if err := rows.Scan(append(s.dest(), &u.outboxState, &obUpdated)...); err != nil {
			return nil, err
		}
		u.Payment = s.payment()
		u.outboxUpdatedAt = time.UnixMicro(obUpdated).UTC()
		out = append(out, u)
	}
	return out, rows.Err()
}

type rowScanner interface{ Scan(dest ...any) error }

func scanSQLite(row rowScanner) (*Payment, error) {
	var s sqliteScan
	if err := row.Scan(s.dest()...); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, errNotFound
		}
		return nil, err
	}
	return s.payment(), nil
}

// sqliteScan receives the payment columns of a SQLite row.
type sqliteScan struct {
	p                Payment
	status           string
	chargeID, reason sql.NullString
	created, updated int64
}

func (s *sqliteScan) dest() []any {
	p := &s.p
	return []any{&p.seq, &p.ID, &p.tenant, &p.CustomerID, &p.AmountCents, &p.Currency, &s.status,
		&p.providerKey, &p.outboxID, &s.chargeID, &s.reason, &p.reconcileAttempts, &s.created, &s.updated}
}

func (s *sqliteScan) payment() *Payment {
	p := s.p
	p.Status = Status(s.status)
	p.ChargeID = s.chargeID.String
	p.FailureReason = s.reason.String
	p.CreatedAt = time.UnixMicro(s.created).UTC()
	p.updatedAt = time.UnixMicro(s.updated).UTC()
	return &p
}

// pgxRepo is the payments table on PostgreSQL.
type pgxRepo struct {
	pool       *pgxpool.Pool
	schemaName string // unquoted
	schema     string // quoted schema and a dot
	q          queries
}

func pgxTx(tx idemstore.Tx) (pgx.Tx, error) {
	ptx, ok := idempgx.TxFrom(tx)
	if !ok {
		return nil, fmt.Errorf("payments: the request's transaction is a %T, not an idempgx one", tx)
	}
	return ptx, nil
}

func (r *pgxRepo) migrator(now func() time.Time) *migrate.Runner {
	return &migrate.Runner{
		Migrations: postgresMigrations,
		Dialect: &pgxmigrate.Postgres{
			DB:       r.pool,
			Schema:   r.schemaName,
			Table:    migrationsTable,
			LockName: "payments.migrate",
		},
		Now:    now,
		Expand: func(sql string) string { return strings.ReplaceAll(sql, "{{schema}}", r.schema) },
	}
}

func (r *pgxRepo) insertTx(ctx context.Context, tx idemstore.Tx, p *Payment, key string) error {
	ptx, err := pgxTx(tx)
	if err != nil {
		return err
	}
	return ptx.QueryRow(ctx, r.q.insert, p.ID, p.tenant, key, p.CustomerID, p.AmountCents,
		p.Currency, p.providerKey, p.outboxID, p.CreatedAt).Scan(&p.seq)
}

func (r *pgxRepo) byKeyTx(ctx context.Context, tx idemstore.Tx, tenant, key string) (*Payment, error) {
	ptx, err := pgxTx(tx)
	if err != nil {
		return nil, err
	}
	return scanPgx(ptx.QueryRow(ctx, r.q.getByKey, tenant, key))
}

func (r *pgxRepo) enqueueTx(ctx context.Context, tx idemstore.Tx, ob outbox.Store, m outbox.Message) (int64, error) {
	ptx, err := pgxTx(tx)
	if err != nil {
		return 0, err
	}
	return ob.(*outbox.PgxStore).Enqueue(ctx, ptx, m)
}

func (r *pgxRepo) setting(ctx context.Context, name, value string) (string, error) {
	if _, err := r.pool.Exec(ctx, r.q.settingAdd, name, value); err != nil {
		return "", err
	}
	var v string
	err := r.pool.QueryRow(ctx, r.q.settingGet, name).Scan(&v)
	return v, err
}

func (r *pgxRepo) anyPayment(ctx context.Context) (bool, error) {
	var exists bool
	err := r.pool.QueryRow(ctx, r.q.anyPayment).Scan(&exists)
	return exists, err
}

func (r *pgxRepo) get(ctx context.Context, tenant, id string) (*Payment, error) {
	return scanPgx(r.pool.QueryRow(ctx, r.q.get, tenant, id))
}

func (r *pgxRepo) byID(ctx context.Context, id string) (*Payment, error) {
	return scanPgx(r.pool.QueryRow(ctx, r.q.getByID, id))
}

func (r *pgxRepo) list(ctx context.Context, tenant string, before int64, limit int) ([]*Payment, error) {
	rows, err := r.pool.Query(ctx, r.q.list, tenant, before, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Payment
	for rows.Next() {
		p, err := scanPgx(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

func (r *pgxRepo) exec(ctx context.Context, query string, args ...any) (bool, error) {
	tag, err := r.pool.Exec(ctx, query, args...)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() > 0, nil
}

func (r *pgxRepo) markSucceeded(ctx context.Context, ob outbox.Store, id, chargeID string, now time.Time, event *outbox.Message) (bool, error) {
	if event == nil {
		return r.exec(ctx, r.q.markSucceeded, id, chargeID, now)
	}
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	tag, err := tx.Exec(ctx, r.q.markSucceeded, id, chargeID, now)
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	if _, err := ob.(*outbox.PgxStore).Enqueue(ctx, tx, *event); err != nil && !errors.Is(err, outbox.ErrDuplicate) {
		return false, fmt.Errorf("enqueueing the %s event: %w", event.Topic, err)
	}
	return true, tx.Commit(ctx)
}

func (r *pgxRepo) markFailed(ctx context.Context, id, reason string, now time.Time) (bool, error) {
	return r.exec(ctx, r.q.markFailed, id, reason, now)
}

func (r *pgxRepo) markUnknown(ctx context.Context, id string, now time.Time) (bool, error) {
	return r.exec(ctx, r.q.markUnknown, id, now)
}

func (r *pgxRepo) deferReconcile(ctx context.Context, id string, next time.Time) error {
	_, err := r.exec(ctx, r.q.deferRecheck, id, next)
	return err
}

func (r *pgxRepo) unsettled(ctx context.Context, now time.Time, limit int) ([]*unsettledPayment, error) {
	rows, err := r.pool.Query(ctx, r.q.unsettled, now, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*unsettledPayment
	for rows.Next() {
		var s pgxScan
		u := &unsettledPayment{}
		if err := rows.Scan(append(s.dest(), &u.outboxState, &u.outboxUpdatedAt)...); err != nil {
			return nil, err
		}
		u.Payment = s.payment()
		u.outboxUpdatedAt = u.outboxUpdatedAt.UTC()
		out = append(out, u)
	}
	return out, rows.Err()
}

func scanPgx(row pgx.Row) (*Payment, error) {
	var s pgxScan
	if err := row.Scan(s.dest()...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, errNotFound
		}
		return nil, err
	}
	return s.payment(), nil
}

// pgxScan receives the payment columns of a PostgreSQL row.
type pgxScan struct {
	p                Payment
	status           string
	chargeID, reason *string
}

func (s *pgxScan) dest() []any {
	p := &s.p
	return []any{&p.seq, &p.ID, &p.tenant, &p.CustomerID, &p.AmountCents, &p.Currency, &s.status,
		&p.providerKey, &p.outboxID, &s.chargeID, &s.reason, &p.reconcileAttempts, &p.CreatedAt, &p.updatedAt}
}

func (s *pgxScan) payment() *Payment {
	p := s.p
	p.Status = Status(s.status)
	if s.chargeID != nil {
		p.ChargeID = *s.chargeID
	}
	if s.reason != nil {
		p.FailureReason = *s.reason
	}
	p.CreatedAt = p.CreatedAt.UTC()
	p.updatedAt = p.updatedAt.UTC()
	return &p
}
