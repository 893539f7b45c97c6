package outbox

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
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

// The embedded migrations of each dialect, in version order.
var (
	postgresMigrations = mustLoadMigrations(migrationsFS, "migrations/postgres")
	sqliteMigrations   = mustLoadMigrations(migrationsFS, "migrations/sqlite")
)

func mustLoadMigrations(fsys fs.FS, dir string) []Migration {
	ms, err := loadMigrations(fsys, dir)
	if err != nil {
		panic("outbox: " + dir + ": " + err.Error())
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

// withStatus returns a copy of ms marked with the applied versions.
func withStatus(ms []Migration, applied map[int]time.Time) []Migration {
	out := slices.Clone(ms)
	for i := range out {
		out[i].AppliedAt, out[i].Applied = applied[out[i].Version]
	}
	return out
}
