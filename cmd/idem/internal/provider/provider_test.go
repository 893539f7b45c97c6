package provider

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idem-dev/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// bundle is what every test gets: a running provider and a client.
type bundle struct {
	srv    *Server
	client *http.Client
	ctx    context.Context
}

// setup starts a provider on store with cfg's other fields.
func setup(t *testing.T, store string, cfg Config) *bundle {
	t.Helper()
	cfg.Store = store
	if cfg.Rand == nil {
		cfg.Rand = mrand.New(mrand.NewPCG(1, 2))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	srv, err := Listen("127.0.0.1:0", &cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	tr := &http.Transport{}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &bundle{srv: srv, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}, ctx: context.Background()}
}

// sqliteStore returns a store URL for a new SQLite file.
func sqliteStore(t *testing.T) string {
	return "sqlite:" + filepath.Join(t.TempDir(), "provider.db")
}

// postgresStore returns a store URL for a new PostgreSQL schema, dropped
// when the test ends.
func postgresStore(t *testing.T) string {
	t.Helper()
	raw := testenv.PostgresURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	schema := "provider_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, raw)
		if err != nil {
			t.Errorf("connecting to drop %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// mysqlStore returns a store URL for a new MySQL database, dropped when
// the test ends.
func mysqlStore(t *testing.T) string {
	t.Helper()
	raw := testenv.MySQLURL(t)
	admin, err := sql.Open("mysql", testenv.MySQLDSN(t, raw, ""))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	name := "provider_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		admin.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name); err != nil {
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

// forEachStore runs f on a provider on SQLite, on PostgreSQL and on MySQL.
func forEachStore(t *testing.T, cfg Config, f func(t *testing.T, b *bundle)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, setup(t, sqliteStore(t), cfg))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, setup(t, postgresStore(t), cfg))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		f(t, setup(t, mysqlStore(t), cfg))
	})
}

// response is a read answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r *response) charge(t *testing.T) Charge {
	t.Helper()
	var c Charge
	if err := json.Unmarshal(r.body, &c); err != nil {
		t.Fatalf("decoding a charge from %s: %v", r.body, err)
	}
	return c
}

func (r *response) code(t *testing.T) string {
	t.Helper()
	var p struct{ Code string }
	json.Unmarshal(r.body, &p)
	return p.Code
}

// post sends POST /charges with key (none when empty) and body.
func (b *bundle) post(t *testing.T, client *http.Client, key, body string) (*response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.srv.URL()+"/charges", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: data}, nil
}

func (b *bundle) mustPost(t *testing.T, key, body string) *response {
	t.Helper()
	r, err := b.post(t, b.client, key, body)
	if err != nil {
		t.Fatalf("POST /charges: %v", err)
	}
	return r
}

func (b *bundle) get(t *testing.T, path string) *response {
	t.Helper()
	resp, err := b.client.Get(b.srv.URL() + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: data}
}

// ledger reads GET /charges.
func (b *bundle) ledger(t *testing.T) []Charge {
	t.Helper()
	r := b.get(t, "/charges")
	if r.status != http.StatusOK {
		t.Fatalf("GET /charges: %d %s", r.status, r.body)
	}
	var cs []Charge
	if err := json.Unmarshal(r.body, &cs); err != nil {
		t.Fatalf("decoding the ledger %s: %v", r.body, err)
	}
	if cs == nil {
		t.Fatalf("GET /charges answered %s, want a JSON array", r.body)
	}
	return cs
}

const body1250 = `{"amount_cents":1250,"currency":"EUR","reference":"order-1"}`

func TestChargeSameKeyTwice(t *testing.T) {
	t.Parallel()
	forEachStore(t, Config{}, func(t *testing.T, b *bundle) {
		first := b.mustPost(t, "key-1", body1250)
		if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("first POST: %d %v %s", first.status, first.header, first.body)
		}
		c := first.charge(t)
		if !strings.HasPrefix(c.ID, "ch_") || c.IdempotencyKey != "key-1" || c.AmountCents != 1250 ||
			c.Currency != "EUR" || c.Reference != "order-1" || c.CreatedAt.IsZero() {
			t.Errorf("charge %+v", c)
		}
		if loc := first.header.Get("Location"); loc != "/charges/"+c.ID {
			t.Errorf("Location %q", loc)
		}
		// Key order and spacing do not make another request.
		second := b.mustPost(t, "key-1", `{"reference":"order-1", "currency":"EUR", "amount_cents":1250}`)
		if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("second POST: %d %v %s", second.status, second.header, second.body)
		}
		if !bytes.Equal(second.body, first.body) {
			t.Errorf("replayed %s, want %s", second.body, first.body)
		}
		ledger := b.ledger(t)
		if len(ledger) != 1 || ledger[0].ID != c.ID {
			t.Errorf("ledger %+v, want the one charge", ledger)
		}
		if r := b.get(t, "/charges/"+c.ID); r.status != http.StatusOK || r.charge(t) != c {
			t.Errorf("GET /charges/%s: %d %s", c.ID, r.status, r.body)
		}
	})
}

