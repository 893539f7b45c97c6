package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/idemclient"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// The tenant and bearer token of the payments services of these tests.
const (
	payTenant = "t1"
	payToken  = "e2e-payments-token-0123456789"
)

// payEndpoint is the endpoint of the idempotency records of POST
// /v1/payments, which the provider key is derived from.
const payEndpoint = "POST /v1/payments"

// providerKeyOf returns the idempotency key the service sends to the
// provider for the payment made with the client's key: the key derived
// from the request's identity (idem.DerivedKeyFromContext(ctx, "charge")).
func providerKeyOf(clientKey string) string {
	return idem.DeriveKey(idemstore.Identity{Scope: payTenant, Endpoint: payEndpoint, Key: clientKey}, "charge")
}

// freeAddr returns a loopback address with a port that was free a moment
// ago. The services of these tests listen on a fixed port so that they can
// be restarted where their clients (and the service, for the provider)
// expect them.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// stop sends SIGTERM and waits for a clean exit: a planned restart.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("stopping %s: %v", p.name, err)
	}
	if err := p.wait(t, 30*time.Second); err != nil {
		t.Fatalf("%s ended with %v after SIGTERM", p.name, err)
	}
}

// bank is an `idem provider` process with a durable ledger, restartable on
// its address and store.
type bank struct {
	t     *testing.T
	addr  string
	store string
	n     int
	*proc
}

// startBank starts `idem provider` on a free port with its ledger in store
// and the given fault flags.
func startBank(t *testing.T, store string, faults ...string) *bank {
	t.Helper()
	b := &bank{t: t, addr: freeAddr(t), store: store}
	b.restart(faults...)
	return b
}

// restart starts the provider (again) on its address and ledger.
func (b *bank) restart(faults ...string) {
	b.t.Helper()
	b.n++
	cmd := exec.Command(idembin.Path(b.t), append([]string{"provider", "--listen", b.addr, "--store", b.store}, faults...)...)
	cmd.Env = idembin.Environ()
	b.proc = start(b.t, fmt.Sprintf("provider#%d", b.n), cmd)
}

// service is an `idem payments` process on an external provider,
// restartable on its address and store.
type service struct {
	t           *testing.T
	addr        string
	store       string
	providerURL string
	args        []string
	n           int
	*proc
}

// paymentsArgs are the workers' settings of the services of these tests:
// short intervals so that the charges and the reconciliation happen within
// a fraction of a second, and a short deadline for a charge, after which
// its outcome is unknown.
var paymentsArgs = []string{
	"--relay-interval", "50ms",
	"--reconcile-interval", "100ms",
	"--deliver-timeout", deliverTimeout.String(),
	"--lease", keyLease.String(),
}

// newService prepares an `idem payments` process on a free port; start it
// with restart.
func newService(t *testing.T, store, providerURL string, args ...string) *service {
	return &service{t: t, addr: freeAddr(t), store: store, providerURL: providerURL,
		args: append(append([]string(nil), paymentsArgs...), args...)}
}

// base returns the service's base URL, which does not change on restarts.
func (s *service) base() string { return "http://" + s.addr }

// restart starts the service (again) on its address and store. With
// crashAt set, the testing hook IDEM_PAYMENTS_CRASH_AT makes the process
// kill itself with SIGKILL at that point.
func (s *service) restart(crashAt string) {
	s.t.Helper()
	s.n++
	cmd := exec.Command(idembin.Path(s.t), append([]string{"payments",
		"--listen", s.addr, "--provider-url", s.providerURL, "--store", s.store,
		"--tokens", payTenant + "=" + payToken}, s.args...)...)
	cmd.Env = idembin.Environ()
	name := fmt.Sprintf("payments#%d", s.n)
	if crashAt != "" {
		cmd.Env = append(cmd.Env, "IDEM_PAYMENTS_CRASH_AT="+crashAt)
		name += "(crash at " + crashAt + ")"
	}
	s.proc = start(s.t, name, cmd)
}

