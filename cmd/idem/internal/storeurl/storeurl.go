// Package storeurl opens an idem store from the URL the idem command's
// --store flag names:
//
//	sqlite:PATH          embedded SQLite file (sqlite:///abs/path also works);
//	                     ?synchronous=NORMAL trades power-loss durability for speed
//	memory:              in-process, not durable
//	postgres://…         PostgreSQL (also postgresql://); ?schema=NAME puts the
//	                     store's tables in that schema (default public);
//	                     ?group_commit=false sends every statement alone
//	                     (default true: idempgx.Config.GroupCommit); pgx's
//	                     own options pass through (pool_max_conns, default
//	                     DefaultPostgresMaxConns)
//	mysql://…            MySQL 8 or MariaDB 10.6+,
//	                     mysql://user:pass@host:3306/db; ?pool_max_conns=N
//	                     (default idemmysql.DefaultMaxConns), ?socket=PATH
//	                     for a Unix socket; go-sql-driver's own options pass
//	                     through (tls, timeout, …): see ParseMySQL
//	redis://…            Redis (also rediss:// for TLS); ?prefix=P starts the
//	                     store's keys with P (default idem:)
//	redis+cluster://…    a Redis Cluster, redis+sentinel://… a master named by
//	                     Sentinels (and rediss+…): see ParseRedis
//
// Open applies the embedded migrations of the SQL stores, so a fresh
// database works at once; migrating twice is harmless. OpenWith with
// Options.NoMigrate opens them as they are, for `idem migrate`.
package storeurl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rawio"
	"github.com/idem-dev/idem/internal/redact"
)

// Default is the store used when none is named.
const Default = "sqlite:./idem.db"

// Store kinds, as Kind returns them.
const (
	KindSQLite   = "sqlite"
	KindMemory   = "memory"
	KindPostgres = "postgres"
	KindMySQL    = "mysql"
	KindRedis    = "redis"
)

// ErrUnknownScheme is wrapped by the error of Open for a URL whose scheme
// names no store.
var ErrUnknownScheme = errors.New("unknown store scheme")

// connectTimeout bounds the first contact with a network store, so a wrong
// address fails at start rather than on the first request.
const connectTimeout = 10 * time.Second

// Kind returns the store kind rawURL names: KindSQLite, KindMemory,
// KindPostgres, KindMySQL or KindRedis, or "" when the scheme names no
// store.
func Kind(rawURL string) string {
	scheme, _, ok := strings.Cut(rawURL, ":")
	if !ok {
		return ""
	}
	switch strings.ToLower(scheme) {
	case "sqlite":
		return KindSQLite
	case "memory":
		return KindMemory
	case "postgres", "postgresql":
		return KindPostgres
	case "mysql":
		return KindMySQL
	case "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel":
		return KindRedis
	}
	return ""
}

// Options change how OpenWith opens a store. A nil *Options means the
// defaults, as Open uses them.
type Options struct {
	// NoMigrate opens a SQL store without applying its migrations, so that
	// its migration status can be read and migrations reverted. The store
	// is an *idemsqlite.Store, an *idempgx.Store or an *idemmysql.Store
	// whose schema may be missing or out of date. Defaults to false:
	// migrate on open.
	NoMigrate bool
	// NoCreate fails to open a SQLite file that does not exist yet, rather
	// than creating it. Defaults to false: create it.
	NoCreate bool
	// Partitions is idempgx.Config.Partitions for a PostgreSQL store: the
	// hash partitions of a key table its migration creates. Defaults to 0.
	Partitions int
}

// Open opens the store rawURL names and returns it with the function that
// closes it. The store is ready: SQL schemas are migrated and network stores
// have answered once.
func Open(ctx context.Context, rawURL string) (idemstore.Store, func() error, error) {
	return OpenWith(ctx, rawURL, nil)
}

