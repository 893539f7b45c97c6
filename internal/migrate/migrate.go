// Package migrate runs the embedded schema migrations of the SQL stores.
//
// A package's migrations are numbered pairs of files, NNN_name.up.sql and
// NNN_name.down.sql, numbered 1..n and embedded in an fs.FS (Load). A
// Runner applies the pending ones (Up), reverts the latest (Down) or reports
// which are applied (Status), recording them in a migrations table of its
// own. The database's side is a Dialect: SQLite on database/sql, Postgres
// on pgx, or MySQL on database/sql, each holding a lock while it migrates so
// that processes starting at once apply each migration once.
package migrate

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
)

// Migration is one numbered migration: the SQL that applies it and the SQL
// that reverts it.
type Migration struct {
	// Version orders the migrations; it is the file name's number.
	Version int
	// Name is the file name without the version and the suffix.
	Name string
	// Up applies the migration; Down reverts it.
	Up, Down string
}

// String returns the migration's file name stem, as in 001_create_keys.
func (m Migration) String() string { return fmt.Sprintf("%03d_%s", m.Version, m.Name) }

// Status is a migration's state in a database. The store packages' own
// Migration types have the same fields, so a Status converts to them (As).
type Status struct {
	// Version orders the migrations; it is the file name's number.
	Version int
	// Name is the file name without the version and the suffix.
	Name string
	// Applied reports whether the migration is applied.
	Applied bool
	// AppliedAt is when it was applied, by the runner's clock.
	AppliedAt time.Time
}

// StatusType is the constraint of the store packages' Migration types,
// which have Status's fields.
type StatusType interface {
	~struct {
		Version   int
		Name      string
		Applied   bool
		AppliedAt time.Time
	}
}

// As converts statuses to a store package's Migration type; nil stays nil.
func As[M StatusType](ss []Status) []M {
	if ss == nil {
		return nil
	}
	out := make([]M, len(ss))
	for i, s := range ss {
		out[i] = M(s)
	}
	return out
}

// AsOne converts one status, as Runner.Down returns it, to a store
// package's Migration type; nil stays nil.
func AsOne[M StatusType](s *Status) *M {
	if s == nil {
		return nil
	}
	m := M(*s)
	return &m
}

