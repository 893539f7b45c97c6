package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// migration is a schema migration of a SQL store, whichever its driver.
type migration struct {
	version   int
	name      string
	applied   bool
	appliedAt time.Time
}

func (m migration) String() string { return fmt.Sprintf("%03d_%s", m.version, m.name) }

// migrator is what `idem migrate` needs of a SQL store: idemsqlite,
// idempgx and idemmysql each have their own Migration type.
type migrator interface {
	up(ctx context.Context) ([]migration, error)
	down(ctx context.Context) (*migration, error)
	status(ctx context.Context) ([]migration, error)
}

// migratorOf returns the migrator of s, or nil for a store without a schema
// (Redis, memory).
func migratorOf(s idemstore.Store) migrator {
	switch s := s.(type) {
	case *idemsqlite.Store:
		return sqliteMigrator{s}
	case *idempgx.Store:
		return pgxMigrator{s}
	case *idemmysql.Store:
		return mysqlMigrator{s}
	}
	return nil
}

type sqliteMigrator struct{ s *idemsqlite.Store }

func fromSQLite(m idemsqlite.Migration) migration {
	return migration{m.Version, m.Name, m.Applied, m.AppliedAt}
}

func (m sqliteMigrator) up(ctx context.Context) ([]migration, error) {
	ms, err := m.s.Migrate(ctx)
	return convertAll(ms, fromSQLite), err
}

func (m sqliteMigrator) down(ctx context.Context) (*migration, error) {
	r, err := m.s.MigrateDown(ctx)
	if r == nil {
		return nil, err
	}
	c := fromSQLite(*r)
	return &c, err
}

func (m sqliteMigrator) status(ctx context.Context) ([]migration, error) {
	ms, err := m.s.MigrationStatus(ctx)
	return convertAll(ms, fromSQLite), err
}

type pgxMigrator struct{ s *idempgx.Store }

func fromPgx(m idempgx.Migration) migration {
	return migration{m.Version, m.Name, m.Applied, m.AppliedAt}
}

func (m pgxMigrator) up(ctx context.Context) ([]migration, error) {
	ms, err := m.s.Migrate(ctx)
	return convertAll(ms, fromPgx), err
}

func (m pgxMigrator) down(ctx context.Context) (*migration, error) {
	r, err := m.s.MigrateDown(ctx)
	if r == nil {
		return nil, err
	}
	c := fromPgx(*r)
	return &c, err
}

func (m pgxMigrator) status(ctx context.Context) ([]migration, error) {
	ms, err := m.s.MigrationStatus(ctx)
	return convertAll(ms, fromPgx), err
}

type mysqlMigrator struct{ s *idemmysql.Store }

func fromMySQL(m idemmysql.Migration) migration {
	return migration{m.Version, m.Name, m.Applied, m.AppliedAt}
}

func (m mysqlMigrator) up(ctx context.Context) ([]migration, error) {
	ms, err := m.s.Migrate(ctx)
	return convertAll(ms, fromMySQL), err
}

func (m mysqlMigrator) down(ctx context.Context) (*migration, error) {
	r, err := m.s.MigrateDown(ctx)
	if r == nil {
		return nil, err
	}
	c := fromMySQL(*r)
	return &c, err
}

func (m mysqlMigrator) status(ctx context.Context) ([]migration, error) {
	ms, err := m.s.MigrationStatus(ctx)
	return convertAll(ms, fromMySQL), err
}

func convertAll[T any](ms []T, f func(T) migration) []migration {
	out := make([]migration, len(ms))
	for i, m := range ms {
		out[i] = f(m)
	}
	return out
}

// migrateOptions are the settings of `idem migrate`.
type migrateOptions struct {
	action     string // up, down or status
	store      string
	partitions int // up on PostgreSQL: hash partitions of a new key table
}

var migrateActions = []string{"up", "down", "status"}

func newMigrateFlags(o *migrateOptions) *flagSet {
	fs := newFlagSet("migrate", "idem migrate up|down|status [--store URL]",
		"Manages the schema of a SQL store (SQLite, PostgreSQL, MySQL):\n"+
			"  up      applies the pending migrations (the proxy also does this when it starts)\n"+
			"  down    reverts the latest applied migration, dropping what it created,\n"+
			"          records included; run it again to revert the one before\n"+
			"  status  lists the migrations and when each was applied\n"+
			"Redis and memory stores have no schema: there is nothing to migrate.")
	fs.Var(storeValue{&o.store}, "store", "store `URL`: sqlite:PATH, memory:, postgres://…, mysql://… or redis://…")
	fs.Var(countValue{&o.partitions}, "partitions", "with up on PostgreSQL: create the key table hash-partitioned by tenant into `N` partitions (0: one table)")
	return fs
}

