package cli

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// The --reconcile-* flags of both commands, from the command line and from
// the environment.
func TestParseReconcileFlags(t *testing.T) {
	t.Parallel()
	const tmpl = "https://api.example/orders/by-key/{key}?scope={scope}"
	auth := http.Header{"Authorization": {"Bearer s3cret"}}
	tests := []struct {
		name         string
		args         []string
		env          map[string]string
		wantHeader   http.Header
		wantTimeout  time.Duration
		wantInterval time.Duration
		wantWorkers  int
		wantGrace    *time.Duration // nil: not given
	}{
		{name: "flags", args: []string{"--reconcile-url", tmpl, "--reconcile-header", "authorization:Bearer s3cret",
			"--reconcile-timeout", "2s", "--reconcile-interval", "20s", "--reconcile-concurrency", "16", "--reconcile-grace", "90s"},
			wantHeader: auth, wantTimeout: 2 * time.Second, wantInterval: 20 * time.Second, wantWorkers: 16, wantGrace: ptr(90 * time.Second)},
		{name: "variables", env: map[string]string{"IDEM_RECONCILE_URL": tmpl, "IDEM_RECONCILE_HEADER": "Authorization: Bearer s3cret",
			"IDEM_RECONCILE_TIMEOUT": "2s", "IDEM_RECONCILE_INTERVAL": "20s", "IDEM_RECONCILE_CONCURRENCY": "16", "IDEM_RECONCILE_GRACE": "0"},
			wantHeader: auth, wantTimeout: 2 * time.Second, wantInterval: 20 * time.Second, wantWorkers: 16, wantGrace: ptr(time.Duration(0))},
		{name: "repeated header", args: []string{"--reconcile-url", tmpl, "--reconcile-header", "X-A: 1", "--reconcile-header", "x-a:  2 ",
			"--reconcile-header", "X-B: b c"}, wantHeader: http.Header{"X-A": {"1", "2"}, "X-B": {"b c"}}, wantTimeout: 5 * time.Second, wantInterval: 30 * time.Second},
		{name: "headers one a line in the variable", env: map[string]string{"IDEM_RECONCILE_URL": tmpl,
			"IDEM_RECONCILE_HEADER": "Authorization: Bearer s3cret\r\n\nX-Tenant: t1\n"},
			wantHeader: http.Header{"Authorization": {"Bearer s3cret"}, "X-Tenant": {"t1"}}, wantTimeout: 5 * time.Second, wantInterval: 30 * time.Second},
		{name: "flag wins over variable", args: []string{"--reconcile-url", tmpl, "--reconcile-header", "Authorization: Bearer s3cret"},
			env:        map[string]string{"IDEM_RECONCILE_HEADER": "X-Other: 1", "IDEM_RECONCILE_TIMEOUT": "2s", "IDEM_RECONCILE_INTERVAL": "20s"},
			wantHeader: auth, wantTimeout: 2 * time.Second, wantInterval: 20 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.wantWorkers == 0 {
				tt.wantWorkers = 4 // the default
			}
			check := func(cmd string, o *reconcileOptions) {
				t.Helper()
				if o.url != tmpl || o.tmpl == nil || !reflect.DeepEqual(o.header.h, tt.wantHeader) ||
					o.timeout != tt.wantTimeout || o.interval != tt.wantInterval || o.concurrency != tt.wantWorkers || !reflect.DeepEqual(o.grace, tt.wantGrace) {
					t.Errorf("%s: options = %+v; want the template, header %v, timeout %v, interval %v, concurrency %d, grace %v",
						cmd, *o, tt.wantHeader, tt.wantTimeout, tt.wantInterval, tt.wantWorkers, tt.wantGrace)
				}
			}
			m, err := parseMaintain(tt.args, newTestEnv(tt.env).env)
			if err != nil {
				t.Fatalf("maintain: %v", err)
			}
			check("maintain", &m.reconcile)
			p, err := parseProxy(append([]string{"--upstream", "http://u", "--maintain"}, tt.args...), newTestEnv(tt.env).env)
			if err != nil {
				t.Fatalf("proxy: %v", err)
			}
			check("proxy", &p.reconcile)
		})
	}
}

