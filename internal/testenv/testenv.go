// Package testenv finds the external services that tests need.
//
// Tests that need PostgreSQL, MySQL (or MariaDB), Redis, NATS or RabbitMQ
// call PostgresURL, MySQLURL, RedisURL, NATSURL or AMQPURL. The URL comes
// from IDEM_TEST_DATABASE_URL / IDEM_TEST_MYSQL_URL / IDEM_TEST_REDIS_URL /
// IDEM_TEST_NATS_URL / IDEM_TEST_AMQP_URL with localhost defaults. When the service does not answer the test is skipped with the
// variable's name, unless IDEM_TEST_REQUIRE_ALL=1, when it fails instead.
//
// Race releases many goroutines at once, for tests of concurrent callers;
// KillChild runs a test in a child process of the test binary and kills it
// at a point the child announces, for tests of what survives a crash.
package testenv

import (
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// Default service URLs, used when the environment variables are unset.
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultMySQLURL    = "mysql://root@127.0.0.1:3306/test"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
)

// RequireAll reports whether IDEM_TEST_REQUIRE_ALL=1: missing services fail.
func RequireAll() bool { return os.Getenv("IDEM_TEST_REQUIRE_ALL") == "1" }

// PostgresURL returns the PostgreSQL URL for tests, or skips (fails under
// IDEM_TEST_REQUIRE_ALL=1) when the server does not answer.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "IDEM_TEST_DATABASE_URL", DefaultPostgresURL, "5432")
}

// MySQLURL returns the MySQL (or MariaDB) URL for tests,
// mysql://user:pass@host:3306/db, or skips (fails under
// IDEM_TEST_REQUIRE_ALL=1) when the server does not answer.
func MySQLURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "IDEM_TEST_MYSQL_URL", DefaultMySQLURL, "3306")
}

// MySQLDSN returns the go-sql-driver DSN (user:pass@tcp(host:port)/db) of
// rawURL, a mysql:// URL as MySQLURL returns it, with database db instead
// of the URL's when db is not empty. The URL's query passes on as the DSN's
// parameters.
func MySQLDSN(t testing.TB, rawURL, db string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "mysql" {
		t.Fatalf("IDEM_TEST_MYSQL_URL: want mysql://user:pass@host:3306/db (%v)", err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "3306")
	}
	if db == "" {
		db = strings.TrimPrefix(u.Path, "/")
	}
	dsn := "tcp(" + host + ")/" + db
	if u.User != nil {
		user := u.User.Username()
		if pass, ok := u.User.Password(); ok {
			user += ":" + pass
		}
		dsn = user + "@" + dsn
	}
	if u.RawQuery != "" {
		dsn += "?" + u.RawQuery
	}
	return dsn
}

// RedisURL returns the Redis URL for tests, or skips (fails under
// IDEM_TEST_REQUIRE_ALL=1) when the server does not answer.
func RedisURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "IDEM_TEST_REDIS_URL", DefaultRedisURL, "6379")
}

// NATSURL returns the NATS URL for tests, or skips (fails under
// IDEM_TEST_REQUIRE_ALL=1) when the server does not answer. Whether it runs
// JetStream is the caller's to check (Unavailable when it does not).
func NATSURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "IDEM_TEST_NATS_URL", DefaultNATSURL, "4222")
}

// AMQPURL returns the RabbitMQ URL for tests, or skips (fails under
// IDEM_TEST_REQUIRE_ALL=1) when the server does not answer.
func AMQPURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "IDEM_TEST_AMQP_URL", DefaultAMQPURL, "5672")
}

// Unavailable skips the test, or fails it under IDEM_TEST_REQUIRE_ALL=1.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if RequireAll() {
		t.Fatalf("IDEM_TEST_REQUIRE_ALL=1: "+format, args...)
	}
	t.Skipf(format, args...)
}

func serviceURL(t testing.TB, env, def, port string) string {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s: invalid URL: %v", env, err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), port)
	}
	conn, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		Unavailable(t, "%s (%s) does not answer: %v; set %s to a reachable server", env, host, err, env)
		return ""
	}
	conn.Close()
	return raw
}