// OpenWith is Open with options; opts may be nil.
func OpenWith(ctx context.Context, rawURL string, opts *Options) (idemstore.Store, func() error, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	switch Kind(rawURL) {
	case KindSQLite:
		return openSQLite(rawURL, o)
	case KindMemory:
		if _, rest, _ := strings.Cut(rawURL, ":"); rest != "" {
			return nil, nil, errors.New(`store "memory:" takes nothing after the colon`)
		}
		return idemmem.New(nil), func() error { return nil }, nil
	case KindPostgres:
		return openPostgres(ctx, rawURL, o)
	case KindMySQL:
		return openMySQL(ctx, rawURL, o)
	case KindRedis:
		return openRedis(ctx, rawURL)
	}
	// The URL is not echoed: it may carry a password.
	scheme, _, ok := strings.Cut(rawURL, ":")
	if !ok || scheme == "" {
		return nil, nil, fmt.Errorf("%w: the store URL has none; want sqlite:PATH, memory:, postgres://…, mysql://… or redis://…", ErrUnknownScheme)
	}
	return nil, nil, fmt.Errorf("%w %q: want sqlite:PATH, memory:, postgres://…, mysql://… or redis://…", ErrUnknownScheme, scheme)
}

// ParseSQLite reads a sqlite:PATH (or sqlite:///ABSOLUTE/PATH) URL with its
// ?synchronous= option into the file path and the store's configuration.
func ParseSQLite(rawURL string) (path string, cfg idemsqlite.Config, err error) {
	_, rest, _ := strings.Cut(rawURL, ":")
	path, rawQuery, _ := strings.Cut(rest, "?")
	if strings.HasPrefix(path, "//") {
		// sqlite:///abs/path: a URL with an empty host.
		u, err := url.Parse("sqlite:" + path)
		if err != nil || u.Host != "" {
			return "", cfg, fmt.Errorf("store %q: want sqlite:PATH or sqlite:///ABSOLUTE/PATH", Redact(rawURL))
		}
		path = u.Path
	}
	if path == "" {
		return "", cfg, fmt.Errorf("store %q: the path is missing (e.g. %s)", rawURL, Default)
	}
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", cfg, fmt.Errorf("store %q: %w", rawURL, err)
	}
	for name, values := range query {
		switch name {
		case "synchronous":
			cfg.Synchronous = values[len(values)-1]
		default:
			return "", cfg, fmt.Errorf("store %q: unknown option %q (want synchronous)", rawURL, name)
		}
	}
	return path, cfg, nil
}

// DefaultPostgresMaxConns is the size of the connection pool of a
// postgres:// store whose URL does not set pool_max_conns (pgxpool's own
// option). An idem server holds a connection for one statement at a time,
// but a new key's two statements each wait for their commit's WAL flush,
// and PostgreSQL flushes together the commits that wait together: pgxpool's
// default, max(4, GOMAXPROCS), let at most four requests share a flush. More
// connections are not free either: every statement then wakes a backend of
// its own, which costs the server CPU on every replay. Measured end to end
// (BENCHMARKS.md, section 5), 8 connections gave new keys the throughput of
// 16 and replays about the server CPU of 4. With group commit (the
// default, ?group_commit=), a quarter of them carry the groups of reserve
// and completion statements and the rest serve the other statements; 16
// then cost the server about a quarter more CPU per new key and per replay
// than 8. Connections are opened as requests need them.
const DefaultPostgresMaxConns = 8

// ParsePostgres reads a postgres:// URL into a pool configuration and the
// schema its ?schema= option names ("" when absent). schema and
// group_commit are ours, not PostgreSQL parameters: they are taken out
// before pgx would send them to the server. The pool holds at most
// pool_max_conns connections (default DefaultPostgresMaxConns).
func ParsePostgres(rawURL string) (*pgxpool.Config, string, error) {
	pcfg, opts, err := parsePostgres(rawURL)
	return pcfg, opts.schema, err
}

// postgresOptions are the options of a postgres:// URL that are ours.
type postgresOptions struct {
	schema      string
	groupCommit bool
}

func parsePostgres(rawURL string) (*pgxpool.Config, postgresOptions, error) {
	opts := postgresOptions{groupCommit: true}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, opts, fmt.Errorf("store %s: %w", Redact(rawURL), errors.Unwrap(err))
	}
	q, err := parseQuery(u.RawQuery)
	if err != nil {
		return nil, opts, fmt.Errorf("store %s: %w", Redact(rawURL), err)
	}
	opts.schema = q.Get("schema")
	q.Del("schema")
	if q.Has("group_commit") {
		v, err := strconv.ParseBool(q.Get("group_commit"))
		if err != nil {
			return nil, opts, fmt.Errorf("store %s: group_commit=%q: want true or false", Redact(rawURL), q.Get("group_commit"))
		}
		opts.groupCommit = v
		q.Del("group_commit")
	}
	u.RawQuery = q.Encode()
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, opts, fmt.Errorf("store %s: %w", Redact(rawURL), err)
	}
	if !q.Has("pool_max_conns") {
		pcfg.MaxConns = DefaultPostgresMaxConns
	}
	// Its connections are read and written as raw system calls
	// (rawio): a proxy on PostgreSQL goes idle at every round trip, and
	// each of its reads and writes would otherwise wake the runtime's
	// monitor thread again.
	pcfg.ConnConfig.DialFunc = rawio.Dial(pcfg.ConnConfig.DialFunc)
	return pcfg, opts, nil
}

