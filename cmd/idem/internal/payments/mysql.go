package payments

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/migrate"
	"github.com/idem-dev/idem/internal/sqlfile"
	"github.com/idem-dev/idem/outbox"
)

//go:embed queries/mysql.sql
var mysqlSQL string

// mysqlStatements are the MySQL statements, by name.
var mysqlStatements = sqlfile.MustParse("cmd/idem/internal/payments/queries/mysql.sql", mysqlSQL)

// mysqlMigrations are the MySQL dialect's embedded migrations.
var mysqlMigrations = migrate.MustLoad(migrationsFS, "migrations/mysql")

// openMySQL opens the service's database on MySQL (mysql://…): the idem
// store, the outbox and the payments tables, all in the URL's database, on
// one pool of idemmysql.NewConnector.
func openMySQL(ctx context.Context, rawURL string, now func() time.Time) (*database, error) {
	redacted := storeurl.Redact(rawURL)
	dsn, maxConns, err := storeurl.ParseMySQL(rawURL)
	if err != nil {
		return nil, err
	}
	store, err := idemmysql.Open(ctx, dsn, &idemmysql.Config{Now: now, MaxConns: maxConns})
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", redacted, err)
	}
	ob := outbox.NewMySQL(store.DB(), &outbox.Config{Now: now})
	r := &mysqlRepo{db: store.DB(), q: newQueries(mysqlStatements, "")}
	d := &database{kind: storeurl.KindMySQL, store: store, outbox: ob, repo: r, close: store.Close}
	if _, err := store.Migrate(ctx); err != nil {
		store.Close()
		return nil, fmt.Errorf("store %s: %w", redacted, err)
	}
	if err := d.migrate(ctx, ob.Migrate, r.migrator(now)); err != nil {
		store.Close()
		return nil, fmt.Errorf("store %s: %w", redacted, err)
	}
	return d, nil
}

// MySQLMigrationStatus returns the payments table's migrations with their
// state in the MySQL database db. It writes nothing.
func MySQLMigrationStatus(ctx context.Context, db *sql.DB) ([]migrate.Status, error) {
	return (&mysqlRepo{db: db}).migrator(time.Now).Status(ctx)
}

// mysqlRepo is the payments table on MySQL.
type mysqlRepo struct {
	db *sql.DB
	q  queries
}

func mysqlTx(tx idemstore.Tx) (*sql.Tx, error) {
	stx, ok := idemmysql.TxFrom(tx)
	if !ok {
		return nil, fmt.Errorf("payments: the request's transaction is a %T, not an idemmysql one", tx)
	}
	return stx, nil
}

func (r *mysqlRepo) migrator(now func() time.Time) *migrate.Runner {
	return &migrate.Runner{
		Migrations: mysqlMigrations,
		Dialect:    &migrate.MySQL{DB: r.db, Table: migrationsTable, LockName: "payments.migrate"},
		Now:        now,
	}
}

