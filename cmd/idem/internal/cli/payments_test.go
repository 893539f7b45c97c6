package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	paysvc "github.com/idem-dev/idem/cmd/idem/internal/payments"
	"github.com/idem-dev/idem/cmd/idem/internal/provider"
)

const (
	payToken      = "acme-token-0123456789"
	payOtherToken = "globex-token-0123456789"
)

func TestProviderStoreBeside(t *testing.T) {
	t.Parallel()
	for store, want := range map[string]string{
		"sqlite:./idem.db": "sqlite:./idem-provider.db",
		"sqlite:/var/lib/pay/main.sqlite?synchronous=NORMAL": "sqlite:/var/lib/pay/main-provider.sqlite?synchronous=NORMAL",
		"sqlite:data":                          "sqlite:data-provider.db",
		"postgres://u@db:5432/pay?schema=shop": "postgres://u@db:5432/pay?schema=shop_provider",
		"postgres://u@db:5432/pay":             "postgres://u@db:5432/pay?schema=idem_provider",
	} {
		got, err := providerStoreBeside(store)
		if err != nil || got != want {
			t.Errorf("providerStoreBeside(%q) = %q, %v; want %q", store, got, err, want)
		}
	}
	o, err := parsePayments([]string{"--store", "sqlite:/tmp/x/pay.db", "--provider-store", "sqlite:/tmp/ledger.db"}, newTestEnv(nil).env)
	if err != nil || o.providerStore != "sqlite:/tmp/ledger.db" {
		t.Errorf("--provider-store given: %v %v", o, err)
	}
}

func TestParsePayments(t *testing.T) {
	t.Parallel()
	t.Run("defaults", func(t *testing.T) {
		o, err := parsePayments(nil, newTestEnv(nil).env)
		if err != nil {
			t.Fatal(err)
		}
		if o.listen != "127.0.0.1:8080" || o.providerListen != "127.0.0.1:8081" || o.store != "sqlite:./idem.db" ||
			o.providerStore != "sqlite:./idem-provider.db" || o.providerURL != nil || o.tokens != nil || !o.demo ||
			o.relayWorkers != 1 || o.maxAttempts != paysvc.DefaultMaxAttempts || o.crashAt != "" {
			t.Errorf("defaults %+v", o)
		}
	})
	t.Run("flags", func(t *testing.T) {
		o, err := parsePayments([]string{
			"--listen", ":9000", "--provider-listen", ":9001", "--store", "postgres://db/x?schema=pay",
			"--tokens", "acme=" + payToken + ", globex=" + payOtherToken,
			"--provider-fail-rate", "0.25", "--provider-timeout-rate", "1", "--provider-latency", "150ms",
			"--provider-url", "http://bank:8081", "--relay-workers", "4", "--relay-interval", "2s",
			"--reconcile-interval", "1m", "--max-attempts", "5", "--deliver-timeout", "3s", "--settle-after", "90s", "--demo=false",
		}, newTestEnv(nil).env)
		if err != nil {
			t.Fatal(err)
		}
		want := provider.Faults{FailRate: 0.25, TimeoutRate: 1, Latency: 150 * time.Millisecond}
		if o.listen != ":9000" || o.providerListen != ":9001" || o.store != "postgres://db/x?schema=pay" ||
			o.tokens["acme"] != payToken || o.tokens["globex"] != payOtherToken || len(o.tokens) != 2 ||
			o.faults != want || o.providerURL.String() != "http://bank:8081" || o.relayWorkers != 4 ||
			o.relayInterval != 2*time.Second || o.reconcileInterval != time.Minute || o.maxAttempts != 5 ||
			o.deliverTimeout != 3*time.Second || o.settleAfter != 90*time.Second || o.demo {
			t.Errorf("parsed %+v", o)
		}
	})
	t.Run("environment", func(t *testing.T) {
		e := newTestEnv(map[string]string{
			"IDEM_TOKENS":             "acme=" + payToken,
			"IDEM_STORE":              "sqlite:/tmp/p.db",
			"IDEM_PROVIDER_FAIL_RATE": "0.5",
			"IDEM_PAYMENTS_CRASH_AT":  "after_charge",
			"IDEM_PAYMENTS_LISTEN":    "127.0.0.1:0",
		})
		o, err := parsePayments([]string{"--listen", "127.0.0.1:7000"}, e.env)
		if err != nil {
			t.Fatal(err)
		}
		if o.tokens["acme"] != payToken || o.store != "sqlite:/tmp/p.db" || o.faults.FailRate != 0.5 ||
			o.crashAt != paysvc.CrashAfterCharge || o.listen != "127.0.0.1:7000" {
			t.Errorf("parsed %+v", o)
		}
	})
	t.Run("events", func(t *testing.T) {
		o, err := parsePayments(nil, newTestEnv(map[string]string{"IDEM_EVENTS": "amqp://guest:s3cret@mq:5672/?exchange=shop"}).env)
		if err != nil {
			t.Fatal(err)
		}
		tg, err := parseEventsURL(o.events)
		if err != nil || tg.kind != "amqp" || tg.exchange != "shop" || tg.dial.String() != "amqp://guest:s3cret@mq:5672/" {
			t.Errorf("IDEM_EVENTS: %q → %+v, %v", o.events, tg, err)
		}
		o, err = parsePayments([]string{"--events", "nats://127.0.0.1:4222"}, newTestEnv(nil).env)
		if err != nil {
			t.Fatal(err)
		}
		tg, err = parseEventsURL(o.events)
		if err != nil || tg.kind != "nats" || tg.subject != "payment.succeeded" || tg.stream != "PAYMENTS" || tg.dial.String() != "nats://127.0.0.1:4222" {
			t.Errorf("--events nats: %+v, %v", tg, err)
		}
	})
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"events scheme", []string{"--events", "kafka://broker:9092"}, nil},
		{"events without host", []string{"--events", "amqp:payments"}, nil},
		{"events env", nil, map[string]string{"IDEM_EVENTS": "http://guest:short-secret@broker/"}},
		{"tokens without a pair", []string{"--tokens", "acme"}, nil},
		{"short token", []string{"--tokens", "acme=short-secret"}, nil},
		{"bad tenant", []string{"--tokens", "a c=" + payToken}, nil},
		{"shared token", []string{"--tokens", "acme=" + payToken + ",globex=" + payToken}, nil},
		{"tenant twice", []string{"--tokens", "acme=" + payToken + ",acme=" + payOtherToken}, nil},
		{"rate over 1", []string{"--provider-fail-rate", "2"}, nil},
		{"negative rate", []string{"--provider-timeout-rate", "-0.1"}, nil},
		{"redis store", []string{"--store", "redis://localhost"}, nil},
		{"memory store", []string{"--store", "memory:"}, nil},
		{"zero workers", []string{"--relay-workers", "0"}, nil},
		{"provider url", []string{"--provider-url", "ftp://bank"}, nil},
		{"crash point", nil, map[string]string{"IDEM_PAYMENTS_CRASH_AT": "whenever"}},
		{"env rate", nil, map[string]string{"IDEM_PROVIDER_LATENCY": "soon"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parsePayments(tc.args, newTestEnv(tc.env).env)
			var uerr usageError
			if !errors.As(err, &uerr) {
				t.Fatalf("err = %v, want a usage error", err)
			}
			if strings.Contains(err.Error(), payToken) || strings.Contains(err.Error(), "short-secret") {
				t.Errorf("the error shows a token: %v", err)
			}
		})
	}
}