func TestParseReconcileFlagsRefuses(t *testing.T) {
	t.Parallel()
	const tmpl = "http://h/{key}"
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{name: "no key", args: []string{"--reconcile-url", "http://h/orders?token=SECRET"},
			wantErr: "--reconcile-url (or IDEM_RECONCILE_URL): no {key} placeholder"},
		{name: "unknown placeholder", args: []string{"--reconcile-url", "http://h/{key}?t=SECRET&id={id}"},
			wantErr: "unknown placeholder {id}: want {key}, {method}, {path} or {scope}"},
		{name: "not http", args: []string{"--reconcile-url", "ftp://h/{key}?t=SECRET"}, wantErr: "want an absolute http:// or https:// URL"},
		{name: "credentials", args: []string{"--reconcile-url", "http://u:SECRET@h/{key}"}, wantErr: "credentials in the URL are not supported"},
		{name: "placeholder in host", args: []string{"--reconcile-url", "http://{key}.h/?t=SECRET"}, wantErr: "in the path or the query only"},
		{name: "variable no key", env: map[string]string{"IDEM_RECONCILE_URL": "http://h/?t=SECRET"}, wantErr: "no {key} placeholder"},
		{name: "header without colon", args: []string{"--reconcile-url", tmpl, "--reconcile-header", "Bearer SECRET"},
			wantErr: "--reconcile-header (or IDEM_RECONCILE_HEADER): want 'NAME: VALUE' (the value is not shown)"},
		{name: "header bad name", args: []string{"--reconcile-url", tmpl, "--reconcile-header", "Auth orization: SECRET"},
			wantErr: "with a header name before the colon"},
		{name: "header empty name", args: []string{"--reconcile-url", tmpl, "--reconcile-header", ": SECRET"},
			wantErr: "with a header name before the colon"},
		{name: "header empty value", args: []string{"--reconcile-url", tmpl, "--reconcile-header", "Authorization:  "},
			wantErr: "header Authorization has no value"},
		{name: "header control character", args: []string{"--reconcile-url", tmpl, "--reconcile-header", "Authorization: SECRET\x00x"},
			wantErr: "header Authorization has a control character in its value (not shown)"},
		{name: "second header bad", args: []string{"--reconcile-url", tmpl, "--reconcile-header", "A: 1", "--reconcile-header", "SECRET"},
			wantErr: "want 'NAME: VALUE'"},
		{name: "bad header in variable", args: []string{"--reconcile-url", tmpl}, env: map[string]string{"IDEM_RECONCILE_HEADER": "A: 1\nSECRET"},
			wantErr: "--reconcile-header (or IDEM_RECONCILE_HEADER): want 'NAME: VALUE'"},
		{name: "header without url", args: []string{"--reconcile-header", "Authorization: SECRET"}, wantErr: "--reconcile-header needs --reconcile-url"},
		{name: "timeout zero", args: []string{"--reconcile-url", tmpl, "--reconcile-timeout", "0"}, wantErr: "want a positive duration"},
		{name: "interval not a duration", args: []string{"--reconcile-url", tmpl, "--reconcile-interval", "30"}, wantErr: "want a Go duration"},
		{name: "concurrency zero", args: []string{"--reconcile-url", tmpl, "--reconcile-concurrency", "0"},
			wantErr: "--reconcile-concurrency must be at least 1"},
		{name: "concurrency not a number", args: []string{"--reconcile-url", tmpl}, env: map[string]string{"IDEM_RECONCILE_CONCURRENCY": "many"},
			wantErr: "want a number"},
		{name: "grace negative", args: []string{"--reconcile-url", tmpl, "--reconcile-grace", "-1s"}, wantErr: "want a positive duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			check := func(cmd string, err error) {
				t.Helper()
				var uerr usageError
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.As(err, &uerr) {
					t.Errorf("%s: error = %v, want a usage error containing %q", cmd, err, tt.wantErr)
				}
				if err != nil && strings.Contains(err.Error(), "SECRET") {
					t.Errorf("%s: the error shows a credential: %v", cmd, err)
				}
			}
			_, err := parseMaintain(tt.args, newTestEnv(tt.env).env)
			check("maintain", err)
			_, err = parseProxy(append([]string{"--upstream", "http://u", "--maintain"}, tt.args...), newTestEnv(tt.env).env)
			check("proxy", err)
		})
	}
}

