package cli

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
)

// The inspection commands never migrate or create: on a missing file, an
// empty database or an empty schema they refuse and say how to make one.
func TestKeysRefuseADatabaseWithoutSchema(t *testing.T) {
	t.Parallel()
	missing := "sqlite:" + filepath.Join(t.TempDir(), "typo.db")
	emptyPath := filepath.Join(t.TempDir(), "empty.db")
	if err := os.WriteFile(emptyPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pg := postgresURL(t)
	my := mysqlURL(t)
	for _, store := range []string{missing, "sqlite:" + emptyPath, pg, my} {
		for _, args := range [][]string{
			{"keys", "list"},
			{"keys", "show", "--endpoint", "POST /x", "k"},
			{"keys", "purge"},
		} {
			code, _, stderr := runCommand(t, nil, append(args, "--store", store)...)
			if code != ExitError || !strings.Contains(stderr, "no idem schema here; run `idem migrate up`") {
				t.Errorf("%s on %s: exit %d, stderr %q", strings.Join(args, " "), storeurl.Redact(store), code, stderr)
			}
		}
	}
	if _, err := os.Stat(strings.TrimPrefix(missing, "sqlite:")); err == nil {
		t.Errorf("keys created %s", missing)
	}
	db, err := sql.Open("sqlite", emptyPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var tables int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table'`).Scan(&tables); err != nil || tables != 0 {
		t.Errorf("the empty SQLite file has %d tables (%v), want none", tables, err)
	}
	pcfg, schema, err := storeurl.ParsePostgres(pg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(context.Background(), pcfg.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil || exists {
		t.Errorf("keys created the schema %s (%v)", schema, err)
	}
	myURL, err := url.Parse(my)
	if err != nil {
		t.Fatal(err)
	}
	if err := mysqlAdmin(t).QueryRow(`SELECT count(*) FROM information_schema.tables WHERE table_schema = ?`,
		strings.TrimPrefix(myURL.Path, "/")).Scan(&tables); err != nil || tables != 0 {
		t.Errorf("keys created %d tables in the MySQL database (%v), want none", tables, err)
	}
	// After migrate up the same command works.
	for _, store := range []string{pg, my} {
		mustRun(t, "migrate", "up", "--store", store)
		if out := mustRun(t, "keys", "list", "--store", store); out != "No records.\n" {
			t.Errorf("keys list after migrate up: %q", out)
		}
	}
}