// payCommand runs an idem command that serves until stopped and returns the
// address it listens on.
func payCommand(t *testing.T, e *testEnv, args ...string) (string, func() int) {
	t.Helper()
	addrc := make(chan net.Addr, 1)
	e.listening = func(a net.Addr) { addrc <- a }
	ctx, cancel := context.WithCancel(context.Background())
	codec := make(chan int, 1)
	go func() { codec <- run(ctx, args, e.env) }()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case code := <-codec:
		cancel()
		t.Fatalf("idem %s exited %d at start: %s", args[0], code, e.stderr)
	}
	stopped := false
	stop := func() int {
		stopped = true
		cancel()
		select {
		case code := <-codec:
			return code
		case <-time.After(20 * time.Second):
			t.Fatalf("idem %s did not stop within 20s", args[0])
			return -1
		}
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	return "http://" + addr.String(), stop
}

// payArgs are the arguments of an `idem payments` on files of the test.
func payArgs(t *testing.T, more ...string) []string {
	dir := t.TempDir()
	return append([]string{"payments", "--listen", "127.0.0.1:0", "--provider-listen", "127.0.0.1:0",
		"--store", "sqlite:" + filepath.Join(dir, "payments.db"),
		"--provider-store", "sqlite:" + filepath.Join(dir, "provider.db")}, more...)
}