// A proxy whose keys are scoped refuses a lookup template without {scope}:
// it would settle one tenant's key with another's answer. The operator may
// say the upstream's keys are global.
func TestProxyReconcileKeepsTheScope(t *testing.T) {
	t.Parallel()
	scoped := []string{"--upstream", "http://u", "--maintain", "--scope-header", "X-Tenant"}
	_, err := parseProxy(append(scoped, "--reconcile-url", "http://h/orders/{key}?token=SECRET"), newTestEnv(nil).env)
	var uerr usageError
	if err == nil || !errors.As(err, &uerr) || !strings.Contains(err.Error(),
		"--reconcile-url has no {scope} while --scope-header scopes the keys") || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("error = %v, want a usage error naming the missing {scope}, without the template", err)
	}
	for name, args := range map[string][]string{
		"flag":     {"--reconcile-url", "http://h/orders/{key}", "--reconcile-unscoped"},
		"variable": {"--reconcile-url", "http://h/orders/{key}"},
	} {
		o, err := parseProxy(append(scoped, args...), newTestEnv(map[string]string{"IDEM_RECONCILE_UNSCOPED": "true"}).env)
		if err != nil || !o.reconcile.unscoped {
			t.Errorf("%s: %+v, %v; want the unscoped lookup accepted", name, o, err)
		}
	}
	if o, err := parseProxy(append(scoped, "--reconcile-url", "http://h/tenants/{scope}/orders/{key}"), newTestEnv(nil).env); err != nil ||
		o.reconcile.unscoped {
		t.Errorf("a template with {scope}: %+v, %v", o, err)
	}
	// Without --scope-header every key has the empty scope: nothing to keep.
	if _, err := parseProxy([]string{"--upstream", "http://u", "--maintain", "--reconcile-url", "http://h/orders/{key}"}, newTestEnv(nil).env); err != nil {
		t.Errorf("an unscoped proxy: %v", err)
	}
	for _, cmd := range []string{"maintain", "proxy"} {
		var err error
		if cmd == "maintain" {
			_, err = parseMaintain([]string{"--reconcile-unscoped"}, newTestEnv(nil).env)
		} else {
			_, err = parseProxy(append(scoped, "--reconcile-unscoped"), newTestEnv(nil).env)
		}
		if err == nil || !errors.As(err, &uerr) || !strings.Contains(err.Error(), "--reconcile-unscoped needs --reconcile-url") {
			t.Errorf("%s --reconcile-unscoped alone: %v, want a usage error", cmd, err)
		}
	}
}

