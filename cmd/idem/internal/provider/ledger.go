package provider

import (
	"context"
	"database/sql"
	_ "embed"
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
	"github.com/idem-dev/idem/internal/sqlfile"
)

//go:embed queries/sqlite.sql
var sqliteSQL string

//go:embed queries/postgres.sql
var postgresSQL string

// Charge is one entry of the provider's ledger.
type Charge struct {
	// Seq is the charge's position in the ledger: it grows with every
	// charge, so a client pages through the ledger with GET
	// /charges?after=SEQ.
	Seq            int64     `json:"seq"`
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotency_key"`
	AmountCents    int64     `json:"amount_cents"`
	Currency       string    `json:"currency"`
	Reference      string    `json:"reference"`
	CreatedAt      time.Time `json:"created_at"`
}

// errNoCharge is returned by the ledger's lookups when no charge matches.
var errNoCharge = errors.New("provider: no such charge")

// ledger is the durable record of charges, next to the idem store.
type ledger interface {
	// insert adds c inside the request's business transaction. When a
	// charge with c's key exists it returns that charge and adds nothing.
	insert(ctx context.Context, tx idemstore.Tx, c *Charge) (existing *Charge, err error)
	byKey(ctx context.Context, key string) (*Charge, error)
	byID(ctx context.Context, id string) (*Charge, error)
	list(ctx context.Context) ([]Charge, error)
	// page returns at most limit charges with a seq above after, in
	// ledger order.
	page(ctx context.Context, after int64, limit int) ([]Charge, error)
	close() error
}

// ledgerQueries are one dialect's statements.
type ledgerQueries struct {
	create, insert, getByKey, getByID, list, page string
}

// parseQueries reads the ledger's statements from src and fills in the
// {{schema}} placeholder with the quoted schema name.
func parseQueries(src, schema string) ledgerQueries {
	m := sqlfile.MustParse("provider: the ledger queries", src)
	q := func(name string) string {
		s, ok := m[name]
		if !ok {
			panic(fmt.Sprintf("provider: the ledger queries have no statement %q", name))
		}
		return strings.ReplaceAll(s, "{{schema}}", schema)
	}
	return ledgerQueries{
		create:   q("create"),
		insert:   q("insert"),
		getByKey: q("get_by_key"),
		getByID:  q("get_by_id"),
		list:     q("list"),
		page:     q("page"),
	}
}

// openStore opens the idem store and the ledger that rawURL names:
// sqlite:PATH (with ?synchronous=NORMAL as an option), postgres://…
// (with ?schema=NAME, default public) or mysql://… (the URL's database). The ledger's table lives next to the
// store's, and is created when missing.
func openStore(ctx context.Context, rawURL string, now func() time.Time) (idemstore.TxStore, ledger, error) {
	switch storeurl.Kind(rawURL) {
	case storeurl.KindSQLite:
		return openSQLite(ctx, rawURL, now)
	case storeurl.KindPostgres:
		return openPostgres(ctx, rawURL, now)
	case storeurl.KindMySQL:
		return openMySQL(ctx, rawURL, now)
	}
	return nil, nil, fmt.Errorf("provider: store %s: want sqlite:PATH, postgres://… or mysql://… (the ledger needs a SQL store)", storeurl.Redact(rawURL))
}

func openSQLite(ctx context.Context, rawURL string, now func() time.Time) (idemstore.TxStore, ledger, error) {
	path, cfg, err := storeurl.ParseSQLite(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("provider: %w", err)
	}
	cfg.Now = now
	store, err := idemsqlite.Open(path, &cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("provider: %w", err)
	}
	l := &sqliteLedger{store: store, db: store.DB(), q: parseQueries(sqliteSQL, "")}
	if _, err := l.db.ExecContext(ctx, l.q.create); err != nil {
		store.Close()
		return nil, nil, fmt.Errorf("provider: creating the ledger in %s: %w", path, err)
	}
	return store, l, nil
}

func openPostgres(ctx context.Context, rawURL string, now func() time.Time) (idemstore.TxStore, ledger, error) {
	pcfg, schema, err := storeurl.ParsePostgres(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("provider: %w", err)
	}
	if schema == "" {
		schema = idempgx.DefaultSchema
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("provider: %w", storeurl.Wrap(rawURL, err))
	}
	store := idempgx.New(pool, &idempgx.Config{Schema: schema, Now: now})
	l := &pgxLedger{store: store, pool: pool, q: parseQueries(postgresSQL, pgx.Identifier{schema}.Sanitize())}
	if _, err := store.Migrate(ctx); err != nil {
		l.close()
		return nil, nil, fmt.Errorf("provider: %w", storeurl.Wrap(rawURL, err))
	}
	if _, err := pool.Exec(ctx, l.q.create); err != nil {
		l.close()
		return nil, nil, fmt.Errorf("provider: %w", storeurl.Wrap(rawURL, fmt.Errorf("creating the ledger: %w", err)))
	}
	return store, l, nil
}

