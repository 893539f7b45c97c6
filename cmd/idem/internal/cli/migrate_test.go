package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/testenv"
)

// runCommand runs idem in process with args and the environment variables
// vars, and returns its exit code, stdout and stderr.
func runCommand(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	e := newTestEnv(vars)
	code := run(t.Context(), args, e.env)
	return code, e.stdout.String(), e.stderr.String()
}

// mustRun runs idem in process and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, stdout, stderr := runCommand(t, nil, args...)
	if code != ExitOK {
		t.Fatalf("idem %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// sqliteURL is the URL of a new SQLite file in the test's directory.
func sqliteURL(t *testing.T) string {
	return "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
}

// postgresURL is the URL of the test database with a schema of the test's
// own, dropped when the test ends.
func postgresURL(t *testing.T) string {
	t.Helper()
	base := testenv.PostgresURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	schema := "cli_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err != nil {
			t.Errorf("connecting to drop the schema: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	q.Set("pool_max_conns", "4")
	u.RawQuery = q.Encode()
	return u.String()
}

func TestParseMigrate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    migrateOptions
		wantErr string
	}{
		{name: "default store", args: []string{"up"}, want: migrateOptions{action: "up", store: "sqlite:./idem.db"}},
		{name: "flag after action", args: []string{"status", "--store", "memory:"}, want: migrateOptions{action: "status", store: "memory:"}},
		{name: "flag before action", args: []string{"--store", "memory:", "down"}, want: migrateOptions{action: "down", store: "memory:"}},
		{name: "variable", args: []string{"up"}, env: map[string]string{"IDEM_STORE": "postgres://db/x"}, want: migrateOptions{action: "up", store: "postgres://db/x"}},
		{name: "flag wins over variable", args: []string{"up", "--store", "memory:"}, env: map[string]string{"IDEM_STORE": "postgres://db/x"},
			want: migrateOptions{action: "up", store: "memory:"}},
		{name: "empty variable is unset", args: []string{"up"}, env: map[string]string{"IDEM_STORE": ""}, want: migrateOptions{action: "up", store: "sqlite:./idem.db"}},
		{name: "action after --", args: []string{"--store", "memory:", "--", "up"}, want: migrateOptions{action: "up", store: "memory:"}},
		{name: "partitions", args: []string{"up", "--partitions", "16", "--store", "postgres://db/x"},
			want: migrateOptions{action: "up", store: "postgres://db/x", partitions: 16}},
		{name: "partitions with down", args: []string{"down", "--partitions", "16"}, wantErr: "--partitions applies to up only"},
		{name: "too many partitions", args: []string{"up", "--partitions", "1025"}, wantErr: "at most 1024"},

		{name: "no action", wantErr: "want an action: up, down or status"},
		{name: "unknown action", args: []string{"sideways"}, wantErr: `unknown action "sideways"`},
		{name: "two actions", args: []string{"up", "down"}, wantErr: `unexpected argument "down"`},
		{name: "bad store", args: []string{"up", "--store", "./idem.db"}, wantErr: "want sqlite:PATH"},
		{name: "bad variable", args: []string{"up"}, env: map[string]string{"IDEM_STORE": "x"}, wantErr: `invalid value "x" for IDEM_STORE`},
		{name: "unknown flag", args: []string{"up", "--force"}, wantErr: "unknown flag --force"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseMigrate(tt.args, newTestEnv(tt.env).env)
			if tt.wantErr != "" {
				var uerr usageError
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.As(err, &uerr) {
					t.Fatalf("error = %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*o, tt.want) {
				t.Errorf("options = %+v, want %+v", *o, tt.want)
			}
		})
	}
}

func TestMigrateStoresWithoutSchema(t *testing.T) {
	t.Parallel()
	// The Redis store is not even contacted: the address is unused.
	for _, store := range []string{"memory:", "redis://127.0.0.1:1/0"} {
		for _, action := range migrateActions {
			out := mustRun(t, "migrate", action, "--store", store)
			if !strings.Contains(out, "has no schema: nothing to migrate") {
				t.Errorf("idem migrate %s --store %s printed %q", action, store, out)
			}
		}
	}
}

// migrateCycle runs status, up, up, status, down… against a fresh store
// whose migrations are names, and checks every output.
func migrateCycle(t *testing.T, store string, names []string) {
	t.Helper()
	statusRE := func(state string) *regexp.Regexp {
		var b strings.Builder
		b.WriteString(`(?m)^MIGRATION\s+STATUS\s+APPLIED AT\n`)
		for _, n := range names {
			if state == "applied" {
				b.WriteString(regexp.QuoteMeta(n) + `\s+applied\s+\d{4}-\d\d-\d\dT\S+Z\n`)
			} else {
				b.WriteString(regexp.QuoteMeta(n) + `\s+pending\s+-\n`)
			}
		}
		return regexp.MustCompile(b.String())
	}
	// status does not migrate a fresh store.
	out := mustRun(t, "migrate", "status", "--store", store)
	if !statusRE("pending").MatchString(out) || !strings.Contains(out, "pending: run 'idem migrate up'") {
		t.Errorf("status of a fresh store:\n%s", out)
	}
	var applied strings.Builder
	for _, n := range names {
		applied.WriteString("applied " + n + "\n")
	}
	if out := mustRun(t, "migrate", "up", "--store", store); out != applied.String() {
		t.Errorf("up printed %q, want %q", out, applied.String())
	}
	if out := mustRun(t, "migrate", "up", "--store", store); out != "Nothing to apply: the schema is up to date.\n" {
		t.Errorf("second up printed %q", out)
	}
	if out := mustRun(t, "migrate", "status", "--store", store); !statusRE("applied").MatchString(out) || strings.Contains(out, "pending") {
		t.Errorf("status after up:\n%s", out)
	}
	for i := len(names) - 1; i >= 0; i-- {
		if out := mustRun(t, "migrate", "down", "--store", store); out != "reverted "+names[i]+"\n" {
			t.Errorf("down printed %q, want it to revert %s", out, names[i])
		}
	}
	if out := mustRun(t, "migrate", "down", "--store", store); out != "Nothing to revert: no migration is applied.\n" {
		t.Errorf("down with nothing applied printed %q", out)
	}
	if out := mustRun(t, "migrate", "status", "--store", store); !statusRE("pending").MatchString(out) {
		t.Errorf("status after reverting all:\n%s", out)
	}
	// The store works again once migrated.
	mustRun(t, "migrate", "up", "--store", store)
	if out := mustRun(t, "keys", "list", "--store", store); out != "No records.\n" {
		t.Errorf("keys list on the re-migrated store printed %q", out)
	}
}

func TestMigrateSQLite(t *testing.T) {
	t.Parallel()
	// An empty file is an empty database: status and down read it as
	// they find it, only up creates a missing one.
	path := filepath.Join(t.TempDir(), "idem.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	migrateCycle(t, "sqlite:"+path, []string{"001_create_keys", "002_reconcile_state", "003_state_check"})
}

func TestMigratePostgres(t *testing.T) {
	t.Parallel()
	migrateCycle(t, postgresURL(t), []string{"001_create_keys", "002_add_waiters", "003_reconcile_state", "004_hot_completion", "005_check_domains", "006_response_check_function"})
}

// `idem migrate up --partitions N` creates the key table hash-partitioned
// by tenant and says so; on an existing single table it is an error, and
// on a store other than PostgreSQL a usage error.
func TestMigratePostgresPartitions(t *testing.T) {
	t.Parallel()
	store := postgresURL(t)
	out := mustRun(t, "migrate", "up", "--partitions", "8", "--store", store)
	if !strings.HasPrefix(out, "applied 001_create_keys\n") || !strings.Contains(out, "hash-partitioned by tenant into 8 partitions.\n") {
		t.Errorf("up --partitions 8 printed:\n%s", out)
	}
	if out := mustRun(t, "migrate", "up", "--store", store); !strings.Contains(out, "into 8 partitions") {
		t.Errorf("second up printed:\n%s", out)
	}

	single := postgresURL(t)
	mustRun(t, "migrate", "up", "--store", single)
	if code, _, stderr := runCommand(t, nil, "migrate", "up", "--partitions", "4", "--store", single); code != ExitError ||
		!strings.Contains(stderr, "already exists as one table") {
		t.Errorf("up --partitions on a single table: exit %d, stderr %s", code, stderr)
	}
	if code, _, stderr := runCommand(t, nil, "migrate", "up", "--partitions", "4", "--store", sqliteURL(t)); code != ExitUsage ||
		!strings.Contains(stderr, "PostgreSQL store only") {
		t.Errorf("up --partitions on SQLite: exit %d, stderr %s", code, stderr)
	}
}

func TestMigrateFailures(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCommand(t, nil, "migrate", "up", "--store", "sqlite:/nonexistent-dir/x/idem.db")
	if code != ExitError || !strings.Contains(stderr, "idem migrate: ") {
		t.Errorf("up on an unwritable path: exit %d, stderr %q; want 1 and the error", code, stderr)
	}
	// status and down do not create a SQLite file.
	missing := filepath.Join(t.TempDir(), "typo.db")
	for _, action := range []string{"status", "down"} {
		code, _, stderr := runCommand(t, nil, "migrate", action, "--store", "sqlite:"+missing)
		if code != ExitError || !strings.Contains(stderr, "no such file or directory") {
			t.Errorf("%s on a missing file: exit %d, stderr %q; want 1 and the missing file", action, code, stderr)
		}
		if _, err := os.Stat(missing); err == nil {
			t.Fatalf("%s created %s", action, missing)
		}
	}
	code, _, stderr = runCommand(t, nil, "migrate", "--store", "memory:")
	if code != ExitUsage || !strings.Contains(stderr, "want an action") {
		t.Errorf("no action: exit %d, stderr %q; want 2", code, stderr)
	}
}

// On the payments service's database, status lists the three migration
// sets it holds: the keys', the outbox's and the payments table's.
func TestMigrateStatusListsEverySet(t *testing.T) {
	t.Parallel()
	for _, store := range []string{sqliteURL(t), postgresURL(t), mysqlURL(t)} {
		e := newTestEnv(nil)
		_, stop := payCommand(t, e, payArgs(t, "--tokens", "acme="+payToken, "--store", store)...)
		if code := stop(); code != ExitOK {
			t.Fatalf("payments exit %d: %s", code, e.stderr)
		}
		out := mustRun(t, "migrate", "status", "--store", store)
		for _, want := range []string{
			`(?m)^keys \(idem_migrations\)\nMIGRATION\s+STATUS\s+APPLIED AT\n001_create_keys\s+applied`,
			`(?m)^outbox \(idem_outbox_migrations\)\nMIGRATION\s+STATUS\s+APPLIED AT\n001_\S+\s+applied`,
			`(?m)^payments \(payments_migrations\)\nMIGRATION\s+STATUS\s+APPLIED AT\n001_\S+\s+applied`,
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("status on %s lacks %s:\n%s", storeurl.Redact(store), want, out)
			}
		}
		if strings.Contains(out, "pending") {
			t.Errorf("status after payments migrated shows pending migrations:\n%s", out)
		}
	}
	// A keys-only database lists the keys alone.
	store := sqliteURL(t)
	mustRun(t, "migrate", "up", "--store", store)
	if out := mustRun(t, "migrate", "status", "--store", store); strings.Contains(out, "outbox") || strings.Contains(out, "payments") {
		t.Errorf("status of a keys-only database lists other sets:\n%s", out)
	}
}