// `idem proxy --scope-header --maintain --reconcile-url` with {scope}:
// tenants A and B each have an unknown order-42, and each is settled by the
// lookup of its own tenant (the scope is the hash the proxy stores).
func TestProxyMaintainReconcilesEachScope(t *testing.T) {
	t.Parallel()
	a, b := scopeOf("tenant-a"), scopeOf("tenant-b")
	lookup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/tenants/" + b + "/orders/by-key/order-42":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"order":"b-42"}`))
		case "/tenants/" + a + "/orders/by-key/order-42":
			w.WriteHeader(http.StatusNotFound)
		default:
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer lookup.Close()
	u := sqliteURL(t)
	store, closeStore, err := storeurl.Open(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	ids := []idemstore.Identity{{Scope: a, Endpoint: payments, Key: "order-42"}, {Scope: b, Endpoint: payments, Key: "order-42"}}
	for _, id := range ids {
		if _, err := store.KeyReserve(t.Context(), &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t",
			Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
			t.Fatal(err)
		}
	}
	_, e, stop := startProxy(t, "--upstream", "http://127.0.0.1:9", "--store", u, "--maintain", "--scope-header", "X-Tenant",
		"--reconcile-url", lookup.URL+"/tenants/{scope}/orders/by-key/{key}", "--reconcile-grace", "0")
	for _, id := range ids {
		if !e.stderr.waitFor(`msg="idemmaint: unknown outcome reconciled" key_hash=`+id.LogHash(), 20*time.Second) {
			t.Fatalf("the proxy's maintainer did not reconcile %s's record:\n%s", id.Scope, e.stderr)
		}
	}
	if code := stop(); code != ExitOK {
		t.Errorf("exit code = %d; stderr: %s", code, e.stderr)
	}
	if rec, err := store.KeyGet(t.Context(), ids[0]); err != nil || rec.State != idemstore.StateReleased {
		t.Errorf("tenant A: %+v, %v; want released (its order-42 never happened)", rec, err)
	}
	if rec, err := store.KeyGet(t.Context(), ids[1]); err != nil || rec.State != idemstore.StateCompleted || rec.Response == nil ||
		string(rec.Response.Body) != `{"order":"b-42"}` {
		t.Errorf("tenant B: %+v, %v; want completed with its own order", rec, err)
	}
}

// The maintainer's reconciler gets the flags: its concurrency, and a call
// timeout and a pass long enough for at least two rounds of lookups.
func TestReconcileOptionsApply(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args        []string
		concurrency int
		timeout     time.Duration
		pass        time.Duration
	}{
		{nil, 4, 5 * time.Second, 30 * time.Second},
		{[]string{"--reconcile-concurrency", "8", "--reconcile-timeout", "2s"}, 8, 2 * time.Second, 30 * time.Second},
		{[]string{"--reconcile-timeout", "40s"}, 4, 40 * time.Second, 80 * time.Second},
	} {
		e := newTestEnv(nil)
		o, err := parseMaintain(append([]string{"--reconcile-url", "http://h/{key}"}, tt.args...), e.env)
		if err != nil {
			t.Fatal(err)
		}
		cfg := maintainerConfig(e.env, 0, 0, 0)
		o.reconcile.apply(e.env, cfg, 1<<20, defaultGrace(0))
		if cfg.Reconcile == nil || cfg.ReconcileConcurrency != tt.concurrency || cfg.ReconcileTimeout != tt.timeout || cfg.PassTimeout != tt.pass {
			t.Errorf("%q: concurrency %d, timeout %v, pass %v; want %d, %v, %v", tt.args,
				cfg.ReconcileConcurrency, cfg.ReconcileTimeout, cfg.PassTimeout, tt.concurrency, tt.timeout, tt.pass)
		}
	}
}

