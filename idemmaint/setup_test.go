package idemmaint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemredis"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/integration/teststore"
	"github.com/idem-dev/idem/internal/testenv"
)

// t0 is where every test clock starts: whole seconds, so that stores with
// microsecond time columns round-trip every time exactly.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// Parameters of the records the tests make.
const (
	testLease       = 30 * time.Second
	testTTL         = 24 * time.Hour
	testFingerprint = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0"
)

// The PostgreSQL tests share one pool; every store gets its own schema.
var (
	poolMu sync.Mutex
	pool   *pgxpool.Pool
)

func TestMain(m *testing.M) {
	code := m.Run()
	poolMu.Lock()
	if pool != nil {
		pool.Close()
	}
	poolMu.Unlock()
	os.Exit(code)
}

// storeKind opens a store of one kind on a test clock.
type storeKind struct {
	name string
	open func(t *testing.T, now func() time.Time) (idemstore.Store, bulkFunc)
}

// bulkFunc writes n records id(0) … id(n-1), finished (completed, released
// or unknown in turn), created at now with retention ttl, in one statement
// where the store has SQL: making ten thousand records through KeyReserve
// takes seconds on a busy machine.
type bulkFunc func(t *testing.T, ctx context.Context, n int, now time.Time, ttl time.Duration)

var storeKinds = []storeKind{
	{"memory", openMemory},
	{"sqlite", openSQLite},
	{"postgres", openPostgres},
	{"mysql", openMySQL},
	{"redis", openRedis},
}

func openMemory(t *testing.T, now func() time.Time) (idemstore.Store, bulkFunc) {
	s := idemmem.New(&idemmem.Config{Now: now})
	return s, bulkThroughAPI(s)
}

// bulkThroughAPI makes the records of a bulk insert with the store's own
// methods, on a few goroutines.
func bulkThroughAPI(s idemstore.Store) bulkFunc {
	return func(t *testing.T, ctx context.Context, n int, _ time.Time, ttl time.Duration) {
		t.Helper()
		const workers = 32
		errs := make(chan error, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < n; i += workers {
					if err := bulkRecord(ctx, s, i, ttl); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}

// bulkRecord makes record i of a bulk insert.
func bulkRecord(ctx context.Context, s idemstore.Store, i int, ttl time.Duration) error {
	p := &idemstore.ReserveParams{Identity: id(i), Fingerprint: testFingerprint, Token: fmt.Sprintf("bulk-%05d", i),
		Lease: testLease, TTL: ttl, LeaseExpiredState: idemstore.StateUnknown}
	if _, err := s.KeyReserve(ctx, p); err != nil {
		return fmt.Errorf("KeyReserve(%v): %w", p.Identity, err)
	}
	f := &idemstore.FinishParams{Identity: p.Identity, Token: p.Token}
	var err error
	switch i % 3 {
	case 0:
		err = s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: p.Identity, Token: p.Token, Response: &idemstore.Response{Status: 201}})
	case 1:
		err = s.KeyRelease(ctx, f)
	case 2:
		err = s.KeyMarkUnknown(ctx, f)
	}
	if err != nil {
		return fmt.Errorf("finishing %v: %w", p.Identity, err)
	}
	return nil
}

func openRedis(t *testing.T, now func() time.Time) (idemstore.Store, bulkFunc) {
	t.Helper()
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	client := redis.NewClient(opts)
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "idemmaint-test:" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("listing the test keys: %v", err)
			return
		}
		for len(keys) > 0 {
			n := min(len(keys), 1000)
			if err := client.Unlink(ctx, keys[:n]...).Err(); err != nil {
				t.Errorf("deleting the test keys: %v", err)
				return
			}
			keys = keys[n:]
		}
	})
	s := idemredis.New(client, &idemredis.Config{Prefix: prefix, Now: now})
	return s, bulkThroughAPI(s)
}

// bulkStates is the state of record i of a bulk insert, in SQL.
const bulkStates = `(CASE i % 3 WHEN 0 THEN 'completed' WHEN 1 THEN 'released' ELSE 'unknown' END)`

func openSQLite(t *testing.T, now func() time.Time) (idemstore.Store, bulkFunc) {
	t.Helper()
	// NORMAL skips the fsync per commit: the tests write thousands of
	// records and durability against power loss is not what they test.
	s, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), &idemsqlite.Config{Now: now, Synchronous: "NORMAL"})
	if err != nil {
		t.Fatalf("idemsqlite.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the sqlite store: %v", err)
		}
	})
	bulk := func(t *testing.T, ctx context.Context, n int, now time.Time, ttl time.Duration) {
		t.Helper()
		_, err := s.DB().ExecContext(ctx, `WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < ?1)
INSERT INTO idem_keys (scope, endpoint, key, fingerprint, state, token, locked_until, started_at,
	lease_expired_state, response_status, created_at, updated_at, expires_at)
SELECT ?2, ?3, printf('raw-client-key-%05d', i), ?4, `+bulkStates+`, printf('bulk-%05d', i), ?5, ?5,
	'unknown', CASE i % 3 WHEN 0 THEN 201 END, ?5, ?5, ?6
FROM seq`, n, id(0).Scope, id(0).Endpoint, testFingerprint, now.UnixMicro(), now.Add(ttl).UnixMicro())
		if err != nil {
			t.Fatalf("bulk insert: %v", err)
		}
	}
	return s, bulk
}

