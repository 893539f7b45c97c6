package migrate

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/sqlfile"
)

//go:embed mysql.sql
var mysqlSQL string

var mysqlStatements = sqlfile.MustParse("internal/migrate/mysql.sql", mysqlSQL)

// MySQL is the Dialect of a MySQL 8 or MariaDB 10.6+ database on
// database/sql. Its connections must scan DATETIME into time.Time
// (go-sql-driver's parseTime) in UTC, and accept several statements in one
// query when a migration holds several (multiStatements).
//
// Its migration lock is a named lock (GET_LOCK) keyed by LockName and the
// database, held by one connection while it migrates. MySQL commits every
// DDL statement at once, so Locked cannot roll a failed migration back:
// the migrations before it stay applied and recorded, and the statements of
// the failed one that ran before its error stay done. Migrations for MySQL
// are therefore written so that each can be applied again after a failure
// (or reverted by hand), and a migration holds one DDL statement where it
// can.
type MySQL struct {
	// DB is the database: the tables are those of its connections' default
	// database (the DSN's).
	DB *sql.DB
	// Table is the migrations table's unquoted name.
	Table string
	// LockName names the lock: processes that migrate one database with
	// the same LockName take turns.
	LockName string
	// LockWait bounds the wait for the lock. Defaults to one minute.
	LockWait time.Duration
}

var _ Dialect = (*MySQL)(nil)

// Locked implements Dialect. f's statements commit as they run (see MySQL).
func (m *MySQL) Locked(ctx context.Context, f func(tx Tx, applied map[int]time.Time) error) (err error) {
	q := m.statements()
	conn, err := m.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var database sql.NullString
	if err := conn.QueryRowContext(ctx, q["database"]).Scan(&database); err != nil {
		return err
	}
	if !database.Valid {
		return errors.New("the connection names no database")
	}
	id := uint64(LockID(m.LockName, database.String))
	lock := fmt.Sprintf("%s:%016x", m.LockName, id)
	if len(lock) > 64 {
		lock = fmt.Sprintf("idem:%016x", id)
	}
	wait := m.LockWait
	if wait <= 0 {
		wait = time.Minute
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, q["lock"], lock, int64(wait/time.Second)).Scan(&got); err != nil {
		return fmt.Errorf("taking the migration lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("taking the migration lock: another process held it for %v", wait)
	}
	defer func() {
		// A detached context: the lock must go even when ctx ended (closing
		// the connection would also free it).
		var released sql.NullInt64
		if rerr := conn.QueryRowContext(context.WithoutCancel(ctx), q["unlock"], lock).Scan(&released); rerr != nil && err == nil {
			err = fmt.Errorf("releasing the migration lock: %w", rerr)
		}
	}()
	if _, err := conn.ExecContext(ctx, q["create_table"]); err != nil {
		return fmt.Errorf("creating the migrations table: %w", err)
	}
	applied, err := m.applied(ctx, conn, q)
	if err != nil {
		return err
	}
	return f(&mysqlTx{conn: conn, q: q}, applied)
}

// Applied implements Dialect.
func (m *MySQL) Applied(ctx context.Context) (map[int]time.Time, error) {
	return m.applied(ctx, m.DB, m.statements())
}

// mysqlQuerier is a *sql.DB or a *sql.Conn.
type mysqlQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (m *MySQL) applied(ctx context.Context, db mysqlQuerier, q map[string]string) (map[int]time.Time, error) {
	applied := make(map[int]time.Time)
	var exists bool
	if err := db.QueryRowContext(ctx, q["table_exists"], m.Table).Scan(&exists); err != nil || !exists {
		return applied, err
	}
	rows, err := db.QueryContext(ctx, q["applied"])
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		var at time.Time
		if err := rows.Scan(&v, &at); err != nil {
			return nil, err
		}
		applied[v] = at.UTC()
	}
	return applied, rows.Err()
}

// statements returns the dialect's statements with the placeholders filled.
func (m *MySQL) statements() map[string]string {
	quote := func(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }
	r := strings.NewReplacer("{{table}}", quote(m.Table), "{{pkey}}", quote(m.Table+"_pkey"))
	q := make(map[string]string, len(mysqlStatements))
	for name, sql := range mysqlStatements {
		q[name] = r.Replace(sql)
	}
	return q
}

// mysqlTx is the Tx of MySQL: a connection holding the migration lock,
// whose statements commit as they run.
type mysqlTx struct {
	conn *sql.Conn
	q    map[string]string
}

func (t *mysqlTx) Exec(ctx context.Context, sql string) error {
	_, err := t.conn.ExecContext(ctx, sql)
	return err
}

func (t *mysqlTx) Record(ctx context.Context, m Migration, at time.Time) error {
	_, err := t.conn.ExecContext(ctx, t.q["record"], m.Version, m.Name, at.UTC().Truncate(time.Microsecond))
	return err
}

func (t *mysqlTx) Unrecord(ctx context.Context, version int) error {
	_, err := t.conn.ExecContext(ctx, t.q["unrecord"], version)
	return err
}
