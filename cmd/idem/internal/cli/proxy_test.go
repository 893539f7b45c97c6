package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestParseProxy(t *testing.T) {
	t.Parallel()
	defaults := func() proxyOptions {
		return proxyOptions{
			listen:      "127.0.0.1:8090",
			store:       "sqlite:./idem-proxy.db",
			ttl:         24 * time.Hour,
			lease:       30 * time.Second,
			profile:     "ietf",
			methods:     []string{"POST", "PATCH"},
			maxBody:     1 << 20,
			maxResponse: 1 << 20,
			reconcile:   reconcileOptions{timeout: 5 * time.Second, interval: 30 * time.Second, concurrency: 4},
			guards:      safeguardOptions{bodyTimeout: 60 * time.Second},
			problemBase: "https://github.com/idem-dev/idem#problem-",
		}
	}
	up := "http://127.0.0.1:9000"
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(o *proxyOptions) // edits the defaults; upstream is checked apart
		wantUp  string
		wantErr string
	}{
		{name: "defaults", args: []string{"--upstream", up}, want: func(*proxyOptions) {}, wantUp: up},
		{name: "every flag",
			args: []string{"--upstream", "https://api.example/base?x=1", "--listen", ":9", "--store", "memory:",
				"--ttl", "1h", "--lease", "5s", "--wait", "2s", "--profile", "stripe", "--require-key",
				"--scope-header", "authorization", "--methods", "post,put, delete,POST", "--max-body", "10", "--max-response", "20"},
			want: func(o *proxyOptions) {
				o.listen, o.store, o.ttl, o.lease, o.wait = ":9", "memory:", time.Hour, 5*time.Second, 2*time.Second
				o.profile, o.requireKey, o.scopeHeader = "stripe", true, "Authorization"
				o.methods, o.maxBody, o.maxResponse = []string{"POST", "PUT", "DELETE"}, 10, 20
			},
			wantUp: "https://api.example/base?x=1"},
		{name: "every variable",
			env: map[string]string{"IDEM_UPSTREAM": up, "IDEM_PROXY_LISTEN": ":9", "IDEM_STORE": "redis://r:6379/0",
				"IDEM_TTL": "1h", "IDEM_LEASE": "5s", "IDEM_WAIT": "2s", "IDEM_PROFILE": "appstrate", "IDEM_REQUIRE_KEY": "true",
				"IDEM_SCOPE_HEADER": "x-tenant", "IDEM_METHODS": "PATCH", "IDEM_MAX_BODY": "10", "IDEM_MAX_RESPONSE": "20"},
			want: func(o *proxyOptions) {
				o.listen, o.store, o.ttl, o.lease, o.wait = ":9", "redis://r:6379/0", time.Hour, 5*time.Second, 2*time.Second
				o.profile, o.requireKey, o.scopeHeader = "appstrate", true, "X-Tenant"
				o.methods, o.maxBody, o.maxResponse = []string{"PATCH"}, 10, 20
			},
			wantUp: up},
		{name: "flag wins over variable",
			args:   []string{"--upstream", up, "--ttl", "2h", "--require-key=false", "--methods", "PUT"},
			env:    map[string]string{"IDEM_UPSTREAM": "http://other", "IDEM_TTL": "1h", "IDEM_REQUIRE_KEY": "1", "IDEM_METHODS": "DELETE"},
			want:   func(o *proxyOptions) { o.ttl, o.methods = 2*time.Hour, []string{"PUT"} },
			wantUp: up},
		{name: "empty variable is unset", args: []string{"--upstream", up}, env: map[string]string{"IDEM_TTL": "", "IDEM_STORE": ""},
			want: func(*proxyOptions) {}, wantUp: up},
		{name: "safeguards",
			args: []string{"--upstream", up, "--body-timeout", "5s", "--min-key-length", "16", "--max-in-progress-per-scope", "4",
				"--new-keys-per-second-per-scope", "2.5", "--metrics-tenant-label", "--async", "--problem-base-uri", "https://api.example/problems/"},
			want: func(o *proxyOptions) {
				o.guards = safeguardOptions{bodyTimeout: 5 * time.Second, minKeyLength: 16, maxInProgressPerScope: 4, newKeysPerSecond: 2.5, tenantLabel: true}
				o.async, o.problemBase = true, "https://api.example/problems/"
			},
			wantUp: up},
		{name: "safeguard variables",
			args: []string{"--upstream", up},
			env: map[string]string{"IDEM_BODY_TIMEOUT": "5s", "IDEM_MIN_KEY_LENGTH": "16", "IDEM_MAX_IN_PROGRESS_PER_SCOPE": "4",
				"IDEM_NEW_KEYS_PER_SECOND_PER_SCOPE": "2.5", "IDEM_METRICS_TENANT_LABEL": "true", "IDEM_ASYNC": "1", "IDEM_PROBLEM_BASE_URI": "urn:x:"},
			want: func(o *proxyOptions) {
				o.guards = safeguardOptions{bodyTimeout: 5 * time.Second, minKeyLength: 16, maxInProgressPerScope: 4, newKeysPerSecond: 2.5, tenantLabel: true}
				o.async, o.problemBase = true, "urn:x:"
			},
			wantUp: up},
		{name: "appstrate covers every write", args: []string{"--upstream", up, "--profile", "appstrate"},
			want: func(o *proxyOptions) { o.profile, o.methods = "appstrate", []string{"POST", "PUT", "PATCH", "DELETE"} }, wantUp: up},
		{name: "appstrate from the variable", args: []string{"--upstream", up}, env: map[string]string{"IDEM_PROFILE": "appstrate"},
			want: func(o *proxyOptions) { o.profile, o.methods = "appstrate", []string{"POST", "PUT", "PATCH", "DELETE"} }, wantUp: up},
		{name: "stripe keeps POST and PATCH", args: []string{"--upstream", up, "--profile", "stripe"},
			want: func(o *proxyOptions) { o.profile = "stripe" }, wantUp: up},
		{name: "wait zero", args: []string{"--upstream", up, "--wait", "0"}, want: func(*proxyOptions) {}, wantUp: up},
		{name: "postgres store", args: []string{"--upstream", up, "--store", "postgres://u:p@db/idem"},
			want: func(o *proxyOptions) { o.store = "postgres://u:p@db/idem" }, wantUp: up},

		{name: "upstream missing", wantErr: "--upstream (or IDEM_UPSTREAM) is required"},
		{name: "upstream not http", args: []string{"--upstream", "ftp://x"}, wantErr: "want an absolute http:// or https:// URL"},
		{name: "upstream relative", args: []string{"--upstream", "/api"}, wantErr: "want an absolute http:// or https:// URL"},
		{name: "upstream with credentials", args: []string{"--upstream", "http://u:p@api"}, wantErr: "credentials in the URL are not supported"},
		{name: "upstream variable not http", env: map[string]string{"IDEM_UPSTREAM": "localhost:9000"}, wantErr: "for IDEM_UPSTREAM"},
		{name: "ttl zero", args: []string{"--upstream", up, "--ttl", "0"}, wantErr: "want a positive duration"},
		{name: "lease negative", args: []string{"--upstream", up, "--lease=-1s"}, wantErr: "want a positive duration"},
		{name: "wait negative", args: []string{"--upstream", up, "--wait=-1s"}, wantErr: "want a positive duration"},
		{name: "ttl not a duration", args: []string{"--upstream", up, "--ttl", "3"}, wantErr: "want a Go duration"},
		{name: "profile unknown", args: []string{"--upstream", up, "--profile", "paypal"}, wantErr: "want one of ietf, stripe, appstrate"},
		{name: "methods empty item", args: []string{"--upstream", up, "--methods", "POST,,PUT"}, wantErr: `"" is not an HTTP method`},
		{name: "methods bad token", args: []string{"--upstream", up, "--methods", "PO ST"}, wantErr: `"PO ST" is not an HTTP method`},
		{name: "scope header bad", args: []string{"--upstream", up, "--scope-header", "X Tenant"}, wantErr: "is not a header name"},
		{name: "max body zero", args: []string{"--upstream", up, "--max-body", "0"}, wantErr: "want a positive number of bytes"},
		{name: "max response with unit", args: []string{"--upstream", up, "--max-response", "1MiB"}, wantErr: "want a positive number of bytes"},
		{name: "body timeout zero", args: []string{"--upstream", up, "--body-timeout", "0"}, wantErr: "want a positive duration"},
		{name: "min key length negative", args: []string{"--upstream", up, "--min-key-length=-1"}, wantErr: "want a number, 0 or more"},
		{name: "in progress not a number", args: []string{"--upstream", up, "--max-in-progress-per-scope", "many"}, wantErr: "want a number, 0 or more"},
		{name: "key rate negative", args: []string{"--upstream", up, "--new-keys-per-second-per-scope=-1"}, wantErr: "want a number, 0 or more"},
		{name: "key rate infinite", args: []string{"--upstream", up, "--new-keys-per-second-per-scope", "Inf"}, wantErr: "want a number, 0 or more"},
		{name: "problem base relative", args: []string{"--upstream", up, "--problem-base-uri", "/problems/"}, wantErr: "want a URI with a scheme"},
		{name: "store unknown", args: []string{"--upstream", up, "--store", "./idem.db"}, wantErr: "want sqlite:PATH, memory:"},

		// Every variable is read, and an invalid value names it.
		{name: "IDEM_LEASE invalid", args: []string{"--upstream", up}, env: map[string]string{"IDEM_LEASE": "x"}, wantErr: `invalid value "x" for IDEM_LEASE`},
		{name: "IDEM_WAIT invalid", args: []string{"--upstream", up}, env: map[string]string{"IDEM_WAIT": "x"}, wantErr: `invalid value "x" for IDEM_WAIT`},
		{name: "IDEM_STORE invalid", args: []string{"--upstream", up}, env: map[string]string{"IDEM_STORE": "x"}, wantErr: `invalid value "x" for IDEM_STORE`},
		{name: "IDEM_PROFILE invalid", args: []string{"--upstream", up}, env: map[string]string{"IDEM_PROFILE": "x"}, wantErr: `invalid value "x" for IDEM_PROFILE`},
		{name: "IDEM_REQUIRE_KEY invalid", args: []string{"--upstream", up}, env: map[string]string{"IDEM_REQUIRE_KEY": "yes"}, wantErr: `invalid value "yes" for IDEM_REQUIRE_KEY`},
		{name: "IDEM_SCOPE_HEADER invalid", args: []string{"--upstream", up}, env: map[string]string{"IDEM_SCOPE_HEADER": "a:b"}, wantErr: `invalid value "a:b" for IDEM_SCOPE_HEADER`},
		{name: "IDEM_METHODS invalid", args: []string{"--upstream", up}, env: map[string]string{"IDEM_METHODS": "a b"}, wantErr: `invalid value "a b" for IDEM_METHODS`},
		{name: "IDEM_MAX_BODY invalid", args: []string{"--upstream", up}, env: map[string]string{"IDEM_MAX_BODY": "-1"}, wantErr: `invalid value "-1" for IDEM_MAX_BODY`},
		{name: "IDEM_MAX_RESPONSE invalid", args: []string{"--upstream", up}, env: map[string]string{"IDEM_MAX_RESPONSE": "x"}, wantErr: `invalid value "x" for IDEM_MAX_RESPONSE`},
		{name: "invalid variable ignored under its flag", args: []string{"--upstream", up, "--ttl", "1h"}, env: map[string]string{"IDEM_TTL": "x"},
			want: func(o *proxyOptions) { o.ttl = time.Hour }, wantUp: up},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseProxy(tt.args, newTestEnv(tt.env).env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				var uerr usageError
				if !errors.As(err, &uerr) {
					t.Errorf("error %v is not a usage error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.upstream.String() != tt.wantUp {
				t.Errorf("upstream = %s, want %s", o.upstream, tt.wantUp)
			}
			want := defaults()
			tt.want(&want)
			got := *o
			got.upstream = nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("options =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

func TestProxyConfig(t *testing.T) {
	t.Parallel()
	e := newTestEnv(nil)
	o, err := parseProxy([]string{"--upstream", "http://u", "--ttl", "1h", "--lease", "5s", "--wait", "2s", "--profile", "stripe",
		"--require-key", "--methods", "PUT", "--max-body", "10", "--max-response", "20", "--scope-header", "X-Tenant"}, e.env)
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.config(e.env)
	if cfg.TTL != time.Hour || cfg.Lease != 5*time.Second || cfg.Wait != 2*time.Second || cfg.Profile != idem.ProfileStripe ||
		!cfg.RequireKey || !reflect.DeepEqual(cfg.Methods, []string{"PUT"}) || cfg.MaxBody != 10 || cfg.MaxResponse != 20 ||
		cfg.Logger != e.logger || cfg.Scope == nil {
		t.Errorf("config = %+v, does not carry the options", cfg)
	}
	o, err = parseProxy([]string{"--upstream", "http://u", "--body-timeout", "3s", "--min-key-length", "12", "--max-in-progress-per-scope", "4",
		"--new-keys-per-second-per-scope", "2.5", "--async", "--problem-base-uri", "urn:p:"}, e.env)
	if err != nil {
		t.Fatal(err)
	}
	cfg = o.config(e.env)
	if cfg.BodyTimeout != 3*time.Second || cfg.MinKeyLength != 12 || cfg.MaxInProgressPerScope != 4 || cfg.NewKeysPerSecondPerScope != 2.5 ||
		!cfg.Async || cfg.ProblemBaseURI != "urn:p:" {
		t.Errorf("config = %+v, does not carry the safeguards", cfg)
	}
	if o, _ := parseProxy([]string{"--upstream", "http://u"}, e.env); o.config(e.env).Scope != nil {
		t.Error("Scope is set without --scope-header; want the middleware's single empty scope")
	}
}

func TestScopeFromHeader(t *testing.T) {
	t.Parallel()
	hash := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	tests := []struct {
		name    string
		values  []string
		want    string
		wantErr bool
	}{
		{"one value", []string{"Bearer t-1"}, hash("Bearer t-1"), false},
		{"empty value", []string{""}, "", true},
		{"blank value", []string{" \t "}, "", true},
		{"blank field lines", []string{"", " "}, "", true},
		{"padded value", []string{" acme "}, hash(" acme "), false},
		{"field lines combined", []string{"tenant-1", "tenant-2"}, hash("tenant-1, tenant-2"), false},
		{"missing", nil, "", true},
	}
	scope := scopeFromHeader("Authorization")
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		for _, v := range tt.values {
			r.Header.Add("Authorization", v)
		}
		got, err := scope(r)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: scope = %q, %v; want %q, error %v", tt.name, got, err, tt.want, tt.wantErr)
		}
		for _, v := range tt.values {
			if v != "" && strings.Contains(got, v) {
				t.Errorf("%s: scope %q contains the header's value", tt.name, got)
			}
		}
	}
}

// A scope header sent empty or blank is a missing one: 401, upstream not
// called, rather than one key space shared by every client that sends it so.
func TestProxyBlankScopeHeaderIsUnauthorized(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	base, _, _ := startProxy(t, "--upstream", up.URL, "--store", "memory:", "--scope-header", "X-Api-Key")
	for _, v := range []string{"", " ", "\t"} {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", "k")
		req.Header["X-Api-Key"] = []string{v}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("X-Api-Key %q: answer %d %s, want 401 problem+json", v, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("upstream called %d times, want 0", n)
	}
}

// startProxy runs `idem proxy` in process on a free port with args, and
// returns its address, its environment and a function that stops it
// (cancels its context) and returns its exit code.
func startProxy(t *testing.T, args ...string) (string, *testEnv, func() int) {
	t.Helper()
	e := newTestEnv(nil)
	addrc := make(chan net.Addr, 1)
	e.listening = func(a net.Addr) { addrc <- a }
	ctx, cancel := context.WithCancel(context.Background())
	codec := make(chan int, 1)
	go func() { codec <- run(ctx, append([]string{"proxy", "--listen", "127.0.0.1:0"}, args...), e.env) }()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case code := <-codec:
		cancel()
		t.Fatalf("idem proxy exited %d at start: %s", code, e.stderr)
	}
	stopped := false
	stop := func() int {
		stopped = true
		cancel()
		select {
		case code := <-codec:
			return code
		case <-time.After(10 * time.Second):
			t.Fatal("idem proxy did not stop within 10s")
			return -1
		}
	}
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	return "http://" + addr.String(), e, stop
}

func TestProxyServes(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"tenant":"`+r.Header.Get("X-Tenant")+`"}`)
	}))
	defer up.Close()
	base, e, stop := startProxy(t, "--upstream", up.URL, "--store", "memory:", "--scope-header", "X-Tenant")

	post := func(key, tenant string) (*http.Response, string) {
		return postTo(t, base+"/v1/payments", key, tenant)
	}
	r1, b1 := post("k", "acme")
	r2, b2 := post("k", "acme")
	if r1.StatusCode != http.StatusCreated || r2.StatusCode != http.StatusCreated || b1 != b2 || b1 != `{"tenant":"acme"}` {
		t.Errorf("answers = %d %q, %d %q; want 201 twice with the same body", r1.StatusCode, b1, r2.StatusCode, b2)
	}
	if r2.Header.Get(idem.HeaderReplayed) != "true" {
		t.Error("second answer not replayed")
	}
	// The same key in another scope is another record.
	if r3, b3 := post("k", "globex"); r3.StatusCode != http.StatusCreated || r3.Header.Get(idem.HeaderReplayed) != "" || b3 != `{"tenant":"globex"}` {
		t.Errorf("other tenant's answer = %d %q replayed=%q; want its own execution", r3.StatusCode, b3, r3.Header.Get(idem.HeaderReplayed))
	}
	// Without the scope header: 401 problem+json, upstream not called.
	if r4, b4 := post("k", ""); r4.StatusCode != http.StatusUnauthorized || r4.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("answer without the scope header = %d %q", r4.StatusCode, b4)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("upstream called %d times, want 2", n)
	}
	// The endpoint is the path as sent: an escaped slash is another
	// resource, hence another record, not a replay.
	if r5, _ := postTo(t, base+"/v1/a%2Fb", "k2", "acme"); r5.StatusCode != http.StatusCreated || r5.Header.Get(idem.HeaderReplayed) != "" {
		t.Errorf("/v1/a%%2Fb = %d replayed=%q, want a fresh 201", r5.StatusCode, r5.Header.Get(idem.HeaderReplayed))
	}
	if r6, _ := postTo(t, base+"/v1/a/b", "k2", "acme"); r6.StatusCode != http.StatusCreated || r6.Header.Get(idem.HeaderReplayed) != "" {
		t.Errorf("/v1/a/b after /v1/a%%2Fb with the same key = %d replayed=%q, want a fresh 201", r6.StatusCode, r6.Header.Get(idem.HeaderReplayed))
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("upstream called %d times, want 4", n)
	}

	if code := stop(); code != ExitOK {
		t.Errorf("exit code = %d, want 0; stderr: %s", code, e.stderr)
	}
	logs := e.stderr.String()
	for _, want := range []string{"msg=listening", "store=memory", "upstream=" + up.URL, "scope_header=X-Tenant", `msg="shutting down"`, "msg=stopped"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "acme") {
		t.Errorf("logs leak a scope header value:\n%s", logs)
	}
	if !regexp.MustCompile(`addr=127\.0\.0\.1:\d+`).MatchString(logs) {
		t.Errorf("logs lack the bound address:\n%s", logs)
	}
}

// postTo posts a JSON body with an Idempotency-Key and, unless empty, an
// X-Tenant header.
func postTo(t *testing.T, url, key, tenant string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":1}`))
	req.Header.Set("Idempotency-Key", key)
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// On shutdown the request in flight completes before the command returns 0.
func TestProxyDrainsOnShutdown(t *testing.T) {
	t.Parallel()
	arrived, proceed := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-proceed
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "done")
	}))
	defer up.Close()
	base, e, stop := startProxy(t, "--upstream", up.URL, "--store", "memory:")

	type result struct {
		status int
		body   string
		err    error
	}
	resc := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/payments", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			resc <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		resc <- result{resp.StatusCode, string(body), err}
	}()
	<-arrived
	codec := make(chan int, 1)
	go func() { codec <- stop() }()
	// Release the upstream once the server is draining.
	if !e.stderr.waitFor("shutting down", 10*time.Second) {
		t.Fatal("the server never started shutting down")
	}
	select {
	case code := <-codec:
		t.Fatalf("idem proxy exited %d with a request in flight", code)
	default:
	}
	close(proceed)
	if r := <-resc; r.err != nil || r.status != http.StatusCreated || r.body != "done" {
		t.Errorf("in-flight request = %d %q %v, want 201 done", r.status, r.body, r.err)
	}
	if code := <-codec; code != ExitOK {
		t.Errorf("exit code = %d, want 0; stderr: %s", code, e.stderr)
	}
}

