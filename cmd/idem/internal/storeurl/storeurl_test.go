package storeurl

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestKind(t *testing.T) {
	t.Parallel()
	tests := []struct{ url, want string }{
		{"sqlite:./idem.db", KindSQLite},
		{"SQLite:/tmp/x.db", KindSQLite},
		{"sqlite:///tmp/x.db", KindSQLite},
		{"memory:", KindMemory},
		{"postgres://u:p@h/db", KindPostgres},
		{"postgresql://h/db", KindPostgres},
		{"redis://h:6379/0", KindRedis},
		{"rediss://h:6379/0", KindRedis},
		{"mysql://h/db", KindMySQL},
		{"MySQL://u:p@h:3306/db", KindMySQL},
		{"mariadb://h/db", ""},
		{"./idem.db", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if got := Kind(tt.url); got != tt.want {
			t.Errorf("Kind(%q) = %q, want %q", tt.url, got, tt.want)
		}
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := []struct{ url, want string }{
		{"sqlite:./idem.db", "sqlite:./idem.db"},
		{"memory:", "memory:"},
		{"postgres://app:s3cret@db:5432/idem?sslmode=disable", "postgres://app:xxxxx@db:5432/idem?sslmode=disable"},
		{"postgres://app@db/idem?password=s3cret&sslpassword=k3y", "postgres://app@db/idem?password=xxxxx&sslpassword=xxxxx"},
		{"redis://:s3cret@cache:6379/0", "redis://:xxxxx@cache:6379/0"},
		{"http://user:s3cret@upstream:9000/base", "http://user:xxxxx@upstream:9000/base"},
		{"host=db password=s3cret", "host=db password=xxxxx"},
		{"postgres://app:s3cret@db:badport\x7f/idem", "postgres://app:xxxxx@db:badport\x7f/idem"},
		{"postgress://app:s3cret@db/idem", "postgress://app:xxxxx@db/idem"},
	}
	for _, tt := range tests {
		got := Redact(tt.url)
		if strings.Contains(got, "s3cret") || strings.Contains(got, "k3y") {
			t.Errorf("Redact(%q) = %q leaks the secret", tt.url, got)
		}
		if got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.url, got, tt.want)
		}
	}
}

func TestOpenRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		url     string
		wantErr string
	}{
		{"mariadb://root:s3cret@db/idem", `unknown store scheme "mariadb"`},
		{"mysql://root:s3cret@127.0.0.1:1/idem?timeout=1s", "store mysql://root:xxxxx@127.0.0.1:1/idem"},
		{"mysql://root:s3cret@127.0.0.1:3306/", "the database is missing"},
		{"mysql://root:s3cret@127.0.0.1:3306/idem?pool_max_conns=0", "pool_max_conns"},
		{"mysql://root:s3cret@127.0.0.1:3306/idem?timeout=soon", "store mysql://root:xxxxx@"},
		{"./idem.db", "unknown store scheme: the store URL has none"},
		{"", "unknown store scheme"},
		{"memory:extra", "takes nothing after the colon"},
		{"sqlite:", "the path is missing"},
		{"sqlite://host/x.db", "sqlite:///ABSOLUTE/PATH"},
		{"sqlite:" + filepath.Join(dir, "x.db") + "?cache=shared", `unknown option "cache"`},
		{"sqlite:" + filepath.Join(dir, "x.db") + "?synchronous=OFF", "want FULL or NORMAL"},
		{"sqlite:" + filepath.Join(dir, "missing-dir", "x.db"), "x.db"},
		{"postgres://app:s3cret@127.0.0.1:1/idem?connect_timeout=1", "store postgres://app:xxxxx@"},
		{"redis://:s3cret@127.0.0.1:1/0", "store redis://:xxxxx@"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			s, closeStore, err := Open(ctx, tt.url)
			if err == nil {
				closeStore()
				t.Fatalf("Open(%q) = %T, want an error", tt.url, s)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Open(%q) error = %q, want it to contain %q", tt.url, err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("Open(%q) error %q leaks the password", tt.url, err)
			}
		})
	}
	if _, _, err := Open(t.Context(), "mariadb://db"); !errors.Is(err, ErrUnknownScheme) {
		t.Errorf("unknown scheme error = %v, want ErrUnknownScheme", err)
	}
}