func openSQLite(rawURL string, o Options) (idemstore.Store, func() error, error) {
	path, cfg, err := ParseSQLite(rawURL)
	if err != nil {
		return nil, nil, err
	}
	if o.NoCreate {
		if _, err := os.Stat(path); err != nil {
			return nil, nil, fmt.Errorf("store %q: %w", rawURL, err)
		}
	}
	if o.NoMigrate {
		return openSQLiteUnmigrated(path, &cfg)
	}
	s, err := idemsqlite.Open(path, &cfg)
	if err != nil {
		return nil, nil, err
	}
	return s, s.Close, nil
}

// sqliteBusyTimeout is how long the unmigrated store waits for the file's
// lock, as idemsqlite.Open does by default.
const sqliteBusyTimeout = 5 * time.Second

// openSQLiteUnmigrated opens the file as idemsqlite.Open does (WAL, busy
// timeout, immediate transactions, the synchronous setting) on a single
// connection, without migrating it.
func openSQLiteUnmigrated(path string, cfg *idemsqlite.Config) (idemstore.Store, func() error, error) {
	if cfg.Synchronous == "" {
		cfg.Synchronous = "FULL"
	}
	cfg.BusyTimeout = sqliteBusyTimeout
	q := url.Values{}
	q.Set("_busy_timeout", strconv.FormatInt(sqliteBusyTimeout.Milliseconds(), 10))
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", cfg.Synchronous)
	q.Set("_foreign_keys", "1")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, nil, fmt.Errorf("idemsqlite: opening %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	s, err := idemsqlite.New(db, cfg)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return s, db.Close, nil
}

// Wrap returns err, a failure to open or use the store at rawURL, as
// "store URL: err", the URL redacted and each line of err said once: pgx
// lists every connection attempt, and under sslmode=prefer (its default)
// the TLS and the plain attempt at a server that does not answer fail
// alike. errors.Is and errors.As still see err.
func Wrap(rawURL string, err error) error {
	return fmt.Errorf("store %s: %w", Redact(rawURL), sayOnce(err))
}

// sayOnce returns err with its repeated lines dropped, or err itself when
// no line repeats.
func sayOnce(err error) error {
	lines := strings.Split(err.Error(), "\n")
	seen := make(map[string]bool, len(lines))
	kept := lines[:0:0]
	for _, l := range lines {
		if !seen[l] {
			seen[l] = true
			kept = append(kept, l)
		}
	}
	if len(kept) == len(lines) {
		return err
	}
	return linesError{msg: strings.Join(kept, "\n"), err: err}
}

// linesError is an error shown with other text than its cause's.
type linesError struct {
	msg string
	err error
}

func (e linesError) Error() string { return e.msg }
func (e linesError) Unwrap() error { return e.err }

func openPostgres(ctx context.Context, rawURL string, o Options) (idemstore.Store, func() error, error) {
	pcfg, opts, err := parsePostgres(rawURL)
	if err != nil {
		return nil, nil, err
	}
	cfg := &idempgx.Config{Schema: opts.schema, Partitions: o.Partitions, GroupCommit: opts.groupCommit}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, Wrap(rawURL, err)
	}
	s := idempgx.New(pool, cfg)
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if o.NoMigrate {
		if err := pool.Ping(ctx); err != nil {
			s.Close()
			pool.Close()
			return nil, nil, Wrap(rawURL, err)
		}
		return s, func() error { s.Close(); pool.Close(); return nil }, nil
	}
	if _, err := s.Migrate(ctx); err != nil {
		s.Close()
		pool.Close()
		return nil, nil, Wrap(rawURL, err)
	}
	return s, func() error { s.Close(); pool.Close(); return nil }, nil
}