func postPayment(t *testing.T, base, token, key string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/payments",
		strings.NewReader(`{"customer_id":"cus_1","amount_cents":1999,"currency":"EUR"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// Without --tokens, a demo tenant is made, its token printed, and a retry
// shown being replayed.
func TestPaymentsDemo(t *testing.T) {
	t.Parallel()
	e := newTestEnv(nil)
	base, stop := payCommand(t, e, payArgs(t)...)
	// (The banner says "Idempotent-Replayed: true" too: wait for the demo.)
	if !e.stdout.waitFor("One payment, one charge", 10*time.Second) {
		t.Fatalf("no replay shown; stdout:\n%s\nstderr:\n%s", e.stdout, e.stderr)
	}
	out := e.stdout.String()
	for _, want := range []string{base + "/v1/payments", "/charges", "curl", "Idempotency-Key", `tenant    "demo", token demo_`} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	// The printed token works.
	_, rest, _ := strings.Cut(out, "token ")
	token, _, _ := strings.Cut(rest, " ")
	if resp, body := postPayment(t, base, token, "k1"); resp.StatusCode != http.StatusCreated {
		t.Errorf("POST with the printed token: %d %s", resp.StatusCode, body)
	}
	if code := stop(); code != ExitOK {
		t.Errorf("exit %d; stderr %s", code, e.stderr)
	}
}

// On SIGTERM the request in flight completes, then the relays stop and the
// command returns 0.
func TestPaymentsDrainsOnShutdown(t *testing.T) {
	t.Parallel()
	e := newTestEnv(nil)
	base, stop := payCommand(t, e, payArgs(t, "--tokens", "acme="+payToken)...)
	if strings.Contains(e.stdout.String(), payToken) {
		t.Error("the banner shows a token given with --tokens")
	}

	// The body is sent only once the handler reads it (Expect:
	// 100-continue): then the request is surely in flight.
	bodyR, bodyW := io.Pipe()
	reading := make(chan struct{})
	type result struct {
		status int
		body   string
		err    error
	}
	resc := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/payments", bodyR)
		req.Header.Set("Authorization", "Bearer "+payToken)
		req.Header.Set("Idempotency-Key", "drain-1")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Expect", "100-continue")
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			Got100Continue: func() { close(reading) },
		}))
		client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
		defer client.CloseIdleConnections()
		resp, err := client.Do(req)
		if err != nil {
			resc <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		resc <- result{resp.StatusCode, string(b), err}
	}()
	select {
	case <-reading:
	case r := <-resc:
		t.Fatalf("the request ended early: %+v", r)
	}
	codec := make(chan int, 1)
	go func() { codec <- stop() }()
	if !e.stderr.waitFor("shutting down", 10*time.Second) {
		t.Fatal("the server never started shutting down")
	}
	select {
	case code := <-codec:
		t.Fatalf("idem payments exited %d with a request in flight", code)
	default:
	}
	io.WriteString(bodyW, `{"customer_id":"cus_1","amount_cents":1999,"currency":"EUR"}`)
	bodyW.Close()
	r := <-resc
	if r.err != nil || r.status != http.StatusCreated || !strings.Contains(r.body, `"status":"pending"`) {
		t.Errorf("in-flight request = %d %q %v, want 201 with a pending payment", r.status, r.body, r.err)
	}
	if code := <-codec; code != ExitOK {
		t.Errorf("exit %d, want 0; stderr: %s", code, e.stderr)
	}
	if !e.stderr.waitFor("stopped", time.Second) {
		t.Errorf("no stop logged: %s", e.stderr)
	}
}

// idem payments --provider-url charges an external provider, which idem
// provider runs alone.
func TestPaymentsWithExternalProvider(t *testing.T) {
	t.Parallel()
	pe := newTestEnv(nil)
	bank, stopBank := payCommand(t, pe, "provider", "--listen", "127.0.0.1:0",
		"--store", "sqlite:"+filepath.Join(t.TempDir(), "bank.db"))
	if !strings.Contains(pe.stdout.String(), bank+"/charges") {
		t.Errorf("idem provider printed %q, want its ledger URL", pe.stdout)
	}

	e := newTestEnv(nil)
	base, stop := payCommand(t, e, payArgs(t, "--tokens", "acme="+payToken, "--provider-url", bank, "--log-level", "debug")...)
	resp, body := postPayment(t, base, payToken, "external-1")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST: %d %s", resp.StatusCode, body)
	}
	if resp, _ := postPayment(t, base, payToken, "external-1"); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Error("the retry was not replayed")
	}
	if !e.stderr.waitFor("payments: payment succeeded", 10*time.Second) {
		t.Fatalf("the payment was never charged; stderr: %s", e.stderr)
	}
	ledger, err := http.Get(bank + "/charges")
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Body.Close()
	var charges []map[string]any
	if err := json.NewDecoder(ledger.Body).Decode(&charges); err != nil {
		t.Fatal(err)
	}
	if len(charges) != 1 || charges[0]["amount_cents"] != float64(1999) || charges[0]["idempotency_key"] == "" {
		t.Errorf("ledger %v, want one charge of 1999 with its key", charges)
	}
	if code := stop(); code != ExitOK {
		t.Errorf("payments exit %d; stderr %s", code, e.stderr)
	}
	if code := stopBank(); code != ExitOK {
		t.Errorf("provider exit %d; stderr %s", code, pe.stderr)
	}
}

func TestParseProvider(t *testing.T) {
	t.Parallel()
	o, err := parseProvider(nil, newTestEnv(nil).env)
	if err != nil || o.listen != "127.0.0.1:8081" || o.store != provider.DefaultStore || o.faults != (provider.Faults{}) {
		t.Errorf("defaults %+v, %v", o, err)
	}
	o, err = parseProvider([]string{"--fail-rate", "0.1", "--timeout-rate", "0.2", "--latency", "1s"},
		newTestEnv(map[string]string{"IDEM_PROVIDER_LISTEN": ":1234", "IDEM_STORE": "postgres://db/x"}).env)
	want := provider.Faults{FailRate: 0.1, TimeoutRate: 0.2, Latency: time.Second}
	if err != nil || o.listen != ":1234" || o.store != "postgres://db/x" || o.faults != want {
		t.Errorf("parsed %+v, %v", o, err)
	}
	for _, args := range [][]string{{"--fail-rate", "x"}, {"--store", "memory:"}, {"--latency", "-1s"}, {"extra"}} {
		var uerr usageError
		if _, err := parseProvider(args, newTestEnv(nil).env); !errors.As(err, &uerr) {
			t.Errorf("%v: err = %v, want a usage error", args, err)
		}
	}
}

// --ops-listen serves the middleware's decisions and the outbox depth of
// the service.
func TestPaymentsOps(t *testing.T) {
	t.Parallel()
	e := newTestEnv(nil)
	base, stop := payCommand(t, e, payArgs(t, "--tokens", "acme="+payToken, "--ops-listen", "127.0.0.1:0", "--reconcile-interval", "100ms")...)
	m := regexp.MustCompile(`ops_addr=(\S+)`).FindStringSubmatch(e.stderr.String())
	if m == nil {
		t.Fatalf("no ops address logged: %s", e.stderr)
	}
	if resp, body := postPayment(t, base, payToken, "ops-1"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST: %d %s", resp.StatusCode, body)
	}
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`idem_decisions_total{decision="created",endpoint="POST /v1/payments"`, "idem_outbox",
		`idem_payments_ledger_discrepancies{kind="no_payment"} 0`, `idem_payments_ledger_discrepancies{kind="payment_failed"} 0`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// A charge at the provider that no payment made: the ledger
	// reconciliation logs it and the metric counts it.
	pm := regexp.MustCompile(`provider\s+(http://\S+)`).FindStringSubmatch(e.stdout.String())
	if pm == nil {
		t.Fatalf("no provider address in the banner: %s", e.stdout)
	}
	req, _ := http.NewRequest(http.MethodPost, pm[1]+"/charges", strings.NewReader(`{"amount_cents":700,"currency":"EUR","reference":"pay_ghost"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "ghost-charge")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("charging the provider: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + m[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metrics, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(metrics), `idem_payments_ledger_discrepancies{kind="no_payment"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ghost charge was not counted in 30s:\n%s", metrics)
		}
		time.Sleep(50 * time.Millisecond) // the reconciler runs every 100ms
	}
	if !strings.Contains(e.stderr.String(), "the provider has a charge with no payment") {
		t.Errorf("the ghost charge was not logged: %s", e.stderr)
	}
	if code := stop(); code != ExitOK {
		t.Errorf("exit %d; stderr %s", code, e.stderr)
	}
}

// With --console-token the banner prints the console's URL and how to sign
// in, and / on the ops listener leads to it.
func TestPaymentsBannerShowsConsole(t *testing.T) {
	t.Parallel()
	e := newTestEnv(nil)
	consoleToken := strings.Repeat("c", 24)
	_, stop := payCommand(t, e, payArgs(t, "--tokens", "acme="+payToken, "--ops-listen", "127.0.0.1:0", "--console-token", consoleToken)...)
	if !e.stdout.waitFor("console", 10*time.Second) {
		t.Fatalf("no console line; stdout:\n%s", e.stdout)
	}
	out := e.stdout.String()
	m := regexp.MustCompile(`console   (http://\S+/_idem/) \(sign in with the --console-token value`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("banner lacks the console URL and sign-in hint:\n%s", out)
	}
	if strings.Contains(out, consoleToken) {
		t.Errorf("the banner shows the console token:\n%s", out)
	}
	if !regexp.MustCompile(`pid       \d+ `).MatchString(out) {
		t.Errorf("banner lacks the server's PID:\n%s", out)
	}
	root := strings.TrimSuffix(m[1], "/_idem/") + "/"
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(root)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/_idem/" {
		t.Errorf("GET /: %d Location %q, want 302 to /_idem/", resp.StatusCode, resp.Header.Get("Location"))
	}
	// The console samples its trends from the start: trends.json has the
	// current minute, with the outbox and the unknown backlog read.
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, m[1]+"trends.json", nil)
		req.Header.Set("Authorization", "Bearer "+consoleToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"outbox_depth"`) && strings.Contains(string(body), `"unknown_backlog": 0`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trends.json: %d %s", resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := stop(); code != ExitOK {
		t.Errorf("exit %d; stderr %s", code, e.stderr)
	}
}

// The demo token is kept in the database: a restart prints the same one,
// and the start-up demo pays only on a fresh database.
func TestPaymentsDemoTokenSurvivesRestart(t *testing.T) {
	t.Parallel()
	args := payArgs(t)
	tokenOf := func(out string) string {
		m := regexp.MustCompile(`token (demo_[0-9a-f]+) \(kept in the store`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no demo token in:\n%s", out)
		}
		return m[1]
	}
	e1 := newTestEnv(nil)
	_, stop := payCommand(t, e1, args...)
	if !e1.stdout.waitFor("One payment, one charge", 10*time.Second) {
		t.Fatalf("no demo on a fresh database:\n%s", e1.stdout)
	}
	if code := stop(); code != ExitOK {
		t.Fatalf("exit %d: %s", code, e1.stderr)
	}
	first := tokenOf(e1.stdout.String())

	e2 := newTestEnv(nil)
	base, stop := payCommand(t, e2, args...)
	if !e2.stdout.waitFor("idem payments is running.", 10*time.Second) {
		t.Fatalf("no banner:\n%s", e2.stdout)
	}
	if got := tokenOf(e2.stdout.String()); got != first {
		t.Errorf("the restart made token %s, want the first start's %s", got, first)
	}
	// The first start's demo made one payment; the restart makes none.
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/payments", nil)
	req.Header.Set("Authorization", "Bearer "+first)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := strings.Count(string(body), `"id":"pay_`); resp.StatusCode != http.StatusOK || n != 1 {
		t.Errorf("after a restart: %d, %d payments, want 1 (the first start's demo): %s", resp.StatusCode, n, body)
	}
	if code := stop(); code != ExitOK {
		t.Errorf("exit %d: %s", code, e2.stderr)
	}
	if strings.Contains(e2.stdout.String(), "A retry, replayed") {
		t.Errorf("the restart ran the demo again:\n%s", e2.stdout)
	}
}

// A store that cannot be opened is reported by the URL the user gave: the
// service's store comes first, before the in-process provider's ledger
// derived from it (a schema or a file the user never typed), and the dial
// failure is said once.
func TestPaymentsStoreErrorNamesTheGivenURL(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := filepath.Join(t.TempDir(), "missing")
	for _, tt := range []struct{ store, want, derived string }{
		{"postgres://pay:secret@" + addr + "/shop", "idem payments: opening the service: store postgres://pay:xxxxx@" + addr + "/shop: ", "idem_provider"},
		{"sqlite:" + filepath.Join(dir, "idem.db"), "idem payments: opening the service: ", "idem-provider.db"},
	} {
		e := newTestEnv(nil)
		code := run(t.Context(), []string{"payments", "--listen", "127.0.0.1:0", "--provider-listen", "127.0.0.1:0", "--store", tt.store}, e.env)
		got := e.stderr.String()
		if code != ExitError || !strings.HasPrefix(got, tt.want) {
			t.Errorf("%s: exit %d, stderr %q, want %d and a message starting %q", tt.store, code, got, ExitError, tt.want)
		}
		if strings.Contains(got, tt.derived) {
			t.Errorf("%s: the error leads with the provider's store %s:\n%s", tt.store, tt.derived, got)
		}
		if strings.Count(got, "connection refused") > 1 {
			t.Errorf("%s: the dial failure is said more than once:\n%s", tt.store, got)
		}
	}
}