func openPostgres(t *testing.T, now func() time.Time) (idemstore.Store, bulkFunc) {
	t.Helper()
	url := testenv.PostgresURL(t)
	poolMu.Lock()
	if pool == nil {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			poolMu.Unlock()
			t.Fatalf("parsing %s: %v", url, err)
		}
		cfg.MaxConns = 8
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			poolMu.Unlock()
			t.Fatalf("connecting to postgres: %v", err)
		}
		pool = p
	}
	p := pool
	poolMu.Unlock()

	b := make([]byte, 6)
	rand.Read(b)
	schema := "idemmaint_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	s := idempgx.New(p, &idempgx.Config{Schema: schema, Now: now})
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("migrating postgres schema %s: %v", schema, err)
	}
	bulk := func(t *testing.T, ctx context.Context, n int, now time.Time, ttl time.Duration) {
		t.Helper()
		_, err := p.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema}.Sanitize()+`.idem_keys (scope, endpoint, key, fingerprint,
	state, token, locked_until, started_at, lease_expired_state, response_status, created_at, updated_at, expires_at,
	unknown_since)
SELECT $2, $3, 'raw-client-key-' || lpad(i::text, 5, '0'), $4, `+bulkStates+`, 'bulk-' || lpad(i::text, 5, '0'),
	$5, $5, 'unknown', CASE i % 3 WHEN 0 THEN 201 END, $5, $5, $6,
	CASE WHEN `+bulkStates+` = 'unknown' THEN $5::timestamptz END
FROM generate_series(0, $1::int - 1) AS i`, n, id(0).Scope, id(0).Endpoint, testFingerprint, now, now.Add(ttl))
		if err != nil {
			t.Fatalf("bulk insert: %v", err)
		}
	}
	return s, bulk
}

func openMySQL(t *testing.T, now func() time.Time) (idemstore.Store, bulkFunc) {
	t.Helper()
	s := teststore.OpenMySQL(t, teststore.NewMySQLDatabase(t), now)
	bulk := func(t *testing.T, ctx context.Context, n int, now time.Time, ttl time.Duration) {
		t.Helper()
		now = now.UTC().Truncate(time.Microsecond)
		until := now.Add(ttl).UTC().Truncate(time.Microsecond)
		const chunk = 500
		for start := 0; start < n; start += chunk {
			var q strings.Builder
			q.WriteString(`INSERT INTO idem_keys (scope, endpoint, idem_key, fingerprint, state, token,
	locked_until, started_at, lease_expired_state, response_status, not_replayable, created_at,
	updated_at, expires_at, ttl) VALUES `)
			var args []any
			for i := start; i < min(start+chunk, n); i++ {
				if i > start {
					q.WriteString(", ")
				}
				q.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, 'unknown', ?, FALSE, ?, ?, ?, ?)")
				state, status := []string{"completed", "released", "unknown"}[i%3], any(nil)
				if i%3 == 0 {
					status = 201
				}
				args = append(args, id(i).Scope, id(i).Endpoint, id(i).Key, testFingerprint, state,
					fmt.Sprintf("bulk-%05d", i), now, now, status, now, now, until, ttl.Microseconds())
			}
			if _, err := s.DB().ExecContext(ctx, q.String(), args...); err != nil {
				t.Fatalf("bulk insert: %v", err)
			}
		}
	}
	return s, bulk
}

// bundle is what setup gives a test.
type bundle struct {
	store idemstore.Store
	clock *idemtest.Clock
	ctx   context.Context
	logs  *logBuffer
	// bulk writes many finished records at once.
	bulk bulkFunc
	// spy wraps store and counts the calls the maintainer makes.
	spy    *spyStore
	tokens atomic.Int64
}

// forEachStore runs f as a parallel subtest against each store kind.
func forEachStore(t *testing.T, f func(t *testing.T, b *bundle)) {
	t.Helper()
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			clock := idemtest.NewClock(t0)
			s, bulk := k.open(t, clock.Now)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			f(t, &bundle{store: s, clock: clock, ctx: ctx, logs: &logBuffer{}, bulk: bulk, spy: &spyStore{Store: s}})
		})
	}
}

// newMaintainer returns a Maintainer on the bundle's spied store, logging to
// the bundle's buffer and reading its clock. cfg may be nil.
func (b *bundle) newMaintainer(cfg *Config) *Maintainer {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.Logger = b.logs.logger()
	c.Now = b.clock.Now
	if c.Grace == 0 {
		// The tests of the other rules ask about a record marked unknown
		// at once; TestReconcileWaitsGrace tests the grace.
		c.Grace = -1
	}
	return New(b.spy, &c)
}