func TestChargeDifferentKeys(t *testing.T) {
	t.Parallel()
	forEachStore(t, Config{}, func(t *testing.T, b *bundle) {
		a := b.mustPost(t, "key-a", body1250)
		c := b.mustPost(t, "key-b", `{"amount_cents":700,"currency":"USD","reference":"order-2"}`)
		if a.status != http.StatusCreated || c.status != http.StatusCreated {
			t.Fatalf("statuses %d, %d", a.status, c.status)
		}
		ledger := b.ledger(t)
		if len(ledger) != 2 || ledger[0].IdempotencyKey != "key-a" || ledger[0].AmountCents != 1250 ||
			ledger[1].IdempotencyKey != "key-b" || ledger[1].AmountCents != 700 {
			t.Errorf("ledger %+v", ledger)
		}
		// The ledger's JSON has the members SPEC section 8 names.
		raw := b.get(t, "/charges").body
		var members []map[string]any
		json.Unmarshal(raw, &members)
		for _, m := range members {
			for _, name := range []string{"id", "idempotency_key", "amount_cents", "currency", "reference", "created_at"} {
				if _, ok := m[name]; !ok {
					t.Errorf("a ledger entry lacks %q: %s", name, raw)
				}
			}
		}
		r := b.get(t, "/charges?idempotency_key=key-b")
		if r.status != http.StatusOK || r.charge(t).AmountCents != 700 {
			t.Errorf("lookup by key: %d %s", r.status, r.body)
		}
		for _, path := range []string{"/charges?idempotency_key=key-zzz", "/charges/ch_missing"} {
			if r := b.get(t, path); r.status != http.StatusNotFound || r.code(t) != "no-charge" {
				t.Errorf("GET %s: %d %s, want 404 no-charge", path, r.status, r.body)
			}
		}
	})
}

func TestChargeRejections(t *testing.T) {
	t.Parallel()
	b := setup(t, sqliteStore(t), Config{})
	if r := b.mustPost(t, "", body1250); r.status != http.StatusBadRequest || r.code(t) != "key-missing" {
		t.Errorf("no key: %d %s", r.status, r.body)
	}
	for _, body := range []string{
		`{"amount_cents":0,"currency":"EUR"}`,
		`{"amount_cents":-5,"currency":"EUR"}`,
		`{"amount_cents":1.5,"currency":"EUR"}`,
		`{"amount_cents":100,"currency":"eur"}`,
		`{"amount_cents":100,"currency":"EURO"}`,
		`{"amount_cents":100,"currency":"EUR","tip":1}`,
		`{"amount_cents":100,"currency":"EUR","reference":"` + strings.Repeat("r", 256) + `"}`,
		`{"amount_cents":100,"currency":"EUR"} {}`,
		`not json`,
	} {
		if r := b.mustPost(t, "key-fixed", body); r.status != http.StatusBadRequest || r.code(t) != "invalid-charge" {
			t.Errorf("%s: %d %s, want 400 invalid-charge", body, r.status, r.body)
		}
	}
	if n := len(b.ledger(t)); n != 0 {
		t.Fatalf("%d charges after rejected requests", n)
	}
	// A rejection kept nothing: the corrected request may reuse the key.
	if r := b.mustPost(t, "key-fixed", body1250); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("corrected request: %d %s", r.status, r.body)
	}
	// The same key with another charge is refused, and charges nothing.
	if r := b.mustPost(t, "key-fixed", `{"amount_cents":99999,"currency":"EUR"}`); r.status != http.StatusUnprocessableEntity || r.code(t) != "key-reused" {
		t.Errorf("reused key: %d %s", r.status, r.body)
	}
	if n := len(b.ledger(t)); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}