// `idem maintain --once --reconcile-concurrency 4` asks about four records
// at once: the lookup answers only once four lookups are waiting together.
func TestMaintainOnceReconcilesConcurrently(t *testing.T) {
	t.Parallel()
	const concurrency, records = 4, 12
	var (
		mu      sync.Mutex
		waiting int
		peak    int
		full    = make(chan struct{})
	)
	lookup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		waiting++
		peak = max(peak, waiting)
		if waiting == concurrency {
			select {
			case <-full:
			default:
				close(full)
			}
		}
		mu.Unlock()
		defer func() { mu.Lock(); waiting--; mu.Unlock() }()
		select {
		case <-full:
			w.WriteHeader(http.StatusNotFound)
		case <-time.After(3 * time.Second):
			w.WriteHeader(http.StatusServiceUnavailable) // never four at once
		}
	}))
	defer lookup.Close()
	store := idemmem.New(nil)
	ctx := t.Context()
	for i := range records {
		id := idemstore.Identity{Endpoint: payments, Key: fmt.Sprintf("k-%02d", i)}
		if _, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t",
			Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
			t.Fatal(err)
		}
	}
	e := newTestEnv(map[string]string{"IDEM_RECONCILE_CONCURRENCY": "4"})
	if err := runMaintainIn(ctx, e, sharedOpener(store), "--once", "--store", "memory:", "--reconcile-url", lookup.URL+"/?k={key}", "--reconcile-grace", "0"); err != nil {
		t.Fatalf("idem maintain --once: %v\nstderr: %s", err, e.stderr)
	}
	if out := e.stdout.String(); !strings.Contains(out, fmt.Sprintf("Reconciled %d unknown records: 0 completed, %d released.", records, records)) {
		t.Errorf("stdout:\n%s\nstderr:\n%s", out, e.stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if peak != concurrency {
		t.Errorf("%d lookups at once at most, want %d", peak, concurrency)
	}
}

func ptr[T any](v T) *T { return &v }

// --reconcile-grace's default covers the longest time the upstream may
// still act on a request the proxy sent: the proxy's upstream timeout, and
// never less than the lease. 0 means none.
func TestReconcileGraceDefaults(t *testing.T) {
	t.Parallel()
	const tmpl = "http://h/{key}"
	for _, tt := range []struct {
		cmd  string
		args []string
		want time.Duration // the maintainer's Grace
	}{
		{"proxy", nil, time.Minute},
		{"proxy", []string{"--lease", "10s"}, time.Minute},
		{"proxy", []string{"--lease", "2m"}, 2 * time.Minute},
		{"proxy", []string{"--lease", "2m", "--reconcile-grace", "5s"}, 5 * time.Second},
		{"proxy", []string{"--reconcile-grace", "0"}, -1},
		{"maintain", nil, time.Minute},
		{"maintain", []string{"--reconcile-grace", "3m"}, 3 * time.Minute},
	} {
		e := newTestEnv(nil)
		cfg := maintainerConfig(e.env, 0, 0, 0)
		switch tt.cmd {
		case "proxy":
			o, err := parseProxy(append([]string{"--upstream", "http://u", "--maintain", "--reconcile-url", tmpl}, tt.args...), e.env)
			if err != nil {
				t.Fatal(err)
			}
			o.reconcile.apply(e.env, cfg, 1, defaultGrace(o.lease))
		case "maintain":
			o, err := parseMaintain(append([]string{"--reconcile-url", tmpl}, tt.args...), e.env)
			if err != nil {
				t.Fatal(err)
			}
			o.reconcile.apply(e.env, cfg, 1, defaultGrace(0))
		}
		if cfg.Grace != tt.want {
			t.Errorf("%s %v: Grace %v, want %v", tt.cmd, tt.args, cfg.Grace, tt.want)
		}
	}
}

// The proxy reconciles in its maintainer only.
func TestProxyReconcileNeedsMaintain(t *testing.T) {
	t.Parallel()
	_, err := parseProxy([]string{"--upstream", "http://u", "--reconcile-url", "http://h/{key}"}, newTestEnv(nil).env)
	var uerr usageError
	if err == nil || !errors.As(err, &uerr) || !strings.Contains(err.Error(), "--reconcile-url runs in the maintainer: add --maintain") {
		t.Errorf("error = %v, want a usage error asking for --maintain", err)
	}
	o, err := parseProxy([]string{"--upstream", "http://u", "--maintain"}, newTestEnv(nil).env)
	if err != nil || o.reconcile.tmpl != nil || o.reconcile.kind() != "none" {
		t.Errorf("--maintain alone: %+v, %v; want no reconciler", o, err)
	}
}

func TestParseHeaderLine(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ line, name, value string }{
		{"Authorization: Bearer abc", "Authorization", "Bearer abc"},
		{"x-api-key:abc", "X-Api-Key", "abc"},
		{"X-A: \t a:b:c \t", "X-A", "a:b:c"},
		{"X-A: é", "X-A", "é"},
	} {
		name, value, err := parseHeaderLine(tt.line)
		if err != nil || name != tt.name || value != tt.value {
			t.Errorf("parseHeaderLine(%q) = %q, %q, %v; want %q, %q", tt.line, name, value, err, tt.name, tt.value)
		}
	}
	for _, line := range []string{"", "abc", ":v", " X: v", "X :v", "X(1): v", "X:", "X: \t", "X: a\x7fb", "X: a\nb"} {
		if name, value, err := parseHeaderLine(line); err == nil {
			t.Errorf("parseHeaderLine(%q) = %q, %q; want an error", line, name, value)
		}
	}
}