// token returns a fencing token unique within the bundle.
func (b *bundle) token() string {
	return fmt.Sprintf("token-%06d", b.tokens.Add(1))
}

// id returns a test identity; the key is recognisable so tests can check it
// never reaches the logs.
func id(n int) idemstore.Identity {
	return idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: fmt.Sprintf("raw-client-key-%05d", n)}
}

// reserve reserves a new record and fails unless it got the lease.
func (b *bundle) reserve(t *testing.T, p idemstore.ReserveParams) *idemstore.Record {
	t.Helper()
	if p.Fingerprint == "" {
		p.Fingerprint = testFingerprint
	}
	if p.Token == "" {
		p.Token = b.token()
	}
	if p.Lease == 0 {
		p.Lease = testLease
	}
	if p.TTL == 0 {
		p.TTL = testTTL
	}
	if p.LeaseExpiredState == "" {
		p.LeaseExpiredState = idemstore.StateUnknown
	}
	res, err := b.store.KeyReserve(b.ctx, &p)
	if err != nil {
		t.Fatalf("KeyReserve(%v): %v", p.Identity, err)
	}
	if !res.Reserved {
		t.Fatalf("KeyReserve(%v): not reserved, record is %s", p.Identity, res.Record.State)
	}
	return res.Record
}

// unknown makes an unknown record for id and returns it as KeyGet sees it.
func (b *bundle) unknown(t *testing.T, id idemstore.Identity) *idemstore.Record {
	t.Helper()
	rec := b.reserve(t, idemstore.ReserveParams{Identity: id})
	if err := b.store.KeyMarkUnknown(b.ctx, &idemstore.FinishParams{Identity: id, Token: rec.Token}); err != nil {
		t.Fatalf("KeyMarkUnknown(%v): %v", id, err)
	}
	return b.requireState(t, id, idemstore.StateUnknown)
}

// get returns the record of id and fails on error.
func (b *bundle) get(t *testing.T, id idemstore.Identity) *idemstore.Record {
	t.Helper()
	rec, err := b.store.KeyGet(b.ctx, id)
	if err != nil {
		t.Fatalf("KeyGet(%v): %v", id, err)
	}
	return rec
}

// requireState fails unless the record of id is in state s, and returns it.
func (b *bundle) requireState(t *testing.T, id idemstore.Identity, s idemstore.State) *idemstore.Record {
	t.Helper()
	rec := b.get(t, id)
	if rec.State != s {
		t.Fatalf("record %v: state %q, want %q", id, rec.State, s)
	}
	return rec
}

// spyStore is a real store that counts the batch calls made on it.
type spyStore struct {
	idemstore.Store
	mu     sync.Mutex
	sweeps []int // Limit of each KeySweep call
	reaps  []int // Limit of each KeyReap call
	reaped []int // result of each KeyReap call
	// reapErr, when set, is what KeyReap returns instead of reaping.
	reapErr error
}

func (s *spyStore) KeySweep(ctx context.Context, p *idemstore.SweepParams) ([]*idemstore.Record, error) {
	s.mu.Lock()
	s.sweeps = append(s.sweeps, p.Limit)
	s.mu.Unlock()
	return s.Store.KeySweep(ctx, p)
}

func (s *spyStore) KeyReap(ctx context.Context, p *idemstore.ReapParams) (int, error) {
	if s.reapErr != nil {
		return 0, s.reapErr
	}
	n, err := s.Store.KeyReap(ctx, p)
	s.mu.Lock()
	s.reaps = append(s.reaps, p.Limit)
	s.reaped = append(s.reaped, n)
	s.mu.Unlock()
	return n, err
}

// logBuffer collects JSON log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// String returns everything logged so far.
func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// lines returns the logged lines whose message contains msg.
func (l *logBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(l.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if s, _ := m["msg"].(string); strings.Contains(s, msg) {
			out = append(out, m)
		}
	}
	return out
}

// requireNoRawKeys fails if any raw client key made by id reached the logs.
func (l *logBuffer) requireNoRawKeys(t *testing.T) {
	t.Helper()
	if s := l.String(); strings.Contains(s, "raw-client-key") {
		t.Fatalf("a raw idempotency key reached the logs:\n%s", s)
	}
}

// requireNoErrors fails if anything was logged at error level.
func (l *logBuffer) requireNoErrors(t *testing.T) {
	t.Helper()
	for _, m := range l.lines(t, "") {
		if m["level"] == "ERROR" {
			t.Fatalf("unexpected error log: %v", m)
		}
	}
}

// requireAttrs fails unless the log line m names rec and has the extra
// attributes want.
func requireAttrs(t *testing.T, m map[string]any, rec idemstore.Identity, want map[string]any) {
	t.Helper()
	base := map[string]any{"key_hash": keyHash(rec), "endpoint": rec.Endpoint, "scope": rec.Scope}
	for k, v := range want {
		base[k] = v
	}
	for k, v := range base {
		if fmt.Sprint(m[k]) != fmt.Sprint(v) {
			t.Fatalf("log line %v: %s = %v, want %v", m, k, m[k], v)
		}
	}
}