func TestFailRate(t *testing.T) {
	t.Parallel()
	forEachStore(t, Config{Faults: Faults{FailRate: 1}}, func(t *testing.T, b *bundle) {
		for range 3 {
			r := b.mustPost(t, "key-fail", body1250)
			if r.status != http.StatusServiceUnavailable || r.code(t) != "provider-unavailable" || r.header.Get("Retry-After") == "" {
				t.Fatalf("POST: %d %v %s, want 503", r.status, r.header, r.body)
			}
		}
		if n := len(b.ledger(t)); n != 0 {
			t.Fatalf("%d charges with fail rate 1", n)
		}
		if r := b.get(t, "/charges?idempotency_key=key-fail"); r.status != http.StatusNotFound {
			t.Errorf("lookup: %d %s", r.status, r.body)
		}
		// Nothing was kept for the key: once the provider recovers, the
		// retry charges (freshly, not replayed).
		if err := b.srv.SetFaults(Faults{}); err != nil {
			t.Fatal(err)
		}
		r := b.mustPost(t, "key-fail", body1250)
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("after recovery: %d %v %s", r.status, r.header, r.body)
		}
	})
}

func TestTimeoutRate(t *testing.T) {
	t.Parallel()
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprint("drop=", drop), func(t *testing.T) {
			t.Parallel()
			forEachStore(t, Config{Faults: Faults{TimeoutRate: 1, DropConnection: drop}}, func(t *testing.T, b *bundle) {
				impatient := &http.Client{Transport: &http.Transport{}, Timeout: 500 * time.Millisecond}
				defer impatient.CloseIdleConnections()
				r, err := b.post(t, impatient, "key-lost", body1250)
				if err == nil {
					t.Fatalf("POST answered %d %s; want no answer", r.status, r.body)
				}
				var netErr net.Error
				if !drop && !(errors.As(err, &netErr) && netErr.Timeout()) {
					t.Errorf("POST: %v, want a client timeout", err)
				}
				// The charge happened: reconciliation finds it by key.
				found := b.get(t, "/charges?idempotency_key=key-lost")
				if found.status != http.StatusOK {
					t.Fatalf("lookup after the lost answer: %d %s", found.status, found.body)
				}
				charged := found.charge(t)
				// A retry with the same key gets the charge, not a second one.
				if err := b.srv.SetFaults(Faults{}); err != nil {
					t.Fatal(err)
				}
				retry := b.mustPost(t, "key-lost", body1250)
				if retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "true" || retry.charge(t) != charged {
					t.Errorf("retry: %d %v %s, want the replayed charge %+v", retry.status, retry.header, retry.body, charged)
				}
				if ledger := b.ledger(t); len(ledger) != 1 {
					t.Errorf("ledger %+v, want one charge", ledger)
				}
			})
		})
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	const latency = 150 * time.Millisecond
	store := sqliteStore(t)
	b := setup(t, store, Config{Faults: Faults{Latency: latency}})
	start := time.Now()
	if r := b.mustPost(t, "key-slow", body1250); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	if took := time.Since(start); took < latency {
		t.Errorf("answered after %v, want at least %v", took, latency)
	}
	// A client that gives up during the latency is not charged.
	impatient := &http.Client{Transport: &http.Transport{}, Timeout: 20 * time.Millisecond}
	defer impatient.CloseIdleConnections()
	if _, err := b.post(t, impatient, "key-gave-up", body1250); err == nil {
		t.Fatal("the impatient client got an answer")
	}
	// Close waits for the abandoned request's handler; then read the ledger.
	if err := b.srv.Close(); err != nil {
		t.Fatal(err)
	}
	p, err := New(&Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	charges, err := p.Charges(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(charges) != 1 || charges[0].IdempotencyKey != "key-slow" {
		t.Errorf("ledger %+v, want only key-slow's charge", charges)
	}
	if _, ok, err := p.ChargeByKey(b.ctx, "key-gave-up"); ok || err != nil {
		t.Errorf("ChargeByKey(key-gave-up) = %v, %v; want no charge", ok, err)
	}
}

func TestFaultsDrawnPerRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, sqliteStore(t), Config{Faults: Faults{FailRate: 0.5}, Rand: mrand.New(mrand.NewPCG(7, 7))})
	failed := 0
	const n = 40
	for i := range n {
		r := b.mustPost(t, fmt.Sprint("key-", i), body1250)
		switch r.status {
		case http.StatusServiceUnavailable:
			failed++
		case http.StatusCreated:
		default:
			t.Fatalf("POST: %d %s", r.status, r.body)
		}
	}
	if failed == 0 || failed == n {
		t.Errorf("%d of %d requests failed at rate 0.5", failed, n)
	}
	if got := len(b.ledger(t)); got != n-failed {
		t.Errorf("%d charges, want %d (one per answered request)", got, n-failed)
	}
}