// sqliteLedger keeps the ledger in the idem store's SQLite file.
type sqliteLedger struct {
	store *idemsqlite.Store
	db    *sql.DB
	q     ledgerQueries
}

func (l *sqliteLedger) insert(ctx context.Context, tx idemstore.Tx, c *Charge) (*Charge, error) {
	stx, ok := idemsqlite.TxFrom(tx)
	if !ok {
		return nil, fmt.Errorf("provider: the request's transaction is a %T, not an idemsqlite one", tx)
	}
	err := stx.QueryRowContext(ctx, l.q.insert,
		c.ID, c.IdempotencyKey, c.AmountCents, c.Currency, c.Reference, c.CreatedAt.UnixMicro()).Scan(&c.Seq)
	if errors.Is(err, sql.ErrNoRows) {
		return scanSQLiteCharge(stx.QueryRowContext(ctx, l.q.getByKey, c.IdempotencyKey))
	}
	if err != nil {
		return nil, fmt.Errorf("inserting charge: %w", err)
	}
	return nil, nil
}

func (l *sqliteLedger) byKey(ctx context.Context, key string) (*Charge, error) {
	return scanSQLiteCharge(l.db.QueryRowContext(ctx, l.q.getByKey, key))
}

func (l *sqliteLedger) byID(ctx context.Context, id string) (*Charge, error) {
	return scanSQLiteCharge(l.db.QueryRowContext(ctx, l.q.getByID, id))
}

func (l *sqliteLedger) list(ctx context.Context) ([]Charge, error) {
	return l.query(ctx, l.q.list)
}

func (l *sqliteLedger) page(ctx context.Context, after int64, limit int) ([]Charge, error) {
	return l.query(ctx, l.q.page, after, limit)
}

func (l *sqliteLedger) query(ctx context.Context, query string, args ...any) ([]Charge, error) {
	rows, err := l.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("listing charges: %w", err)
	}
	defer rows.Close()
	out := []Charge{}
	for rows.Next() {
		c, err := scanSQLiteCharge(rows)
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

func (l *sqliteLedger) close() error { return l.store.Close() }

type scanner interface{ Scan(dest ...any) error }

func scanSQLiteCharge(row scanner) (*Charge, error) {
	var c Charge
	var created int64
	err := row.Scan(&c.Seq, &c.ID, &c.IdempotencyKey, &c.AmountCents, &c.Currency, &c.Reference, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errNoCharge
	}
	if err != nil {
		return nil, fmt.Errorf("reading charge: %w", err)
	}
	c.CreatedAt = time.UnixMicro(created).UTC()
	return &c, nil
}

// pgxLedger keeps the ledger in the idem store's PostgreSQL schema.
type pgxLedger struct {
	store *idempgx.Store
	pool  *pgxpool.Pool
	q     ledgerQueries
}

func (l *pgxLedger) insert(ctx context.Context, tx idemstore.Tx, c *Charge) (*Charge, error) {
	ptx, ok := idempgx.TxFrom(tx)
	if !ok {
		return nil, fmt.Errorf("provider: the request's transaction is a %T, not an idempgx one", tx)
	}
	err := ptx.QueryRow(ctx, l.q.insert,
		c.ID, c.IdempotencyKey, c.AmountCents, c.Currency, c.Reference, c.CreatedAt).Scan(&c.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return scanPgxCharge(ptx.QueryRow(ctx, l.q.getByKey, c.IdempotencyKey))
	}
	if err != nil {
		return nil, fmt.Errorf("inserting charge: %w", err)
	}
	return nil, nil
}

func (l *pgxLedger) byKey(ctx context.Context, key string) (*Charge, error) {
	return scanPgxCharge(l.pool.QueryRow(ctx, l.q.getByKey, key))
}

func (l *pgxLedger) byID(ctx context.Context, id string) (*Charge, error) {
	return scanPgxCharge(l.pool.QueryRow(ctx, l.q.getByID, id))
}

func (l *pgxLedger) list(ctx context.Context) ([]Charge, error) {
	return l.query(ctx, l.q.list)
}

func (l *pgxLedger) page(ctx context.Context, after int64, limit int) ([]Charge, error) {
	return l.query(ctx, l.q.page, after, limit)
}

func (l *pgxLedger) query(ctx context.Context, query string, args ...any) ([]Charge, error) {
	rows, err := l.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("listing charges: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Charge, error) {
		c, err := scanPgxCharge(row)
		if err != nil {
			return Charge{}, err
		}
		return *c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing charges: %w", err)
	}
	if out == nil {
		out = []Charge{}
	}
	return out, nil
}

func (l *pgxLedger) close() error {
	l.store.Close()
	l.pool.Close()
	return nil
}

func scanPgxCharge(row pgx.Row) (*Charge, error) {
	var c Charge
	err := row.Scan(&c.Seq, &c.ID, &c.IdempotencyKey, &c.AmountCents, &c.Currency, &c.Reference, &c.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errNoCharge
	}
	if err != nil {
		return nil, fmt.Errorf("reading charge: %w", err)
	}
	c.CreatedAt = c.CreatedAt.UTC()
	return &c, nil
}
