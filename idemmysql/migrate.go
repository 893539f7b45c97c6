package idemmysql

import (
	"context"
	"time"

	"github.com/idem-dev/idem/internal/migrate"
)

// Migration is one embedded schema migration and its state in a database.
type Migration struct {
	// Version orders the migrations; it is the file name's number.
	Version int
	// Name is the file name without the version and the suffix.
	Name string
	// Applied reports whether the migration is applied.
	Applied bool
	// AppliedAt is when it was applied, by the store's clock.
	AppliedAt time.Time
}

// migrations are the embedded migrations in version order.
var migrations = migrate.MustLoad(migrationsFS, "migrations")

// migrator runs the embedded migrations in the connection's database,
// recording them in its idem_migrations table.
func (s *Store) migrator() *migrate.Runner {
	return &migrate.Runner{
		Migrations: migrations,
		Dialect:    &migrate.MySQL{DB: s.db, Table: "idem_migrations", LockName: "idemmysql.migrate"},
		Now:        s.now,
	}
}

// Migrate applies the pending migrations and returns those it applied. It
// holds a named lock (GET_LOCK), so processes that start at once apply each
// migration once. MySQL commits each DDL statement at once: a migration
// that fails leaves the ones before it applied (see migrate.MySQL).
func (s *Store) Migrate(ctx context.Context) ([]Migration, error) {
	done, err := s.migrator().Up(ctx)
	return migrate.As[Migration](done), err
}

// MigrateDown reverts the latest applied migration and returns it, or nil
// when none is applied.
func (s *Store) MigrateDown(ctx context.Context) (*Migration, error) {
	reverted, err := s.migrator().Down(ctx)
	return migrate.AsOne[Migration](reverted), err
}

// MigrationStatus returns every embedded migration with its state in the
// database.
func (s *Store) MigrationStatus(ctx context.Context) ([]Migration, error) {
	status, err := s.migrator().Status(ctx)
	return migrate.As[Migration](status), err
}