func TestFaultsValidate(t *testing.T) {
	t.Parallel()
	for _, f := range []Faults{{FailRate: -0.1}, {FailRate: 1.5}, {TimeoutRate: 2}, {Latency: -time.Second}} {
		if err := f.Validate(); err == nil {
			t.Errorf("%+v: valid", f)
		}
		if _, err := New(&Config{Store: sqliteStore(t), Faults: f}); err == nil {
			t.Errorf("New with %+v succeeded", f)
		}
	}
	if err := (Faults{FailRate: 1, TimeoutRate: 0.5, Latency: time.Second}).Validate(); err != nil {
		t.Error(err)
	}
	if _, err := New(&Config{Store: "redis://127.0.0.1:6379"}); err == nil {
		t.Error("New on a Redis URL succeeded: the ledger needs SQL")
	}
}

// TestConcurrentSameKey: many clients race with one key; one charge.
func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	forEachStore(t, Config{}, func(t *testing.T, b *bundle) {
		const n = 16
		var wg sync.WaitGroup
		statuses := make(chan int, n)
		for range n {
			wg.Go(func() {
				r, err := b.post(t, b.client, "key-race", body1250)
				if err != nil {
					t.Error(err)
					return
				}
				statuses <- r.status
			})
		}
		wg.Wait()
		close(statuses)
		created := 0
		for s := range statuses {
			switch s {
			case http.StatusCreated:
				created++
			case http.StatusConflict: // key-in-use while the first runs
			default:
				t.Errorf("status %d", s)
			}
		}
		if created == 0 {
			t.Error("no request got the charge")
		}
		if ledger := b.ledger(t); len(ledger) != 1 {
			t.Errorf("ledger %+v, want one charge", ledger)
		}
	})
}

// TestLedgerGuard: a key whose idempotency record is gone still finds its
// charge in the ledger, whose UNIQUE key is the second line of defence.
func TestLedgerGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, sqliteStore(t), Config{})
	l := b.srv.ledger.(*sqliteLedger)
	_, err := l.db.Exec(`INSERT INTO provider_charges (id, idempotency_key, amount_cents, currency, reference, created_at)
		VALUES ('ch_old', 'key-old', 1250, 'EUR', 'order-1', 0)`)
	if err != nil {
		t.Fatal(err)
	}
	r := b.mustPost(t, "key-old", body1250)
	if r.status != http.StatusOK || r.charge(t).ID != "ch_old" {
		t.Errorf("same charge: %d %s, want 200 with ch_old", r.status, r.body)
	}
	if r := b.mustPost(t, "key-old2", body1250); r.status != http.StatusCreated {
		t.Fatalf("another key: %d %s", r.status, r.body)
	}
	_, err = l.db.Exec(`INSERT INTO provider_charges (id, idempotency_key, amount_cents, currency, reference, created_at)
		VALUES ('ch_other', 'key-other', 500, 'EUR', '', 0)`)
	if err != nil {
		t.Fatal(err)
	}
	if r := b.mustPost(t, "key-other", body1250); r.status != http.StatusUnprocessableEntity || r.code(t) != "key-reused" {
		t.Errorf("another charge under a ledger key: %d %s", r.status, r.body)
	}
	if n := len(b.ledger(t)); n != 3 {
		t.Errorf("%d charges, want 3", n)
	}
}

// TestDurable: the ledger and the idempotency records survive a restart.
func TestDurable(t *testing.T) {
	t.Parallel()
	store := sqliteStore(t)
	cfg := &Config{Store: store, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	srv, err := Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{srv: srv, client: &http.Client{Transport: &http.Transport{}}, ctx: context.Background()}
	first := b.mustPost(t, "key-durable", body1250)
	if first.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", first.status, first.body)
	}
	b.client.CloseIdleConnections()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	b = setup(t, store, Config{})
	ledger := b.ledger(t)
	if len(ledger) != 1 || ledger[0] != first.charge(t) {
		t.Fatalf("ledger after reopening %+v, want %s", ledger, first.body)
	}
	retry := b.mustPost(t, "key-durable", body1250)
	if retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(retry.body, first.body) {
		t.Errorf("retry after reopening: %d %v %s", retry.status, retry.header, retry.body)
	}
	if n := len(b.ledger(t)); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}
