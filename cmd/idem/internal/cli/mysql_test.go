package cli

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/testenv"
)

// mysqlAdmin returns a connection pool on the test MySQL server's
// database, closed when the test ends.
func mysqlAdmin(t *testing.T) *sql.DB {
	t.Helper()
	dsn, _, err := storeurl.ParseMySQL(testenv.MySQLURL(t))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// mysqlURL is the URL of a new database of the test's own on the test
// MySQL server, dropped when the test ends.
func mysqlURL(t *testing.T) string {
	t.Helper()
	base := testenv.MySQLURL(t)
	admin := mysqlAdmin(t)
	b := make([]byte, 6)
	rand.Read(b)
	name := "cli_test_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("dropping %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Set("pool_max_conns", "4")
	u.RawQuery = q.Encode()
	return u.String()
}

// mysqlUserURL is mysqlURL reached as a user of the test's own who has the
// password pass, dropped when the test ends.
func mysqlUserURL(t *testing.T, pass string) string {
	t.Helper()
	u, err := url.Parse(mysqlURL(t))
	if err != nil {
		t.Fatal(err)
	}
	admin := mysqlAdmin(t)
	b := make([]byte, 4)
	rand.Read(b)
	user := "cli_test_" + hex.EncodeToString(b)
	db := strings.TrimPrefix(u.Path, "/")
	for _, stmt := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY '" + pass + "'",
		"GRANT ALL ON " + db + ".* TO '" + user + "'@'%'",
	} {
		if _, err := admin.ExecContext(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(context.Background(), "DROP USER IF EXISTS '"+user+"'@'%'"); err != nil {
			t.Errorf("dropping user %s: %v", user, err)
		}
	})
	u.User = url.UserPassword(user, pass)
	return u.String()
}

func TestMigrateMySQL(t *testing.T) {
	t.Parallel()
	migrateCycle(t, mysqlURL(t), []string{"001_create_keys"})
}

// The start log names the MySQL store without its password, and a wrong
// password's error does not echo it either.
func TestProxyLogRedactsMySQLPassword(t *testing.T) {
	t.Parallel()
	store := mysqlUserURL(t, "s3cret-pw")
	_, e, stop := startProxy(t, "--upstream", "http://127.0.0.1:9", "--store", store)
	if code := stop(); code != ExitOK {
		t.Errorf("exit code = %d; stderr: %s", code, e.stderr)
	}
	logs := e.stderr.String()
	if strings.Contains(logs, "s3cret-pw") {
		t.Errorf("logs leak the store password:\n%s", logs)
	}
	if !strings.Contains(logs, "store=mysql") || !strings.Contains(logs, ":xxxxx@") {
		t.Errorf("logs lack the redacted store URL:\n%s", logs)
	}

	wrong := strings.Replace(store, "s3cret-pw", "wr0ng-pw", 1)
	code, stdout, stderr := runCommand(t, nil, "keys", "list", "--store", wrong)
	if code != ExitError || !strings.Contains(stderr, "Access denied") {
		t.Errorf("keys list with a wrong password: exit %d, stderr %q", code, stderr)
	}
	if strings.Contains(stdout+stderr, "wr0ng-pw") {
		t.Errorf("the error leaks the password: %s", stderr)
	}
}
