package idempgx

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-dev/idem/internal/migrate"
	"github.com/idem-dev/idem/internal/pgxmigrate"
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

// migrator runs the embedded migrations in the store's schema, recording
// them in its idem_migrations table.
func (s *Store) migrator() *migrate.Runner {
	return &migrate.Runner{
		Migrations: migrations,
		Dialect: &pgxmigrate.Postgres{
			DB:       s.pool,
			Schema:   s.cfg.Schema,
			Table:    "idem_migrations",
			LockName: "idempgx.migrate",
		},
		Now: s.now,
		Expand: func(sql string) string {
			return expandPartitions(expand(sql, s.schema, s.channel), s.schema, s.cfg.Partitions)
		},
	}
}

// Migrate applies the pending migrations, creating the schema when it is
// missing, and returns those it applied. It runs in one transaction under an
// advisory lock, so processes that start at once apply each migration once.
func (s *Store) Migrate(ctx context.Context) ([]Migration, error) {
	if n := s.cfg.Partitions; n < 0 || n > MaxPartitions {
		return nil, fmt.Errorf("idempgx: %d partitions: want 0 (one table) to %d", n, MaxPartitions)
	}
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