// utc is t in UTC at the columns' precision.
func utc(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

func (r *mysqlRepo) insertTx(ctx context.Context, tx idemstore.Tx, p *Payment, key string) error {
	stx, err := mysqlTx(tx)
	if err != nil {
		return err
	}
	res, err := stx.ExecContext(ctx, r.q.insert, p.ID, p.tenant, key, p.CustomerID, p.AmountCents,
		p.Currency, p.providerKey, p.outboxID, utc(p.CreatedAt), utc(p.CreatedAt))
	if err != nil {
		return err
	}
	p.seq, err = res.LastInsertId()
	return err
}

func (r *mysqlRepo) byKeyTx(ctx context.Context, tx idemstore.Tx, tenant, key string) (*Payment, error) {
	stx, err := mysqlTx(tx)
	if err != nil {
		return nil, err
	}
	return scanMySQL(stx.QueryRowContext(ctx, r.q.getByKey, tenant, key))
}

func (r *mysqlRepo) enqueueTx(ctx context.Context, tx idemstore.Tx, ob outbox.Store, m outbox.Message) (int64, error) {
	stx, err := mysqlTx(tx)
	if err != nil {
		return 0, err
	}
	return ob.(*outbox.MySQLStore).Enqueue(ctx, stx, m)
}

func (r *mysqlRepo) setting(ctx context.Context, name, value string) (string, error) {
	if _, err := r.db.ExecContext(ctx, r.q.settingAdd, name, value); err != nil {
		return "", err
	}
	var v string
	err := r.db.QueryRowContext(ctx, r.q.settingGet, name).Scan(&v)
	return v, err
}

func (r *mysqlRepo) anyPayment(ctx context.Context) (bool, error) {
	var exists bool
	err := r.db.QueryRowContext(ctx, r.q.anyPayment).Scan(&exists)
	return exists, err
}

func (r *mysqlRepo) get(ctx context.Context, tenant, id string) (*Payment, error) {
	return scanMySQL(r.db.QueryRowContext(ctx, r.q.get, tenant, id))
}

func (r *mysqlRepo) byID(ctx context.Context, id string) (*Payment, error) {
	return scanMySQL(r.db.QueryRowContext(ctx, r.q.getByID, id))
}

func (r *mysqlRepo) list(ctx context.Context, tenant string, before int64, limit int) ([]*Payment, error) {
	rows, err := r.db.QueryContext(ctx, r.q.list, tenant, before, limit)
	if err != nil {
		return nil, err
	}
	return collectMySQL(rows)
}

// exec runs an UPDATE and reports whether it matched a row (the pool
// counts matched rows: idemmysql.NewConnector's clientFoundRows).
func (r *mysqlRepo) exec(ctx context.Context, query string, args ...any) (bool, error) {
	res, err := r.db.ExecContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

func (r *mysqlRepo) markSucceeded(ctx context.Context, ob outbox.Store, id, chargeID string, now time.Time, event *outbox.Message) (bool, error) {
	if event == nil {
		return r.exec(ctx, r.q.markSucceeded, chargeID, utc(now), id)
	}
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, r.q.markSucceeded, chargeID, utc(now), id)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	if _, err := ob.(*outbox.MySQLStore).Enqueue(ctx, tx, *event); err != nil && !errors.Is(err, outbox.ErrDuplicate) {
		return false, fmt.Errorf("enqueueing the %s event: %w", event.Topic, err)
	}
	return true, tx.Commit()
}

func (r *mysqlRepo) markFailed(ctx context.Context, id, reason string, now time.Time) (bool, error) {
	return r.exec(ctx, r.q.markFailed, reason, utc(now), id)
}

func (r *mysqlRepo) markUnknown(ctx context.Context, id string, now time.Time) (bool, error) {
	return r.exec(ctx, r.q.markUnknown, utc(now), id)
}

func (r *mysqlRepo) deferReconcile(ctx context.Context, id string, next time.Time) error {
	_, err := r.exec(ctx, r.q.deferRecheck, utc(next), id)
	return err
}

func (r *mysqlRepo) unsettled(ctx context.Context, now time.Time, limit int) ([]*unsettledPayment, error) {
	rows, err := r.db.QueryContext(ctx, r.q.unsettled, utc(now), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*unsettledPayment
	for rows.Next() {
		var s mysqlScan
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

func (r *mysqlRepo) ledgerWatermark(ctx context.Context) (int64, error) {
	var seq int64
	err := r.db.QueryRowContext(ctx, r.q.ledgerWatermark).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return seq, err
}

func (r *mysqlRepo) ledgerAdvance(ctx context.Context, seq int64, now time.Time) error {
	_, err := r.db.ExecContext(ctx, r.q.ledgerAdvance, seq, utc(now))
	return err
}

// mysqlDuplicateEntry is ER_DUP_ENTRY, a unique key's violation.
const mysqlDuplicateEntry = 1062

func (r *mysqlRepo) ledgerReport(ctx context.Context, d *LedgerDiscrepancy) (bool, error) {
	_, err := r.db.ExecContext(ctx, r.q.ledgerReport, d.ChargeID, d.ChargeSeq, d.Kind, d.Reference,
		nullString(d.PaymentID), nullString(d.Tenant), d.AmountCents, d.Currency, utc(d.ChargedAt), utc(d.FoundAt))
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == mysqlDuplicateEntry {
		return false, nil // known already
	}
	return err == nil, err
}

func (r *mysqlRepo) ledgerList(ctx context.Context, before int64, limit int) ([]*LedgerDiscrepancy, error) {
	rows, err := r.db.QueryContext(ctx, r.q.ledgerList, before, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*LedgerDiscrepancy
	for rows.Next() {
		d := &LedgerDiscrepancy{}
		var paymentID, tenant, resolvedBy, status sql.NullString
		var resolved sql.NullTime
		if err := rows.Scan(&d.ChargeID, &d.ChargeSeq, &d.Kind, &d.Reference, &paymentID, &tenant,
			&d.AmountCents, &d.Currency, &d.ChargedAt, &d.FoundAt, &resolved, &resolvedBy, &status); err != nil {
			return nil, err
		}
		d.PaymentID, d.Tenant, d.PaymentStatus = paymentID.String, tenant.String, Status(status.String)
		d.ChargedAt, d.FoundAt = d.ChargedAt.UTC(), d.FoundAt.UTC()
		if resolved.Valid {
			d.ResolvedAt, d.ResolvedBy = resolved.Time.UTC(), resolvedBy.String
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

func (r *mysqlRepo) ledgerCounts(ctx context.Context) (map[string]int, error) {
	rows, err := r.db.QueryContext(ctx, r.q.ledgerCounts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := make(map[string]int)
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			return nil, err
		}
		counts[kind] = n
	}
	return counts, rows.Err()
}

func (r *mysqlRepo) ledgerResolve(ctx context.Context, chargeID, by string, now time.Time) (bool, error) {
	return r.exec(ctx, r.q.ledgerResolve, utc(now), by, chargeID)
}

func (r *mysqlRepo) ledgerPayments(ctx context.Context, ids []string) (map[string]*Payment, error) {
	out := make(map[string]*Payment, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	query := strings.ReplaceAll(r.q.ledgerPayments, "{{ids}}", strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", "))
	rows, err := r.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	ps, err := collectMySQL(rows)
	for _, p := range ps {
		out[p.ID] = p
	}
	return out, err
}

func collectMySQL(rows *sql.Rows) ([]*Payment, error) {
	defer rows.Close()
	var out []*Payment
	for rows.Next() {
		p, err := scanMySQL(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

func scanMySQL(row rowScanner) (*Payment, error) {
	var s mysqlScan
	if err := row.Scan(s.dest()...); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, errNotFound
		}
		return nil, err
	}
	return s.payment(), nil
}

// mysqlScan receives the payment columns of a MySQL row.
type mysqlScan struct {
	p                Payment
	status           string
	chargeID, reason sql.NullString
}

func (s *mysqlScan) dest() []any {
	p := &s.p
	return []any{&p.seq, &p.ID, &p.tenant, &p.CustomerID, &p.AmountCents, &p.Currency, &s.status,
		&p.providerKey, &p.outboxID, &s.chargeID, &s.reason, &p.reconcileAttempts, &p.CreatedAt, &p.updatedAt}
}

func (s *mysqlScan) payment() *Payment {
	p := s.p
	p.Status = Status(s.status)
	p.ChargeID = s.chargeID.String
	p.FailureReason = s.reason.String
	p.CreatedAt = p.CreatedAt.UTC()
	p.updatedAt = p.updatedAt.UTC()
	return &p
}
