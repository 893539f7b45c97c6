// Package pgxmigrate is the PostgreSQL dialect of package migrate, on pgx.
// It is a module of its own so that the foundations of the root module
// name no driver.
package pgxmigrate

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/internal/migrate"
	"github.com/idem-dev/idem/internal/sqlfile"
)

//go:embed postgres.sql
var postgresSQL string

var postgresStatements = sqlfile.MustParse("internal/pgxmigrate/postgres.sql", postgresSQL)

// PgxDB is what Postgres migrates through: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx.
type PgxDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Postgres is the migrate.Dialect of a PostgreSQL database on pgx. Its
// migration lock is a transaction-level advisory lock keyed by LockName and
// the schema.
type Postgres struct {
	// DB is the database.
	DB PgxDB
	// Schema is the unquoted name of the schema that holds the migrations
	// table; Locked creates it when it is missing. Empty means the first
	// existing schema of the search_path, and the table's name is then left
	// unqualified.
	Schema string
	// Table is the migrations table's unquoted name.
	Table string
	// LockName names the advisory lock: processes that migrate one schema
	// with the same LockName take turns.
	LockName string
}

var _ migrate.Dialect = (*Postgres)(nil)

// Locked implements Dialect.
func (p *Postgres) Locked(ctx context.Context, f func(tx migrate.Tx, applied map[int]time.Time) error) error {
	q := p.statements()
	return pgx.BeginFunc(ctx, p.DB, func(tx pgx.Tx) error {
		schema := p.Schema
		if schema == "" {
			var current *string
			if err := tx.QueryRow(ctx, q["current_schema"]).Scan(&current); err != nil {
				return err
			}
			if current == nil {
				return errors.New("no schema of the search_path exists")
			}
			schema = *current
		}
		if _, err := tx.Exec(ctx, q["lock"], migrate.LockID(p.LockName, schema)); err != nil {
			return fmt.Errorf("taking the migration lock: %w", err)
		}
		if p.Schema != "" {
			var exists bool
			if err := tx.QueryRow(ctx, q["schema_exists"], p.Schema).Scan(&exists); err != nil {
				return err
			}
			if !exists {
				if _, err := tx.Exec(ctx, q["create_schema"]); err != nil {
					return fmt.Errorf("creating schema: %w", err)
				}
			}
		}
		if _, err := tx.Exec(ctx, q["create_table"]); err != nil {
			return fmt.Errorf("creating the migrations table: %w", err)
		}
		applied, err := p.applied(ctx, tx, q)
		if err != nil {
			return err
		}
		return f(&pgxTx{tx: tx, q: q}, applied)
	})
}

// Applied implements Dialect.
func (p *Postgres) Applied(ctx context.Context) (map[int]time.Time, error) {
	return p.applied(ctx, p.DB, p.statements())
}

func (p *Postgres) applied(ctx context.Context, db PgxDB, q map[string]string) (map[int]time.Time, error) {
	applied := make(map[int]time.Time)
	var exists bool
	if err := db.QueryRow(ctx, q["table_exists"], p.table()).Scan(&exists); err != nil {
		return nil, err
	}
	if !exists {
		return applied, nil
	}
	rows, err := db.Query(ctx, q["applied"])
	if err != nil {
		return nil, err
	}
	var v int
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&v, &at}, func() error {
		applied[v] = at.UTC()
		return nil
	})
	return applied, err
}

// table returns the migrations table's quoted name, qualified by the schema
// when there is one.
func (p *Postgres) table() string {
	if p.Schema == "" {
		return pgx.Identifier{p.Table}.Sanitize()
	}
	return pgx.Identifier{p.Schema, p.Table}.Sanitize()
}

// statements returns the dialect's statements with the placeholders filled.
func (p *Postgres) statements() map[string]string {
	r := strings.NewReplacer(
		"{{schema}}", pgx.Identifier{p.Schema}.Sanitize(),
		"{{table}}", p.table(),
		"{{pkey}}", pgx.Identifier{p.Table + "_pkey"}.Sanitize(),
	)
	q := make(map[string]string, len(postgresStatements))
	for name, sql := range postgresStatements {
		q[name] = r.Replace(sql)
	}
	return q
}

// pgxTx is the migrate.Tx of Postgres.
type pgxTx struct {
	tx pgx.Tx
	q  map[string]string
}

func (t *pgxTx) Exec(ctx context.Context, sql string) error {
	_, err := t.tx.Exec(ctx, sql)
	return err
}

func (t *pgxTx) Record(ctx context.Context, m migrate.Migration, at time.Time) error {
	_, err := t.tx.Exec(ctx, t.q["record"], m.Version, m.Name, at)
	return err
}

func (t *pgxTx) Unrecord(ctx context.Context, version int) error {
	_, err := t.tx.Exec(ctx, t.q["unrecord"], version)
	return err
}
