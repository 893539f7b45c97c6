package outbox

import (
	"context"
	"fmt"
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

// The embedded migrations of each dialect, in version order.
var (
	postgresMigrations = migrate.MustLoad(migrationsFS, "migrations/postgres")
	sqliteMigrations   = migrate.MustLoad(migrationsFS, "migrations/sqlite")
)

// migrationsTable records the outbox's migrations, apart from the idem
// store's, which may share the database.
const migrationsTable = "idem_outbox_migrations"

// migrateUp, migrateDown and migrationStatus are the stores' Migrate,
// MigrateDown and MigrationStatus on their runner.
func migrateUp(ctx context.Context, r *migrate.Runner) ([]Migration, error) {
	done, err := r.Up(ctx)
	return migrate.As[Migration](done), wrapMigrateError(err)
}

func migrateDown(ctx context.Context, r *migrate.Runner) (*Migration, error) {
	reverted, err := r.Down(ctx)
	return migrate.AsOne[Migration](reverted), wrapMigrateError(err)
}

func migrationStatus(ctx context.Context, r *migrate.Runner) ([]Migration, error) {
	status, err := r.Status(ctx)
	return migrate.As[Migration](status), wrapMigrateError(err)
}

func wrapMigrateError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("outbox: %w", err)
}
