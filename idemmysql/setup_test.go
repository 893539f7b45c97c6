package idemmysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testenv"
)

// The tests share one administrative pool on the test server's database;
// every store gets a database of its own, made for it and dropped after it.
var (
	adminMu sync.Mutex
	admin   *sql.DB
)

func TestMain(m *testing.M) {
	code := m.Run()
	adminMu.Lock()
	if admin != nil {
		admin.Close()
	}
	adminMu.Unlock()
	os.Exit(code)
}

// adminDB returns the shared pool on the test URL's database, opening it on
// first use.
func adminDB(t testing.TB) *sql.DB {
	t.Helper()
	url := testenv.MySQLURL(t)
	adminMu.Lock()
	defer adminMu.Unlock()
	if admin != nil {
		return admin
	}
	c, err := NewConnector(testenv.MySQLDSN(t, url, ""))
	if err != nil {
		t.Fatal(err)
	}
	admin = sql.OpenDB(c)
	admin.SetMaxOpenConns(4)
	return admin
}

// newDatabase creates a database for one test, dropped when the test ends,
// and returns its DSN.
func newDatabase(t testing.TB) string {
	t.Helper()
	db := adminDB(t)
	b := make([]byte, 6)
	rand.Read(b)
	name := "idem_test_" + hex.EncodeToString(b)
	if _, err := db.ExecContext(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	return testenv.MySQLDSN(t, testenv.MySQLURL(t), name)
}

// newUnmigratedStore returns a store with a pool of its own on a new,
// empty database.
func newUnmigratedStore(t testing.TB, now func() time.Time) *Store {
	t.Helper()
	dsn := newDatabase(t)
	s, err := Open(context.Background(), dsn, &Config{Now: now, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newTestStore returns a migrated store on a database of its own.
func newTestStore(t testing.TB, now func() time.Time) *Store {
	t.Helper()
	s := newUnmigratedStore(t, now)
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}
