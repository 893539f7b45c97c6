package idemsqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

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

	up, down string
}

// migrations are the embedded migrations in version order.
var migrations = mustLoadMigrations(migrationsFS, "migrations")

// createMigrationsTable records which migrations a database has.
const createMigrationsTable = `CREATE TABLE IF NOT EXISTS idem_migrations (
	version    INTEGER NOT NULL,
	name       TEXT    NOT NULL,
	applied_at INTEGER NOT NULL,
	CONSTRAINT idem_migrations_pkey PRIMARY KEY (version)
) STRICT`

func mustLoadMigrations(fsys fs.FS, dir string) []Migration {
	ms, err := loadMigrations(fsys, dir)
	if err != nil {
		panic("idemsqlite: " + err.Error())
	}
	return ms
}

// loadMigrations reads NNN_name.up.sql / NNN_name.down.sql pairs numbered
// 1..n.
func loadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	byVersion := make(map[int]*Migration)
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), ".sql")
		if !ok {
			continue
		}
		base, direction, _ := strings.Cut(base, ".")
		num, name, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version <= 0 || (direction != "up" && direction != "down") {
			return nil, fmt.Errorf("migration %s: want NNN_name.up.sql or NNN_name.down.sql", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		m := byVersion[version]
		if m == nil {
			m = &Migration{Version: version, Name: name}
			byVersion[version] = m
		}
		if m.Name != name {
			return nil, fmt.Errorf("migration %d has two names, %s and %s", version, m.Name, name)
		}
		if direction == "up" {
			m.up = string(b)
		} else {
			m.down = string(b)
		}
	}
	var out []Migration
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migration %03d_%s lacks its up or down file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration versions are not 1..n: %03d is number %d", m.Version, i+1)
		}
	}
	return out, nil
}

// Migrate applies the pending migrations and returns those it applied. It
// runs in one write transaction, so processes that open the file at once
// apply each migration once.
func (s *Store) Migrate(ctx context.Context) ([]Migration, error) {
	var done []Migration
	err := s.migrateTx(ctx, func(tx *sql.Tx, applied map[int]time.Time) error {
		now := s.now()
		for _, m := range migrations {
			if _, ok := applied[m.Version]; ok {
				continue
			}
			if _, err := tx.ExecContext(ctx, m.up); err != nil {
				return fmt.Errorf("applying %03d_%s: %w", m.Version, m.Name, err)
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO idem_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
				m.Version, m.Name, micros(now))
			if err != nil {
				return fmt.Errorf("recording %03d_%s: %w", m.Version, m.Name, err)
			}
			m.Applied, m.AppliedAt = true, now
			done = append(done, m)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrating up: %w", err)
	}
	return done, nil
}

// MigrateDown reverts the latest applied migration and returns it, or nil
// when none is applied.
func (s *Store) MigrateDown(ctx context.Context) (*Migration, error) {
	var reverted *Migration
	err := s.migrateTx(ctx, func(tx *sql.Tx, applied map[int]time.Time) error {
		for i := len(migrations) - 1; i >= 0; i-- {
			m := migrations[i]
			if _, ok := applied[m.Version]; !ok {
				continue
			}
			if _, err := tx.ExecContext(ctx, m.down); err != nil {
				return fmt.Errorf("reverting %03d_%s: %w", m.Version, m.Name, err)
			}
			if _, err := tx.ExecContext(ctx, "DELETE FROM idem_migrations WHERE version = ?1", m.Version); err != nil {
				return fmt.Errorf("unrecording %03d_%s: %w", m.Version, m.Name, err)
			}
			reverted = &m
			return nil
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrating down: %w", err)
	}
	return reverted, nil
}

// MigrationStatus returns every embedded migration with its state in the
// database.
func (s *Store) MigrationStatus(ctx context.Context) ([]Migration, error) {
	var applied map[int]time.Time
	err := s.migrateTx(ctx, func(_ *sql.Tx, a map[int]time.Time) error {
		applied = a
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading migration status: %w", err)
	}
	out := slices.Clone(migrations)
	for i := range out {
		out[i].AppliedAt, out[i].Applied = applied[out[i].Version]
	}
	return out, nil
}

// migrateTx runs f in a write transaction with the migrations table in place
// and the applied versions read.
func (s *Store) migrateTx(ctx context.Context, f func(tx *sql.Tx, applied map[int]time.Time) error) error {
	return s.writeTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, createMigrationsTable); err != nil {
			return fmt.Errorf("creating idem_migrations: %w", err)
		}
		rows, err := tx.QueryContext(ctx, "SELECT version, applied_at FROM idem_migrations")
		if err != nil {
			return err
		}
		defer rows.Close()
		applied := make(map[int]time.Time)
		for rows.Next() {
			var v int
			var at int64
			if err := rows.Scan(&v, &at); err != nil {
				return err
			}
			applied[v] = fromMicros(at)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return f(tx, applied)
	})
}
