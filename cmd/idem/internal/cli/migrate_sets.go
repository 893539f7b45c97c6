package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"

	paysvc "github.com/idem-dev/idem/cmd/idem/internal/payments"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/migrate"
	"github.com/idem-dev/idem/outbox"
)

// migrationSet is a set of migrations another part of idem keeps in the
// store's database, apart from the keys' own: the payments service's
// outbox and payments table.
type migrationSet struct {
	name, table, note string
	ms                []migration
}

// otherMigrationSets reads the status of the outbox's and the payments
// table's migrations in the database of store, read-only, and returns the
// sets that have at least one migration applied: the ones in use there.
func otherMigrationSets(ctx context.Context, rawURL string, store idemstore.Store) ([]migrationSet, error) {
	const note = "`idem payments` applies them when it starts"
	var outboxMs, paymentsMs []migration
	switch s := store.(type) {
	case *idemsqlite.Store:
		ob, err := outbox.NewSQLite(s.DB(), nil).MigrationStatus(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the outbox's migrations: %w", err)
		}
		outboxMs = convertAll(ob, fromOutbox)
		ps, err := paysvc.SQLiteMigrationStatus(ctx, s.DB())
		if err != nil {
			return nil, fmt.Errorf("reading the payments table's migrations: %w", err)
		}
		paymentsMs = convertAll(ps, fromStatus)
	case *idempgx.Store:
		pcfg, schema, err := storeurl.ParsePostgres(rawURL)
		if err != nil {
			return nil, err
		}
		if schema == "" {
			schema = idempgx.DefaultSchema
		}
		pcfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		ob, err := outbox.NewPgx(pool, &outbox.Config{Schema: schema}).MigrationStatus(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the outbox's migrations: %w", err)
		}
		outboxMs = convertAll(ob, fromOutbox)
		ps, err := paysvc.PostgresMigrationStatus(ctx, pool, schema)
		if err != nil {
			return nil, fmt.Errorf("reading the payments table's migrations: %w", err)
		}
		paymentsMs = convertAll(ps, fromStatus)
	case *idemmysql.Store:
		ob, err := outbox.NewMySQL(s.DB(), nil).MigrationStatus(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the outbox's migrations: %w", err)
		}
		outboxMs = convertAll(ob, fromOutbox)
		ps, err := paysvc.MySQLMigrationStatus(ctx, s.DB())
		if err != nil {
			return nil, fmt.Errorf("reading the payments table's migrations: %w", err)
		}
		paymentsMs = convertAll(ps, fromStatus)
	default:
		return nil, nil
	}
	var sets []migrationSet
	for _, set := range []migrationSet{
		{name: "outbox", table: "idem_outbox_migrations", note: note, ms: outboxMs},
		{name: "payments", table: paysvc.MigrationsTable, note: note, ms: paymentsMs},
	} {
		for _, m := range set.ms {
			if m.applied {
				sets = append(sets, set)
				break
			}
		}
	}
	return sets, nil
}

func fromOutbox(m outbox.Migration) migration {
	return migration{m.Version, m.Name, m.Applied, m.AppliedAt}
}

func fromStatus(m migrate.Status) migration {
	return migration{m.Version, m.Name, m.Applied, m.AppliedAt}
}

// printMigrationSets prints the other sets after the keys' table.
func printMigrationSets(w io.Writer, sets []migrationSet) {
	for _, set := range sets {
		fmt.Fprintf(w, "\n%s (%s)\n", set.name, set.table)
		pending := printMigrationTable(w, set.ms)
		if pending > 0 {
			fmt.Fprintf(w, "%d pending: %s.\n", pending, set.note)
		}
	}
}
