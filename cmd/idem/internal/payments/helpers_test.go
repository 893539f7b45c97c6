package payments

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idem-dev/idem/cmd/idem/internal/provider"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Tenants and tokens of the tests.
const (
	tenantA = "acme"
	tokenA  = "token-acme-0123456789"
	tenantB = "globex"
	tokenB  = "token-globex-0123456789"
)

// bundle is what every test gets.
type bundle struct {
	svc   *Service
	api   *httptest.Server
	prov  *provider.Server
	clock *idemtest.Clock
	ctx   context.Context
}

// stores runs f on SQLite and on PostgreSQL (in a schema of its own).
func stores(t *testing.T, f func(t *testing.T, store string)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, "sqlite:"+filepath.Join(t.TempDir(), "payments.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, postgresStore(t))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		f(t, mysqlStore(t))
	})
}

// mysqlStore returns a store URL naming a new database on the test MySQL
// server, dropped when the test ends.
func mysqlStore(t *testing.T) string {
	t.Helper()
	raw := testenv.MySQLURL(t)
	admin, err := sql.Open("mysql", testenv.MySQLDSN(t, raw, ""))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	name := "payments_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		admin.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("dropping database: %v", err)
		}
	})
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// postgresStore returns a store URL with a new schema, dropped when the
// test ends.
func postgresStore(t *testing.T) string {
	t.Helper()
	raw := testenv.PostgresURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	schema := "payments_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, raw)
		if err != nil {
			t.Errorf("dropping schema: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema: %v", err)
		}
	})
	sep := "?"
	if strings.Contains(raw, "?") {
		sep = "&"
	}
	return raw + sep + "schema=" + schema
}

// setup starts a provider and the service on store; edit changes the
// service's Config before it starts. The relays and the reconciler are not
// started: tests drive them with RelayOnce and ReconcileOnce.
func setup(t *testing.T, store string, faults provider.Faults, edit func(*Config)) *bundle {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	prov, err := provider.Listen("127.0.0.1:0", &provider.Config{
		Store:  "sqlite:" + filepath.Join(t.TempDir(), "provider.db"),
		Faults: faults,
		Rand:   mrand.New(mrand.NewPCG(1, 2)),
		Logger: logger,
	})
	if err != nil {
		t.Fatalf("provider.Listen: %v", err)
	}
	t.Cleanup(func() {
		if err := prov.Close(); err != nil {
			t.Errorf("closing the provider: %v", err)
		}
	})
	clock := idemtest.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	cfg := &Config{
		Store:          store,
		Tokens:         map[string]string{tenantA: tokenA, tenantB: tokenB},
		ProviderURL:    prov.URL(),
		HTTPClient:     &http.Client{Transport: tr},
		MaxAttempts:    3,
		BackoffBase:    time.Second,
		BackoffMax:     4 * time.Second,
		DeliverTimeout: 5 * time.Second,
		SettleAfter:    time.Minute,
		Rand:           mrand.New(mrand.NewPCG(3, 4)),
		Logger:         logger,
		Now:            clock.Now,
	}
	if edit != nil {
		edit(cfg)
	}
	ctx := context.Background()
	svc, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	api := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		api.Close()
		if err := svc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &bundle{svc: svc, api: api, prov: prov, clock: clock, ctx: ctx}
}

// answer is a response with its body read.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// problemCode returns the code of a problem answer, failing the test on any
// other answer.
func (a *answer) problemCode(t *testing.T) string {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %s", ct, a.body)
	}
	var p struct {
		Code   string `json:"code"`
		Status int    `json:"status"`
		Type   string `json:"type"`
	}
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatalf("decoding the problem: %v; body %s", err, a.body)
	}
	if p.Status != a.status || p.Type != problemTypeBase+p.Code {
		t.Errorf("problem %s does not match its status %d", a.body, a.status)
	}
	return p.Code
}

// payment decodes a payment answer.
func (a *answer) payment(t *testing.T) *Payment {
	t.Helper()
	var p Payment
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatalf("decoding the payment: %v; body %s", err, a.body)
	}
	return &p
}

// do sends a request to the API. token and key are left out when empty.
func (b *bundle) do(t *testing.T, method, path, token, key, contentType string, body []byte) *answer {
	t.Helper()
	req, err := http.NewRequestWithContext(b.ctx, method, b.api.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := b.api.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading: %v", method, path, err)
	}
	return &answer{status: resp.StatusCode, header: resp.Header, body: data}
}

// create posts a payment as tenant A.
func (b *bundle) create(t *testing.T, key, body string) *answer {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/payments", tokenA, key, "application/json", []byte(body))
}

// mustCreate creates a payment of tenant A and returns it.
func (b *bundle) mustCreate(t *testing.T, key string, amount int) *Payment {
	t.Helper()
	a := b.create(t, key, `{"customer_id":"cus_1","amount_cents":`+strconv.Itoa(amount)+`,"currency":"EUR"}`)
	if a.status != http.StatusCreated {
		t.Fatalf("create: status %d, body %s", a.status, a.body)
	}
	return a.payment(t)
}

// status returns the payment's status as tenant A sees it.
func (b *bundle) status(t *testing.T, id string) *Payment {
	t.Helper()
	a := b.do(t, http.MethodGet, "/v1/payments/"+id, tokenA, "", "", nil)
	if a.status != http.StatusOK {
		t.Fatalf("GET payment: status %d, body %s", a.status, a.body)
	}
	return a.payment(t)
}

// relayOnce runs one relay pass and checks how many rows it attempted.
func (b *bundle) relayOnce(t *testing.T, want int) {
	t.Helper()
	n, err := b.svc.RelayOnce(b.ctx)
	if err != nil {
		t.Fatalf("RelayOnce: %v", err)
	}
	if n != want {
		t.Fatalf("RelayOnce attempted %d rows, want %d", n, want)
	}
}

// charges returns the provider's ledger.
func (b *bundle) charges(t *testing.T) []provider.Charge {
	t.Helper()
	cs, err := b.prov.Charges(b.ctx)
	if err != nil {
		t.Fatalf("Charges: %v", err)
	}
	return cs
}

// count returns the number of rows of a table of the service's database.
func (b *bundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	var err error
	switch r := b.svc.db.repo.(type) {
	case *sqliteRepo:
		err = r.db.QueryRowContext(b.ctx, "SELECT COUNT(*) FROM "+table).Scan(&n)
	case *pgxRepo:
		err = r.pool.QueryRow(b.ctx, "SELECT COUNT(*) FROM "+r.schema+table).Scan(&n)
	case *mysqlRepo:
		err = r.db.QueryRowContext(b.ctx, "SELECT COUNT(*) FROM "+table).Scan(&n)
	}
	if err != nil {
		t.Fatalf("counting %s: %v", table, err)
	}
	return n
}

// truncate deletes every payment, outbox row and idempotency record.
func (b *bundle) truncate(t *testing.T) {
	t.Helper()
	for _, table := range []string{"payments", "idem_outbox", "idem_keys"} {
		var err error
		switch r := b.svc.db.repo.(type) {
		case *sqliteRepo:
			_, err = r.db.ExecContext(b.ctx, "DELETE FROM "+table)
		case *pgxRepo:
			_, err = r.pool.Exec(b.ctx, "DELETE FROM "+r.schema+table)
		case *mysqlRepo:
			_, err = r.db.ExecContext(b.ctx, "DELETE FROM "+table)
		}
		if err != nil {
			t.Fatalf("emptying %s: %v", table, err)
		}
	}
}