// `idem maintain --once --reconcile-url` settles unknown records from the
// lookup's answers and says so; the credential never reaches its output.
func TestMaintainOnceReconciles(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		auth []string
	)
	lookup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock() // the lookups of a pass run concurrently (--reconcile-concurrency)
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		switch r.URL.Query().Get("k") {
		case "k/applied":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"id":"pay_1"}`))
		case "k/missing":
			w.WriteHeader(http.StatusNotFound)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer lookup.Close()
	store := idemmem.New(nil)
	ctx := t.Context()
	ids := map[string]idemstore.Identity{}
	for _, k := range []string{"k/applied", "k/missing", "k/unsure"} {
		id := idemstore.Identity{Scope: "acme", Endpoint: payments, Key: k}
		ids[k] = id
		if _, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t",
			Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
			t.Fatal(err)
		}
	}
	e := newTestEnv(map[string]string{"IDEM_RECONCILE_HEADER": "Authorization: Bearer s3cret"})
	if err := runMaintainIn(ctx, e, sharedOpener(store), "--once", "--store", "memory:",
		"--reconcile-url", lookup.URL+"/lookup?k={key}&m={method}&s={scope}",
		"--reconcile-grace", "0"); err != nil { // the leases ended at once, nothing was sent
		t.Fatalf("idem maintain --once: %v\nstderr: %s", err, e.stderr)
	}
	out := e.stdout.String()
	for _, want := range []string{"Swept 3 expired leases", "Reconciled 2 unknown records: 1 completed, 1 released.\n", "1 unknown records await"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	for k, want := range map[string]idemstore.State{"k/applied": idemstore.StateCompleted, "k/missing": idemstore.StateReleased, "k/unsure": idemstore.StateUnknown} {
		rec, err := store.KeyGet(ctx, ids[k])
		if err != nil || rec.State != want {
			t.Errorf("%s: %+v, %v; want %s", k, rec, err, want)
		}
	}
	mu.Lock()
	got := auth
	mu.Unlock()
	if !reflect.DeepEqual(got, []string{"Bearer s3cret", "Bearer s3cret", "Bearer s3cret"}) {
		t.Errorf("Authorization of the lookups = %q", got)
	}
	logs := e.stderr.String()
	if !strings.Contains(logs, `"the lookup answered 503 Service Unavailable"`) || !strings.Contains(logs, "key_hash="+ids["k/unsure"].LogHash()) {
		t.Errorf("the logs do not say why k/unsure is unresolved:\n%s", logs)
	}
	if strings.Contains(logs, "s3cret") || strings.Contains(logs, "k/") || strings.Contains(logs, "k%2F") {
		t.Errorf("the logs show the credential or a key:\n%s", logs)
	}
}

// `idem proxy --maintain --reconcile-url` settles an unknown record through
// its lookup.
func TestProxyMaintainReconciles(t *testing.T) {
	t.Parallel()
	lookup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/by-key/k%2F1" && r.URL.RawPath != "/by-key/k%2F1" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusGone)
	}))
	defer lookup.Close()
	u := sqliteURL(t)
	store, closeStore, err := storeurl.Open(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	id := idemstore.Identity{Endpoint: payments, Key: "k/1"}
	if _, err := store.KeyReserve(t.Context(), &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t",
		Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
		t.Fatal(err)
	}
	_, e, stop := startProxy(t, "--upstream", "http://127.0.0.1:9", "--store", u, "--maintain",
		"--reconcile-url", lookup.URL+"/by-key/{key}", "--reconcile-header", "X-Api-Key: s3cret",
		"--reconcile-grace", "0") // the lease ended at once, nothing was sent
	if !e.stderr.waitFor(`msg="idemmaint: unknown outcome reconciled" key_hash=`+id.LogHash(), 20*time.Second) {
		t.Fatalf("the proxy's maintainer did not reconcile the record:\n%s", e.stderr)
	}
	if code := stop(); code != ExitOK {
		t.Errorf("exit code = %d; stderr: %s", code, e.stderr)
	}
	logs := e.stderr.String()
	if !strings.Contains(logs, `msg="reconciling unknown records" lookup=`+lookup.URL+" headers=X-Api-Key timeout=5s interval=30s") {
		t.Errorf("the start log does not describe the reconciler:\n%s", logs)
	}
	if strings.Contains(logs, "s3cret") {
		t.Errorf("the logs show the credential:\n%s", logs)
	}
	if rec, err := store.KeyGet(t.Context(), id); err != nil || rec.State != idemstore.StateReleased {
		t.Errorf("record = %+v, %v; want released", rec, err)
	}
}