// parseMigrate reads the action and the flags of `idem migrate`, in any
// order.
func parseMigrate(args []string, e *env) (*migrateOptions, error) {
	o := &migrateOptions{store: storeurl.Default}
	fs := newMigrateFlags(o)
	pos, err := fs.parseArgs(args, e)
	if err != nil {
		return nil, err
	}
	switch {
	case len(pos) == 0:
		return nil, usageErrorf("want an action: up, down or status")
	case len(pos) > 1:
		return nil, usageErrorf("unexpected argument %q", pos[1])
	}
	if !slices.Contains(migrateActions, pos[0]) {
		return nil, usageErrorf("unknown action %q: want up, down or status", pos[0])
	}
	o.action = pos[0]
	if o.partitions > 0 && o.action != "up" {
		return nil, usageErrorf("--partitions applies to up only")
	}
	if o.partitions > idempgx.MaxPartitions {
		return nil, usageErrorf("--partitions %d: at most %d", o.partitions, idempgx.MaxPartitions)
	}
	return o, nil
}

// parseArgs is parse for a command that takes positional arguments: flags
// may come before, between and after them ("--" ends the flags). It returns
// the positional arguments.
func (fs *flagSet) parseArgs(args []string, e *env) ([]string, error) {
	var pos []string
	for {
		if err := fs.parseRedacted(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.printUsage(e.stdout)
				return nil, flag.ErrHelp
			}
			return nil, usageError{err}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	// The flags seen stay set: parsing nothing applies the environment
	// fallbacks to the others.
	return pos, fs.parse(nil, e)
}

func runMigrate(ctx context.Context, e *env, args []string) (err error) {
	o, err := parseMigrate(args, e)
	if err != nil {
		return err
	}
	kind := storeurl.Kind(o.store)
	if kind == storeurl.KindRedis || kind == storeurl.KindMemory {
		fmt.Fprintf(e.stdout, "The %s store has no schema: nothing to migrate.\n", kind)
		return nil
	}
	// Only up may create a SQLite file: status and down on a mistyped path
	// fail rather than report an empty new file.
	if o.partitions > 0 && kind != storeurl.KindPostgres {
		return usageErrorf("--partitions applies to a PostgreSQL store only")
	}
	store, closeStore, err := storeurl.OpenWith(ctx, o.store, &storeurl.Options{NoMigrate: true, NoCreate: o.action != "up", Partitions: o.partitions})
	if err != nil {
		return fmt.Errorf("opening the store: %w", err)
	}
	defer func() {
		if cerr := closeStore(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing the store: %w", cerr))
		}
	}()
	m := migratorOf(store)
	if m == nil {
		return fmt.Errorf("the %s store has no migrations", kind)
	}
	switch o.action {
	case "up":
		done, err := m.up(ctx)
		if err != nil {
			return err
		}
		for _, d := range done {
			fmt.Fprintf(e.stdout, "applied %s\n", d)
		}
		if len(done) == 0 {
			fmt.Fprintln(e.stdout, "Nothing to apply: the schema is up to date.")
		}
		if pg, ok := store.(*idempgx.Store); ok {
			parts, err := pg.Partitions(ctx)
			if err != nil {
				return err
			}
			switch {
			case len(parts) > 0:
				fmt.Fprintf(e.stdout, "The key table is hash-partitioned by tenant into %d partitions.\n", len(parts))
			case o.partitions > 0:
				return fmt.Errorf("--partitions %d: the key table already exists as one table; partitions are chosen when it is created (copy the records into a new schema migrated with --partitions)", o.partitions)
			}
		}
	case "down":
		r, err := m.down(ctx)
		if err != nil {
			return err
		}
		if r == nil {
			fmt.Fprintln(e.stdout, "Nothing to revert: no migration is applied.")
		} else {
			fmt.Fprintf(e.stdout, "reverted %s\n", r)
		}
	case "status":
		ms, err := m.status(ctx)
		if err != nil {
			return err
		}
		printMigrations(e.stdout, ms)
		sets, err := otherMigrationSets(ctx, o.store, store)
		if err != nil {
			return err
		}
		printMigrationSets(e.stdout, sets)
	}
	return nil
}

// printMigrations prints the migration status table of the keys.
func printMigrations(w io.Writer, ms []migration) {
	fmt.Fprintln(w, "keys (idem_migrations)")
	if pending := printMigrationTable(w, ms); pending > 0 {
		fmt.Fprintf(w, "%d pending: run 'idem migrate up'.\n", pending)
	}
}

// printMigrationTable prints one set's table and returns how many of its
// migrations are pending.
func printMigrationTable(w io.Writer, ms []migration) int {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MIGRATION\tSTATUS\tAPPLIED AT")
	pending := 0
	for _, m := range ms {
		status, at := "pending", "-"
		if m.applied {
			status, at = "applied", m.appliedAt.UTC().Format(time.RFC3339)
		} else {
			pending++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m, status, at)
	}
	tw.Flush()
	return pending
}