// roundTrip reserves and completes a key, then reads it back.
func roundTrip(t *testing.T, s idemstore.Store) {
	t.Helper()
	ctx := t.Context()
	id := idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "k-" + randomHex()}
	res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{
		Identity: id, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour,
		LeaseExpiredState: idemstore.StateUnknown,
	})
	if err != nil || !res.Reserved {
		t.Fatalf("KeyReserve = %+v, %v; want reserved", res, err)
	}
	err = s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t", Response: &idemstore.Response{Status: 201, Body: []byte("ok")}})
	if err != nil {
		t.Fatalf("KeyComplete: %v", err)
	}
	rec, err := s.KeyGet(ctx, id)
	if err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != "ok" {
		t.Fatalf("KeyGet = %+v, %v; want completed with body ok", rec, err)
	}
}

func randomHex() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func open(t *testing.T, rawURL string) idemstore.Store {
	t.Helper()
	s, closeStore, err := Open(t.Context(), rawURL)
	if err != nil {
		t.Fatalf("Open(%s): %v", Redact(rawURL), err)
	}
	t.Cleanup(func() {
		if err := closeStore(); err != nil {
			t.Errorf("closing %s: %v", Redact(rawURL), err)
		}
	})
	return s
}

func TestOpenSQLite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, u := range []string{
		"sqlite:" + filepath.Join(dir, "a.db"),
		"sqlite://" + filepath.Join(dir, "b.db"), // sqlite:///abs/path
		"sqlite:" + filepath.Join(dir, "c.db") + "?synchronous=normal",
	} {
		roundTrip(t, open(t, u))
	}
	// The file persists: a second Open sees the first one's record.
	path := "sqlite:" + filepath.Join(dir, "d.db")
	s, closeStore, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	id := idemstore.Identity{Key: "persisted"}
	if _, err := s.KeyReserve(t.Context(), &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
		t.Fatal(err)
	}
	if err := closeStore(); err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, path).KeyGet(t.Context(), id); err != nil {
		t.Errorf("KeyGet after reopening: %v", err)
	}
}

func TestOpenMemory(t *testing.T) {
	t.Parallel()
	roundTrip(t, open(t, "memory:"))
}

func TestOpenPostgres(t *testing.T) {
	t.Parallel()
	base := testenv.PostgresURL(t)
	schema := "storeurl_test_" + randomHex()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
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
	roundTrip(t, open(t, u.String()))

	// The store's tables are in the named schema, not in public.
	conn, err := pgx.Connect(t.Context(), base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{schema, "idem_keys"}.Sanitize()).Scan(&n); err != nil || n != 1 {
		t.Errorf("records in %s.idem_keys = %d, %v; want 1", schema, n, err)
	}
}

// TestParseMySQL: a mysql:// URL becomes go-sql-driver's DSN, with the
// password where the driver reads it and never in an error.
func TestParseMySQL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url, dsn string
		conns    int
	}{
		{"mysql://root@127.0.0.1:3306/test", "root@tcp(127.0.0.1:3306)/test", 0},
		{"mysql://app:s3cret@db/idem", "app:s3cret@tcp(db:3306)/idem", 0},
		{"mysql://app:p%40ss%2Fw:rd@db:3307/idem?pool_max_conns=4", "app:p@ss/w:rd@tcp(db:3307)/idem", 4},
		{"mysql://app@[::1]:3306/idem?tls=skip-verify&timeout=5s", "app@tcp([::1]:3306)/idem?timeout=5s&tls=skip-verify", 0},
		{"mysql://root@/idem?socket=/tmp/my.sock", "root@unix(/tmp/my.sock)/idem", 0},
	} {
		dsn, conns, err := ParseMySQL(tt.url)
		if err != nil || dsn != tt.dsn || conns != tt.conns {
			t.Errorf("ParseMySQL(%q) = %q, %d, %v; want %q, %d", tt.url, dsn, conns, err, tt.dsn, tt.conns)
		}
	}
	for _, bad := range []string{
		"mysql://app:s3cret@db/",
		"mysql://app:s3cret@/idem",
		"mysql://app:s3cret@db/idem/extra",
		"mysql://app:s3cret@db/idem?pool_max_conns=x",
		"mysql://app:s3cret@db/idem?socket=/tmp/s",
		"mysql://app:s3cret@db/idem?timeout=soon",
		"mysql:app:s3cret@db/idem",
	} {
		_, _, err := ParseMySQL(bad)
		if err == nil {
			t.Errorf("ParseMySQL(%q) = nil error, want a refusal", bad)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseMySQL(%q) error %q leaks the password", bad, err)
		}
	}
}

