package provider

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
)

//go:embed queries/mysql.sql
var mysqlSQL string

// openMySQL opens the idem store and the ledger in the database of a
// mysql:// URL.
func openMySQL(ctx context.Context, rawURL string, now func() time.Time) (idemstore.TxStore, ledger, error) {
	redacted := storeurl.Redact(rawURL)
	dsn, maxConns, err := storeurl.ParseMySQL(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("provider: %w", err)
	}
	store, err := idemmysql.Open(ctx, dsn, &idemmysql.Config{Now: now, MaxConns: maxConns})
	if err != nil {
		return nil, nil, fmt.Errorf("provider: store %s: %w", redacted, err)
	}
	l := &mysqlLedger{store: store, db: store.DB(), q: parseQueries(mysqlSQL, "")}
	if _, err := store.Migrate(ctx); err != nil {
		store.Close()
		return nil, nil, fmt.Errorf("provider: store %s: %w", redacted, err)
	}
	if _, err := l.db.ExecContext(ctx, l.q.create); err != nil {
		store.Close()
		return nil, nil, fmt.Errorf("provider: store %s: creating the ledger: %w", redacted, err)
	}
	return store, l, nil
}

// mysqlLedger keeps the ledger in the idem store's MySQL database.
type mysqlLedger struct {
	store *idemmysql.Store
	db    *sql.DB
	q     ledgerQueries
}

// mysqlDuplicateEntry is ER_DUP_ENTRY, a unique key's violation.
const mysqlDuplicateEntry = 1062

func (l *mysqlLedger) insert(ctx context.Context, tx idemstore.Tx, c *Charge) (*Charge, error) {
	stx, ok := idemmysql.TxFrom(tx)
	if !ok {
		return nil, fmt.Errorf("provider: the request's transaction is a %T, not an idemmysql one", tx)
	}
	res, err := stx.ExecContext(ctx, l.q.insert,
		c.ID, c.IdempotencyKey, c.AmountCents, c.Currency, c.Reference, c.CreatedAt.UTC().Truncate(time.Microsecond))
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == mysqlDuplicateEntry {
		return scanMySQLCharge(stx.QueryRowContext(ctx, l.q.getByKey, c.IdempotencyKey))
	}
	if err != nil {
		return nil, fmt.Errorf("inserting charge: %w", err)
	}
	if c.Seq, err = res.LastInsertId(); err != nil {
		return nil, fmt.Errorf("inserting charge: %w", err)
	}
	return nil, nil
}

func (l *mysqlLedger) byKey(ctx context.Context, key string) (*Charge, error) {
	return scanMySQLCharge(l.db.QueryRowContext(ctx, l.q.getByKey, key))
}

func (l *mysqlLedger) byID(ctx context.Context, id string) (*Charge, error) {
	return scanMySQLCharge(l.db.QueryRowContext(ctx, l.q.getByID, id))
}

func (l *mysqlLedger) list(ctx context.Context) ([]Charge, error) {
	return l.query(ctx, l.q.list)
}

func (l *mysqlLedger) page(ctx context.Context, after int64, limit int) ([]Charge, error) {
	return l.query(ctx, l.q.page, after, limit)
}

func (l *mysqlLedger) query(ctx context.Context, query string, args ...any) ([]Charge, error) {
	rows, err := l.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("listing charges: %w", err)
	}
	defer rows.Close()
	out := []Charge{}
	for rows.Next() {
		c, err := scanMySQLCharge(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing charges: %w", err)
	}
	return out, nil
}

func (l *mysqlLedger) close() error { return l.store.Close() }

func scanMySQLCharge(row scanner) (*Charge, error) {
	var c Charge
	err := row.Scan(&c.Seq, &c.ID, &c.IdempotencyKey, &c.AmountCents, &c.Currency, &c.Reference, &c.CreatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errNoCharge
	}
	if err != nil {
		return nil, fmt.Errorf("reading charge: %w", err)
	}
	c.CreatedAt = c.CreatedAt.UTC()
	return &c, nil
}