// Load reads the migrations in dir of fsys: NNN_name.up.sql and
// NNN_name.down.sql pairs numbered 1..n. It returns them in version order
// and ignores files that do not end in .sql.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	type pair struct {
		Migration
		hasUp, hasDown bool
	}
	byVersion := make(map[int]*pair)
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), ".sql")
		if !ok || e.IsDir() {
			continue
		}
		version, name, up, ok := parseFileName(base)
		if !ok {
			return nil, fmt.Errorf("migration %s: want NNN_name.up.sql or NNN_name.down.sql", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(string(b)) == "" {
			return nil, fmt.Errorf("migration %s is empty", e.Name())
		}
		p := byVersion[version]
		if p == nil {
			p = &pair{Migration: Migration{Version: version, Name: name}}
			byVersion[version] = p
		}
		if p.Name != name {
			return nil, fmt.Errorf("migration %d has two names, %s and %s", version, p.Name, name)
		}
		if up {
			p.Up, p.hasUp = string(b), true
		} else {
			p.Down, p.hasDown = string(b), true
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, p := range byVersion {
		if !p.hasUp || !p.hasDown {
			return nil, fmt.Errorf("migration %s lacks its up or down file", p.Migration)
		}
		out = append(out, p.Migration)
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration versions are not 1..n: %03d is number %d", m.Version, i+1)
		}
	}
	return out, nil
}

// MustLoad is Load for migrations embedded in the binary: it panics on an
// error, naming dir.
func MustLoad(fsys fs.FS, dir string) []Migration {
	ms, err := Load(fsys, dir)
	if err != nil {
		panic(fmt.Sprintf("%s: %v", dir, err))
	}
	return ms
}

// parseFileName splits the stem of a migration's file name, as in
// 001_create_keys.up, into its version, name and direction.
func parseFileName(base string) (version int, name string, up, ok bool) {
	base, direction, _ := strings.Cut(base, ".")
	num, name, ok := strings.Cut(base, "_")
	version, err := strconv.Atoi(num)
	if !ok || err != nil || version <= 0 || name == "" || (direction != "up" && direction != "down") {
		return 0, "", false, false
	}
	return version, name, direction == "up", true
}

// Dialect is a database's side of a Runner. SQLite, Postgres and MySQL
// implement it.
type Dialect interface {
	// Locked runs f in a transaction that holds the migration lock and has
	// the migrations table in place, passing the applied versions and when
	// they were applied. It commits when f succeeds and rolls back otherwise.
	Locked(ctx context.Context, f func(tx Tx, applied map[int]time.Time) error) error
	// Applied returns the applied versions and when they were applied,
	// without writing or locking; none when the migrations table is missing.
	Applied(ctx context.Context) (map[int]time.Time, error)
}

// Tx is the transaction that Dialect.Locked passes on.
type Tx interface {
	// Exec runs the SQL of a migration, which may hold several statements.
	Exec(ctx context.Context, sql string) error
	// Record adds a migration to the migrations table.
	Record(ctx context.Context, m Migration, at time.Time) error
	// Unrecord removes a version from the migrations table.
	Unrecord(ctx context.Context, version int) error
}

// Runner applies and reverts migrations on one database.
type Runner struct {
	// Migrations are the migrations in version order, as Load returns them.
	Migrations []Migration
	// Dialect is the database.
	Dialect Dialect
	// Now is the clock that dates the applied migrations. Defaults to
	// time.Now.
	Now func() time.Time
	// Expand fills the placeholders of a migration's SQL before it runs.
	// Defaults to running the SQL as it is.
	Expand func(sql string) string
}

// Up applies the pending migrations in one transaction under the
// migration lock and returns those it applied, dated by Now.
func (r *Runner) Up(ctx context.Context) ([]Status, error) {
	var done []Status
	err := r.Dialect.Locked(ctx, func(tx Tx, applied map[int]time.Time) error {
		done = nil
		now := r.now()
		for _, m := range r.Migrations {
			if _, ok := applied[m.Version]; ok {
				continue
			}
			if err := tx.Exec(ctx, r.expand(m.Up)); err != nil {
				return fmt.Errorf("applying %s: %w", m, err)
			}
			if err := tx.Record(ctx, m, now); err != nil {
				return fmt.Errorf("recording %s: %w", m, err)
			}
			done = append(done, Status{Version: m.Version, Name: m.Name, Applied: true, AppliedAt: now})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrating up: %w", err)
	}
	return done, nil
}

// Down reverts the latest applied migration under the migration lock and
// returns it, no longer applied, or nil when none is applied.
func (r *Runner) Down(ctx context.Context) (*Status, error) {
	var reverted *Status
	err := r.Dialect.Locked(ctx, func(tx Tx, applied map[int]time.Time) error {
		reverted = nil
		for _, m := range slices.Backward(r.Migrations) {
			if _, ok := applied[m.Version]; !ok {
				continue
			}
			if err := tx.Exec(ctx, r.expand(m.Down)); err != nil {
				return fmt.Errorf("reverting %s: %w", m, err)
			}
			if err := tx.Unrecord(ctx, m.Version); err != nil {
				return fmt.Errorf("unrecording %s: %w", m, err)
			}
			reverted = &Status{Version: m.Version, Name: m.Name}
			return nil
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrating down: %w", err)
	}
	return reverted, nil
}

// Status returns every migration with its state in the database. It writes
// nothing and takes no lock.
func (r *Runner) Status(ctx context.Context) ([]Status, error) {
	applied, err := r.Dialect.Applied(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading migration status: %w", err)
	}
	out := make([]Status, len(r.Migrations))
	for i, m := range r.Migrations {
		at, ok := applied[m.Version]
		out[i] = Status{Version: m.Version, Name: m.Name, Applied: ok, AppliedAt: at}
	}
	return out, nil
}

func (r *Runner) now() time.Time {
	if r.Now == nil {
		return time.Now()
	}
	return r.Now()
}

func (r *Runner) expand(sql string) string {
	if r.Expand == nil {
		return sql
	}
	return r.Expand(sql)
}

// LockID returns the key of the advisory lock that serializes the
// migrations of schema under lockName.
func LockID(lockName, schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte(lockName + "\x00" + schema))
	return int64(h.Sum64())
}