func TestOpenMySQL(t *testing.T) {
	t.Parallel()
	base := testenv.MySQLURL(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	admin, _, err := ParseMySQL(base)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // after the drop below
	name := "storeurl_test_" + randomHex()
	if _, err := db.ExecContext(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("dropping %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	roundTrip(t, open(t, u.String()))
	// The store's table is in the URL's database, migrated by Open.
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM "+name+".idem_keys").Scan(&n); err != nil || n != 1 {
		t.Errorf("records in %s.idem_keys = %d, %v; want 1", name, n, err)
	}
}

func TestOpenRedis(t *testing.T) {
	t.Parallel()
	base := testenv.RedisURL(t)
	prefix := "storeurl_test_" + randomHex() + ":"
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("prefix", prefix)
	u.RawQuery = q.Encode()
	roundTrip(t, open(t, u.String()))

	// The store's keys carry the prefix; remove them.
	opts, err := redis.ParseURL(base)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	defer client.Close()
	keys, err := client.Keys(t.Context(), prefix+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("keys under %q = %q, %v; want the record's", prefix, keys, err)
	}
	if len(keys) > 0 {
		if err := client.Del(t.Context(), keys...).Err(); err != nil {
			t.Errorf("deleting the test keys: %v", err)
		}
	}
}

// OpenWith NoMigrate leaves a fresh SQLite file unmigrated; Open migrates it.
func TestOpenWithNoMigrate(t *testing.T) {
	t.Parallel()
	path := "sqlite:" + filepath.Join(t.TempDir(), "fresh.db")
	status := func(opts *Options) []idemsqlite.Migration {
		t.Helper()
		s, closeStore, err := OpenWith(t.Context(), path, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer closeStore()
		ms, err := s.(*idemsqlite.Store).MigrationStatus(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	if ms := status(&Options{NoMigrate: true}); len(ms) == 0 || ms[0].Applied {
		t.Errorf("status after opening with NoMigrate = %+v, want the first migration pending", ms)
	}
	if ms := status(nil); len(ms) == 0 || !ms[len(ms)-1].Applied {
		t.Errorf("status after Open = %+v, want every migration applied", ms)
	}
	if ms := status(&Options{NoMigrate: true}); !ms[len(ms)-1].Applied {
		t.Errorf("status after reopening with NoMigrate = %+v, want every migration still applied", ms)
	}
}

// closedAddr returns a local address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// pgx tries a server twice under sslmode=prefer (TLS, then plain) and
// lists both failures; when they are the same, the error says it once.
func TestPostgresDialErrorSaidOnce(t *testing.T) {
	t.Parallel()
	raw := "postgres://u:secret@" + closedAddr(t) + "/db?connect_timeout=5"
	for _, opts := range []*Options{nil, {NoMigrate: true}} {
		_, _, err := OpenWith(t.Context(), raw, opts)
		if err == nil {
			t.Fatal("opened a store nobody serves")
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "store postgres://u:xxxxx@") {
			t.Errorf("error %q does not start with the redacted store URL", msg)
		}
		if n := strings.Count(msg, "connection refused"); n != 1 {
			t.Errorf("error says the dial failure %d times, want once:\n%s", n, msg)
		}
	}
}

// TestPostgresDialsRaw: the pool's connections are rawio's, and a failed
// dial is still the dialer's error.
func TestPostgresDialsRaw(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	pcfg, _, err := ParsePostgres("postgres://u@" + ln.Addr().String() + "/db")
	if err != nil {
		t.Fatal(err)
	}
	c, err := pcfg.ConnConfig.DialFunc(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, plain := c.(*net.TCPConn); plain && runtime.GOOS == "linux" {
		t.Error("the pool dials plain TCP connections, want rawio's")
	}
	if _, err := pcfg.ConnConfig.DialFunc(t.Context(), "tcp", closedAddr(t)); err == nil {
		t.Error("dialing a closed port succeeded")
	}
}
