package migrate

import (
	"context"
	"database/sql"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/sqlfile"
)

//go:embed sqlite.sql
var sqliteSQL string

var sqliteStatements = sqlfile.MustParse("internal/migrate/sqlite.sql", sqliteSQL)

// SQLite is the Dialect of a SQLite database on database/sql. Its migration
// lock is SQLite's write lock: Locked begins IMMEDIATE on one connection,
// whatever transaction mode the pool's connections default to.
type SQLite struct {
	// DB is the database.
	DB *sql.DB
	// Table is the migrations table's unquoted name.
	Table string
}

var _ Dialect = (*SQLite)(nil)

// Locked implements Dialect.
func (s *SQLite) Locked(ctx context.Context, f func(tx Tx, applied map[int]time.Time) error) (err error) {
	q := s.statements()
	conn, err := s.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("taking the write lock: %w", err)
	}
	defer func() {
		// A detached context: the rollback must run even when ctx ended.
		if err != nil {
			conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
			return
		}
		if _, err = conn.ExecContext(ctx, "COMMIT"); err != nil {
			conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	if _, err := conn.ExecContext(ctx, q["create_table"]); err != nil {
		return fmt.Errorf("creating the migrations table: %w", err)
	}
	applied, err := s.applied(ctx, conn, q)
	if err != nil {
		return err
	}
	return f(&sqliteTx{conn: conn, q: q}, applied)
}

// Applied implements Dialect.
func (s *SQLite) Applied(ctx context.Context) (map[int]time.Time, error) {
	return s.applied(ctx, s.DB, s.statements())
}

// sqliteQuerier is a *sql.DB or a *sql.Conn.
type sqliteQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (s *SQLite) applied(ctx context.Context, db sqliteQuerier, q map[string]string) (map[int]time.Time, error) {
	applied := make(map[int]time.Time)
	var exists bool
	if err := db.QueryRowContext(ctx, q["table_exists"], s.Table).Scan(&exists); err != nil || !exists {
		return applied, err
	}
	rows, err := db.QueryContext(ctx, q["applied"])
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		var at int64
		if err := rows.Scan(&v, &at); err != nil {
			return nil, err
		}
		applied[v] = time.UnixMicro(at).UTC()
	}
	return applied, rows.Err()
}

// statements returns the dialect's statements with the placeholders filled.
func (s *SQLite) statements() map[string]string {
	quote := func(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }
	r := strings.NewReplacer("{{table}}", quote(s.Table), "{{pkey}}", quote(s.Table+"_pkey"))
	q := make(map[string]string, len(sqliteStatements))
	for name, sql := range sqliteStatements {
		q[name] = r.Replace(sql)
	}
	return q
}

// sqliteTx is the Tx of SQLite: a connection inside BEGIN IMMEDIATE.
type sqliteTx struct {
	conn *sql.Conn
	q    map[string]string
}

func (t *sqliteTx) Exec(ctx context.Context, sql string) error {
	_, err := t.conn.ExecContext(ctx, sql)
	return err
}

func (t *sqliteTx) Record(ctx context.Context, m Migration, at time.Time) error {
	_, err := t.conn.ExecContext(ctx, t.q["record"], m.Version, m.Name, at.UnixMicro())
	return err
}

func (t *sqliteTx) Unrecord(ctx context.Context, version int) error {
	_, err := t.conn.ExecContext(ctx, t.q["unrecord"], version)
	return err
}
