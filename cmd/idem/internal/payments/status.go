package payments

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/internal/migrate"
	"github.com/idem-dev/idem/internal/pgxmigrate"
)

// MigrationsTable is the table that records the payments table's
// migrations, beside the idem store's and the outbox's in one database.
const MigrationsTable = migrationsTable

// SQLiteMigrationStatus returns the payments table's migrations with their
// state in the SQLite database db. It writes nothing.
func SQLiteMigrationStatus(ctx context.Context, db *sql.DB) ([]migrate.Status, error) {
	r := &sqliteRepo{db: db}
	return r.migrator(time.Now).Status(ctx)
}

// PostgresMigrationStatus returns the payments table's migrations with
// their state in schema of the PostgreSQL database db. It writes nothing.
func PostgresMigrationStatus(ctx context.Context, db pgxmigrate.PgxDB, schema string) ([]migrate.Status, error) {
	quoted := pgx.Identifier{schema}.Sanitize() + "."
	r := &migrate.Runner{
		Migrations: postgresMigrations,
		Dialect:    &pgxmigrate.Postgres{DB: db, Schema: schema, Table: migrationsTable, LockName: "payments.migrate"},
		Now:        time.Now,
		Expand:     func(sql string) string { return strings.ReplaceAll(sql, "{{schema}}", quoted) },
	}
	return r.Status(ctx)
}