// ParseMySQL reads a mysql://user:pass@host:3306/db URL into the DSN of
// go-sql-driver/mysql (user:pass@tcp(host:3306)/db?…) and the size of the
// store's pool. The port defaults to 3306 and the database is required.
// pool_max_conns (default idemmysql.DefaultMaxConns) and socket=PATH (a
// Unix socket instead of the host) are ours; the other query parameters
// are the driver's (tls, timeout, readTimeout, …) and pass on in the DSN.
// The DSN holds the password: never log it (log Redact of the URL).
func ParseMySQL(rawURL string) (dsn string, maxConns int, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", 0, fmt.Errorf("store %s: %w", Redact(rawURL), errors.Unwrap(err))
	}
	fail := func(format string, args ...any) (string, int, error) {
		return "", 0, fmt.Errorf("store %s: "+format, append([]any{Redact(rawURL)}, args...)...)
	}
	if u.Opaque != "" {
		return fail("want mysql://user:pass@host:3306/db")
	}
	q, err := parseQuery(u.RawQuery)
	if err != nil {
		return fail("%w", err)
	}
	if q.Has("pool_max_conns") {
		n, err := strconv.Atoi(q.Get("pool_max_conns"))
		if err != nil || n < 1 {
			return fail("pool_max_conns=%q: want a number of connections, at least 1", q.Get("pool_max_conns"))
		}
		maxConns = n
		q.Del("pool_max_conns")
	}
	socket := q.Get("socket")
	q.Del("socket")
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return fail("the database is missing (want mysql://user:pass@host:3306/db)")
	}
	cfg := mysql.NewConfig()
	if len(q) > 0 {
		// The driver's own options, parsed (and checked) by the driver.
		if cfg, err = mysql.ParseDSN("/?" + q.Encode()); err != nil {
			return fail("%v", err)
		}
	}
	switch {
	case socket != "":
		if u.Host != "" {
			return fail("socket=%s and a host: name one of them", socket)
		}
		cfg.Net, cfg.Addr = "unix", socket
	case u.Hostname() == "":
		return fail("the host is missing (want mysql://user:pass@host:3306/db)")
	default:
		port := u.Port()
		if port == "" {
			port = "3306"
		}
		cfg.Net, cfg.Addr = "tcp", net.JoinHostPort(u.Hostname(), port)
	}
	cfg.DBName = db
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	return cfg.FormatDSN(), maxConns, nil
}

func openMySQL(ctx context.Context, rawURL string, o Options) (idemstore.Store, func() error, error) {
	dsn, maxConns, err := ParseMySQL(rawURL)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	s, err := idemmysql.Open(ctx, dsn, &idemmysql.Config{MaxConns: maxConns})
	if err != nil {
		return nil, nil, fmt.Errorf("store %s: %w", Redact(rawURL), err)
	}
	if !o.NoMigrate {
		if _, err := s.Migrate(ctx); err != nil {
			s.Close()
			return nil, nil, fmt.Errorf("store %s: %w", Redact(rawURL), err)
		}
	}
	return s, s.Close, nil
}

func openRedis(ctx context.Context, rawURL string) (idemstore.Store, func() error, error) {
	return openRedisURL(ctx, rawURL)
}

// parseQuery parses a store URL's query, refusing what it cannot parse
// rather than dropping it: url.URL.Query would drop "sslmode=verify-full;"
// (a ';' is no separator) and connect without verifying the certificate.
// The error names the part, its secret values masked.
func parseQuery(rawQuery string) (url.Values, error) {
	q, err := url.ParseQuery(rawQuery)
	if err == nil {
		return q, nil
	}
	for part := range strings.SplitSeq(rawQuery, "&") {
		if _, perr := url.ParseQuery(part); perr != nil {
			return nil, fmt.Errorf("the query part %q does not parse: %w", strings.TrimPrefix(Redact("?"+part), "?"), perr)
		}
	}
	return nil, fmt.Errorf("the query does not parse: %w", err)
}

// Redact returns rawURL fit for a log or an error, whatever its scheme or
// shape: the password of the user information, the values of secret query
// parameters and of a key=value connection string's password are masked
// (see redact.URL, which it is).
func Redact(rawURL string) string { return redact.URL(rawURL) }