// payment is a payment as GET /v1/payments/{id} shows it.
type payment struct {
	ID            string `json:"id"`
	Status        string `json:"status"`
	CustomerID    string `json:"customer_id"`
	AmountCents   int64  `json:"amount_cents"`
	Currency      string `json:"currency"`
	ChargeID      string `json:"charge_id"`
	FailureReason string `json:"failure_reason"`
}

// settled reports whether the payment reached a final state.
func (p *payment) settled() bool { return p.Status == "succeeded" || p.Status == "failed" }

// charge is a charge of the provider's ledger.
type charge struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key"`
	AmountCents    int64  `json:"amount_cents"`
	Currency       string `json:"currency"`
	Reference      string `json:"reference"`
}

// paymentBody is the JSON body of POST /v1/payments.
func paymentBody(customer string, amountCents int64) string {
	return fmt.Sprintf(`{"customer_id":%q,"amount_cents":%d,"currency":"EUR"}`, customer, amountCents)
}

// payHTTP is the plain HTTP client of the payments tests. Connections are
// not kept: the servers are killed under them.
var payHTTP = &http.Client{
	Timeout:   20 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// postPayment sends one POST /v1/payments, once, with the tenant's token.
func postPayment(ctx context.Context, base, key, body string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+payToken)
	req.Header.Set(idem.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := payHTTP.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: b, replayed: resp.Header.Get(idem.HeaderReplayed),
		retryAfter: resp.Header.Get("Retry-After"), code: idemclient.ProblemCode(&http.Response{
			Header: resp.Header, Body: io.NopCloser(bytes.NewReader(b))}), err: err}
}

// newPayClient returns the retrying client of a test: keyed requests are
// retried on connection errors (a killed service), 409 key-in-use (the
// lease of a killed attempt), 5xx and 429, for up to maxElapsed.
func newPayClient(t *testing.T, maxElapsed time.Duration) *idemclient.Client {
	c := idemclient.NewClient()
	c.HTTPClient = &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        200,
			MaxIdleConnsPerHost: 100,
			IdleConnTimeout:     5 * time.Second,
		},
	}
	c.RetryWaitMin = 20 * time.Millisecond
	c.RetryWaitMax = 500 * time.Millisecond
	c.RetryMax = 1 << 20 // bounded by MaxElapsed
	c.MaxElapsed = maxElapsed
	c.BareKey = true
	c.Logger = slog.New(slog.DiscardHandler)
	t.Cleanup(c.HTTPClient.CloseIdleConnections)
	return c
}

// created is the answer to a payment made through the retrying client.
type created struct {
	*payment
	// replayed: the answer was the stored one of an earlier execution.
	replayed bool
	// attempts is how many times the client sent the request.
	attempts int
}

// createPayment sends POST /v1/payments with key through c, retrying, and
// returns the payment of a 201 (or of a 200: the key's payment found past
// its record's retention).
func createPayment(ctx context.Context, c *idemclient.Client, base, key, body string) (created, error) {
	req, err := http.NewRequestWithContext(idemclient.WithKey(ctx, key), http.MethodPost, base+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return created{}, err
	}
	req.Header.Set("Authorization", "Bearer "+payToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return created{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return created{}, err
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return created{}, fmt.Errorf("POST /v1/payments: %s after %d attempts: %s", resp.Status, resp.Attempts, b)
	}
	var p payment
	if err := json.Unmarshal(b, &p); err != nil || p.ID == "" {
		return created{}, fmt.Errorf("POST /v1/payments: %s: unreadable payment %q: %v", resp.Status, b, err)
	}
	return created{payment: &p, replayed: resp.Replayed, attempts: resp.Attempts}, nil
}

// getJSON GETs url and decodes a 200 answer into v.
func getJSON(ctx context.Context, rawURL string, auth bool, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return 0, err
	}
	if auth {
		req.Header.Set("Authorization", "Bearer "+payToken)
	}
	resp, err := payHTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("GET %s: %d %s", rawURL, resp.StatusCode, b)
	}
	return resp.StatusCode, json.Unmarshal(b, v)
}