// The start log names the store without its password.
func TestProxyLogRedactsStorePassword(t *testing.T) {
	t.Parallel()
	base := testenv.PostgresURL(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts local connections, so the password is not
	// checked; it must still never be logged.
	u.User = url.UserPassword(u.User.Username(), "s3cret")
	schema := fmt.Sprintf("cli_test_%d", time.Now().UnixNano())
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

	_, e, stop := startProxy(t, "--upstream", "http://127.0.0.1:9", "--store", u.String())
	if code := stop(); code != ExitOK {
		t.Errorf("exit code = %d; stderr: %s", code, e.stderr)
	}
	logs := e.stderr.String()
	if strings.Contains(logs, "s3cret") {
		t.Errorf("logs leak the store password:\n%s", logs)
	}
	if !strings.Contains(logs, "store=postgres") || !strings.Contains(logs, ":xxxxx@") {
		t.Errorf("logs lack the redacted store URL:\n%s", logs)
	}
}

// The proxy's metrics never label a request by its raw path: by the route
// template it matches (--metrics-route), else by the method and
// --metrics-path-segments leading segments (none by default).
func TestProxyMetricsEndpoint(t *testing.T) {
	t.Parallel()
	label := func(args []string, vars map[string]string, method, path string) string {
		t.Helper()
		te := newTestEnv(vars)
		o, err := parseProxy(append([]string{"--upstream", "http://127.0.0.1:1"}, args...), te.env)
		if err != nil {
			t.Fatal(err)
		}
		return o.config(te.env).MetricsEndpoint(httptest.NewRequest(method, path, nil))
	}
	for _, tt := range []struct {
		args         []string
		vars         map[string]string
		method, path string
		want         string
	}{
		{nil, nil, "POST", "/v1/reset/SECRETPATHTOKEN", "POST /*"},
		{[]string{"--metrics-path-segments", "2"}, nil, "POST", "/v1/reset/SECRETPATHTOKEN", "POST /v1/reset/*"},
		{[]string{"--metrics-routes", "POST /v1/reset/{token}, /v1/orders/{id}/items"}, nil, "POST", "/v1/reset/SECRETPATHTOKEN", "POST /v1/reset/{token}"},
		{[]string{"--metrics-routes", "POST /v1/reset/{token}, /v1/orders/{id}/items"}, nil, "PATCH", "/v1/orders/o_1/items", "PATCH /v1/orders/{id}/items"},
		{[]string{"--metrics-routes", "POST /v1/reset/{token}", "--metrics-path-segments", "1"}, nil, "POST", "/v1/other/x", "POST /v1/*"},
		{nil, map[string]string{"IDEM_METRICS_ROUTES": "POST /v1/reset/{token}"}, "POST", "/v1/reset/T", "POST /v1/reset/{token}"},
	} {
		if got := label(tt.args, tt.vars, tt.method, tt.path); got != tt.want {
			t.Errorf("%v %v: %s %s is labelled %q, want %q", tt.args, tt.vars, tt.method, tt.path, got, tt.want)
		}
	}
	for _, bad := range []string{"POST /a/{x", "GET /a, GET /a"} {
		te := newTestEnv(nil)
		if code := run(t.Context(), []string{"proxy", "--upstream", "http://127.0.0.1:1", "--metrics-routes", bad}, te.env); code != ExitUsage {
			t.Errorf("--metrics-route %q: exit %d, want %d: %s", bad, code, ExitUsage, te.stderr)
		}
	}
}
