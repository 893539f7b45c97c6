package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemstore"
)

// errNoSchema is what the commands that only inspect (or settle) records
// answer for a database without idem's tables: they never create a file, a
// schema or a table.
var errNoSchema = errors.New("no idem schema here; run `idem migrate up`")

// openInspect opens the store rawURL names for a command that reads or
// settles existing records: a SQLite file that does not exist, or a SQL
// database whose idem migrations are not applied, is refused with
// errNoSchema; one whose schema is behind this binary's is refused too.
// Nothing is created or migrated. Redis and memory stores have no schema.
func openInspect(ctx context.Context, rawURL string) (idemstore.Store, func() error, error) {
	kind := storeurl.Kind(rawURL)
	if kind != storeurl.KindSQLite && kind != storeurl.KindPostgres && kind != storeurl.KindMySQL {
		return storeurl.Open(ctx, rawURL)
	}
	store, closeStore, err := storeurl.OpenWith(ctx, rawURL, &storeurl.Options{NoMigrate: true, NoCreate: true})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("store %s: the file does not exist: %w", storeurl.Redact(rawURL), errNoSchema)
	}
	if err != nil {
		return nil, nil, err
	}
	m := migratorOf(store)
	if m == nil {
		return store, closeStore, nil
	}
	ms, err := m.status(ctx)
	if err != nil {
		closeStore()
		return nil, nil, fmt.Errorf("reading the migration status: %w", err)
	}
	applied := 0
	for _, mi := range ms {
		if mi.applied {
			applied++
		}
	}
	switch {
	case applied == 0:
		closeStore()
		return nil, nil, fmt.Errorf("store %s: %w", storeurl.Redact(rawURL), errNoSchema)
	case applied < len(ms):
		closeStore()
		return nil, nil, fmt.Errorf("store %s: the idem schema is %d migration(s) behind this binary; run `idem migrate up`", storeurl.Redact(rawURL), len(ms)-applied)
	}
	return store, closeStore, nil
}
