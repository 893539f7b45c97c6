package idempgx

import (
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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

	up, down string
}

// migrations are the embedded migrations in version order.
var migrations = mustLoadMigrations(migrationsFS, "migrations")

// mustLoadMigrations reads NNN_name.up.sql / NNN_name.down.sql pairs.
func mustLoadMigrations(fsys fs.FS, dir string) []Migration {
	ms, err := loadMigrations(fsys, dir)
	if err != nil {
		panic("idempgx: " + err.Error())
	}
	return ms
}

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

// Migrate applies the pending migrations, creating the schema when it is
// missing, and returns those it applied. It runs in one transaction under an
// advisory lock, so processes that start at once apply each migration once.
func (s *Store) Migrate(ctx context.Context) ([]Migration, error) {
	var done []Migration
	err := s.migrateTx(ctx, func(tx pgx.Tx, applied map[int]time.Time) error {
		now := s.now()
		for _, m := range migrations {
			if _, ok := applied[m.Version]; ok {
				continue
			}
			if _, err := tx.Exec(ctx, expand(m.up, s.schema, s.channel)); err != nil {
				return fmt.Errorf("applying %03d_%s: %w", m.Version, m.Name, err)
			}
			_, err := tx.Exec(ctx, s.q.recordMigration, m.Version, m.Name, now)
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
	err := s.migrateTx(ctx, func(tx pgx.Tx, applied map[int]time.Time) error {
		for i := len(migrations) - 1; i >= 0; i-- {
			m := migrations[i]
			if _, ok := applied[m.Version]; !ok {
				continue
			}
			if _, err := tx.Exec(ctx, expand(m.down, s.schema, s.channel)); err != nil {
				return fmt.Errorf("reverting %03d_%s: %w", m.Version, m.Name, err)
			}
			_, err := tx.Exec(ctx, s.q.unrecordMigration, m.Version)
			if err != nil {
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
	applied, err := s.appliedMigrations(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("reading migration status: %w", err)
	}
	out := slices.Clone(migrations)
	for i := range out {
		out[i].AppliedAt, out[i].Applied = applied[out[i].Version]
	}
	return out, nil
}

// migrateTx runs f in a transaction that holds the schema's migration lock
// and has the schema and the migrations table in place.
func (s *Store) migrateTx(ctx context.Context, f func(tx pgx.Tx, applied map[int]time.Time) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.q.migrateLock, s.migrationLockID()); err != nil {
			return fmt.Errorf("taking the migration lock: %w", err)
		}
		var exists bool
		if err := tx.QueryRow(ctx, s.q.schemaExists, s.cfg.Schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := tx.Exec(ctx, s.q.createSchema); err != nil {
				return fmt.Errorf("creating schema: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, s.q.createMigrationsTable); err != nil {
			return fmt.Errorf("creating the migrations table: %w", err)
		}
		applied, err := s.appliedMigrations(ctx, tx)
		if err != nil {
			return err
		}
		return f(tx, applied)
	})
}

// appliedMigrations reads the migrations table; none when it is missing.
func (s *Store) appliedMigrations(ctx context.Context, q querier) (map[int]time.Time, error) {
	var exists bool
	if err := q.QueryRow(ctx, s.q.migrationsTableExists, s.cfg.Schema).Scan(&exists); err != nil {
		return nil, err
	}
	applied := make(map[int]time.Time)
	if !exists {
		return applied, nil
	}
	rows, err := q.Query(ctx, s.q.appliedMigrations)
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
		applied[v] = at
	}
	return applied, rows.Err()
}

// migrationLockID is the advisory lock key of the schema's migrations.
func (s *Store) migrationLockID() int64 {
	h := fnv.New64a()
	h.Write([]byte("idempgx.migrate\x00" + s.cfg.Schema))
	return int64(h.Sum64())
}
