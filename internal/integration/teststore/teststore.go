// Package teststore opens a store of each kind the conformance suite
// covers (memory, SQLite, PostgreSQL, MySQL, Redis) for one test, in a place
// of its own that is removed when the test ends: a file in the test's
// temporary directory, a fresh PostgreSQL schema, a fresh MySQL database, a
// fresh Redis key prefix.
//
// PostgreSQL, MySQL and Redis are found through testenv: a server that does
// not answer skips the test, or fails it under IDEM_TEST_REQUIRE_ALL=1.
//
// It is a package of its own, not part of testenv, because it imports the
// store drivers, whose own tests import testenv.
package teststore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemredis"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// Kinds are the kinds of store Open makes, in the order ForEach runs them.
var Kinds = []string{"memory", "sqlite", "postgres", "mysql", "redis"}

// ForEach runs f as a parallel subtest, named after the kind, for each of
// Kinds.
func ForEach(t *testing.T, f func(t *testing.T, kind string)) {
	t.Helper()
	for _, kind := range Kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f(t, kind)
		})
	}
}

// Open returns a store of kind (one of Kinds) on the clock now, in a place
// of its own removed when the test ends.
func Open(t testing.TB, kind string, now func() time.Time) idemstore.Store {
	t.Helper()
	switch kind {
	case "memory":
		return idemmem.New(&idemmem.Config{Now: now})
	case "sqlite":
		return OpenSQLite(t, filepath.Join(t.TempDir(), "idem.db"), now)
	case "postgres":
		return OpenPostgres(t, NewSchema(t), now)
	case "mysql":
		return OpenMySQL(t, NewMySQLDatabase(t), now)
	case "redis":
		return OpenRedis(t, now)
	}
	t.Fatalf("teststore: unknown store kind %q", kind)
	return nil
}

// OpenDurable returns a store of kind "sqlite", "postgres" or "mysql",
// like Open, and the spec with which Reopen opens the same store again, in
// this process or in another: "sqlite:PATH", "postgres:SCHEMA" or
// "mysql:DSN".
func OpenDurable(t testing.TB, kind string, now func() time.Time) (idemstore.TxStore, string) {
	t.Helper()
	var spec string
	switch kind {
	case "sqlite":
		spec = "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	case "postgres":
		spec = "postgres:" + NewSchema(t)
	case "mysql":
		spec = "mysql:" + NewMySQLDatabase(t)
	default:
		t.Fatalf("teststore: store kind %q is not durable", kind)
	}
	return Reopen(t, spec, now), spec
}

// Reopen opens the store that spec (from OpenDurable) names, closed when
// the test ends. It neither makes nor removes the store's place.
func Reopen(t testing.TB, spec string, now func() time.Time) idemstore.TxStore {
	t.Helper()
	switch kind, where, _ := strings.Cut(spec, ":"); kind {
	case "sqlite":
		return OpenSQLite(t, where, now)
	case "postgres":
		return OpenPostgres(t, where, now)
	case "mysql":
		return OpenMySQL(t, where, now)
	}
	t.Fatalf("teststore: unknown store spec %q", spec)
	return nil
}

// OpenSQLite opens the SQLite store at path, closed when the test ends.
func OpenSQLite(t testing.TB, path string, now func() time.Time) *idemsqlite.Store {
	t.Helper()
	s, err := idemsqlite.Open(path, &idemsqlite.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// OpenPostgres returns a PostgreSQL store in schema, migrated, on a pool of
// its own (Pool).
func OpenPostgres(t testing.TB, schema string, now func() time.Time) *idempgx.Store {
	t.Helper()
	s := idempgx.New(Pool(t), &idempgx.Config{Schema: schema, Now: now})
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// NewSchema returns a fresh PostgreSQL schema name, not yet created, whose
// schema is dropped (with everything in it) when the test ends.
func NewSchema(t testing.TB) string {
	t.Helper()
	schema := "idem_test_" + randomHex()
	pool := Pool(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return schema
}

// Pool opens a pool of at most 8 connections on the test PostgreSQL
// (testenv.PostgresURL), closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// OpenMySQL returns a MySQL store on the database of dsn (a go-sql-driver
// DSN), migrated, on a pool of its own of at most 8 connections, closed
// when the test ends.
func OpenMySQL(t testing.TB, dsn string, now func() time.Time) *idemmysql.Store {
	t.Helper()
	s, err := idemmysql.Open(context.Background(), dsn, &idemmysql.Config{Now: now, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// NewMySQLDatabase creates a database on the test MySQL server
// (testenv.MySQLURL), dropped when the test ends, and returns its DSN.
func NewMySQLDatabase(t testing.TB) string {
	t.Helper()
	base := testenv.MySQLURL(t)
	admin, err := sql.Open("mysql", testenv.MySQLDSN(t, base, ""))
	if err != nil {
		t.Fatal(err)
	}
	name := "idem_test_" + randomHex()
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		admin.Close()
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	return testenv.MySQLDSN(t, base, name)
}

// OpenRedis returns a Redis store under a fresh key prefix whose keys are
// deleted when the test ends (unknown records have no TTL).
func OpenRedis(t testing.TB, now func() time.Time) *idemredis.Store {
	t.Helper()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	prefix := "idem-test:" + randomHex() + ":"
	t.Cleanup(func() {
		defer client.Close()
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			client.Unlink(ctx, keys...)
		}
		if err := iter.Err(); err != nil {
			t.Errorf("deleting the test's keys: %v", err)
		}
	})
	return idemredis.New(client, &idemredis.Config{Prefix: prefix, Now: now})
}

func randomHex() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