// ledger returns the provider's whole ledger, GET /charges.
func ledger(t *testing.T, providerURL string) []charge {
	t.Helper()
	var charges []charge
	if _, err := getJSON(t.Context(), providerURL+"/charges", false, &charges); err != nil {
		t.Fatalf("reading the ledger: %v", err)
	}
	return charges
}

// awaitSettled polls GET /v1/payments/{id} for every id until all are
// succeeded or failed, and fails the test at the deadline with the ones
// still open. It returns the settled payments by id.
func awaitSettled(t *testing.T, base string, ids []string, timeout time.Duration) map[string]*payment {
	t.Helper()
	deadline := time.Now().Add(timeout)
	settled := make(map[string]*payment, len(ids))
	open := append([]string(nil), ids...)
	for {
		var still []string
		var last string
		for _, id := range open {
			var p payment
			_, err := getJSON(t.Context(), base+"/v1/payments/"+url.PathEscape(id), true, &p)
			switch {
			case err != nil:
				last = err.Error()
				still = append(still, id)
			case p.settled():
				settled[id] = &p
			default:
				last = id + " is " + p.Status
				still = append(still, id)
			}
		}
		open = still
		if len(open) == 0 {
			return settled
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d payments not settled after %v (e.g. %s)", len(open), len(ids), timeout, last)
		}
		time.Sleep(50 * time.Millisecond) // the workers run on real time
	}
}

// listPayments returns every payment of the tenant, GET /v1/payments page
// by page.
func listPayments(t *testing.T, base string) []*payment {
	t.Helper()
	var all []*payment
	cursor := ""
	for {
		var page struct {
			Data       []*payment `json:"data"`
			HasMore    bool       `json:"has_more"`
			NextCursor string     `json:"next_cursor"`
		}
		u := base + "/v1/payments?limit=100"
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		if _, err := getJSON(t.Context(), u, true, &page); err != nil {
			t.Fatalf("listing payments: %v", err)
		}
		all = append(all, page.Data...)
		if !page.HasMore {
			return all
		}
		cursor = page.NextCursor
	}
}

// pgSchemaURL creates a fresh schema in the test database, dropped when
// the test ends, and returns a --store URL on it with a bounded pool.
func pgSchemaURL(t *testing.T, maxConns int) string {
	t.Helper()
	dsn := testenv.PostgresURL(t)
	p := testPool(t)
	schema := "idem_e2e_pay_" + randomHex(6)
	if _, err := p.Exec(t.Context(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("creating schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	q.Set("pool_max_conns", strconv.Itoa(maxConns))
	u.RawQuery = q.Encode()
	return u.String()
}

// mustUnmarshal decodes JSON or fails the test.
func mustUnmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %q: %v", b, err)
	}
}

// awaitListSettled polls GET /v1/payments until every payment of the
// tenant is succeeded or failed, and fails the test at the deadline with
// the count still open. It returns the payments by id, how long the wait
// took and its course: the open payments about every two seconds.
func awaitListSettled(t *testing.T, base string, timeout time.Duration) (map[string]*payment, time.Duration, string) {
	t.Helper()
	began := time.Now()
	deadline := began.Add(timeout)
	var course []string
	var lastMark time.Time
	for {
		all := listPayments(t, base)
		open := 0
		byStatus := make(map[string]int)
		for _, p := range all {
			byStatus[p.Status]++
			if !p.settled() {
				open++
			}
		}
		if time.Since(lastMark) >= 2*time.Second || open == 0 {
			lastMark = time.Now()
			course = append(course, fmt.Sprintf("%v:%d", time.Since(began).Round(100*time.Millisecond), open))
		}
		if open == 0 {
			m := make(map[string]*payment, len(all))
			for _, p := range all {
				if m[p.ID] != nil {
					t.Fatalf("payment %s is listed twice", p.ID)
				}
				m[p.ID] = p
			}
			return m, time.Since(began), strings.Join(course, " ")
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d payments not settled after %v: %v; open over time: %s", open, len(all), timeout, byStatus,
				strings.Join(course, " "))
		}
		time.Sleep(200 * time.Millisecond) // the workers run on real time
	}
}
