package cli

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmaint"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

func TestOpsMetricsAndConsole(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	token := strings.Repeat("s", 32)
	o, err := newOps(&opsOptions{consoleToken: token}, opsParts{Store: store, Maintainer: idemmaint.New(store, nil)})
	if err != nil {
		t.Fatal(err)
	}
	app := idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Metrics: o.Metrics}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for range 2 {
		r := httptest.NewRequest("POST", "/pay", nil)
		r.Header.Set("Idempotency-Key", "k1")
		app.ServeHTTP(httptest.NewRecorder(), r)
	}
	get := func(path, auth string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		w := httptest.NewRecorder()
		o.Handler.ServeHTTP(w, r)
		return w
	}
	w := get("/metrics", "")
	body, _ := io.ReadAll(w.Body)
	for _, want := range []string{`decision="created"`, `decision="replayed"`, "idem_unknown_backlog", "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if w := get("/_idem/", ""); w.Code != http.StatusUnauthorized {
		t.Fatalf("console without a token: %d", w.Code)
	}
	if w := get("/_idem/", token); w.Code != http.StatusOK {
		t.Fatalf("console with the token: %d", w.Code)
	}
	if w := get("/", ""); w.Code != http.StatusFound || w.Header().Get("Location") != "/_idem/" {
		t.Fatalf("GET /: %d Location %q, want 302 to /_idem/", w.Code, w.Header().Get("Location"))
	}
}

// idem_reconcile_left counts the due records the last reconciliation pass
// had no time to ask about.
func TestOpsReconcileLeft(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	for _, k := range []string{"k1", "k2", "k3"} {
		if _, err := store.KeyReserve(t.Context(), &idemstore.ReserveParams{Identity: idemstore.Identity{Endpoint: payments, Key: k},
			Fingerprint: "f", Token: "t", Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
			t.Fatal(err)
		}
	}
	slow := func(ctx context.Context, _ *idemstore.Record) (idemmaint.Resolution, error) {
		<-ctx.Done()
		return idemmaint.Resolution{}, ctx.Err()
	}
	// Time for one lookup of 200ms in a pass of 400ms.
	m := idemmaint.New(store, &idemmaint.Config{Reconcile: slow, ReconcileTimeout: 200 * time.Millisecond, PassTimeout: 400 * time.Millisecond, Grace: -1})
	if res, err := m.Reconcile(t.Context()); err != nil || res.Left != 2 {
		t.Fatalf("Reconcile = %+v, %v; want 2 records left", res, err)
	}
	o, err := newOps(&opsOptions{}, opsParts{Store: store, Maintainer: m})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	o.Handler.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if body := w.Body.String(); !strings.Contains(body, "\nidem_reconcile_left 2\n") {
		t.Errorf("/metrics lacks idem_reconcile_left 2:\n%s", body)
	}
}

func TestOpsConsoleOffWithoutToken(t *testing.T) {
	t.Parallel()
	o, err := newOps(&opsOptions{}, opsParts{Store: idemmem.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	o.Handler.ServeHTTP(w, httptest.NewRequest("GET", "/_idem/", nil))
	if w.Code != http.StatusNotFound {
		t.Fatalf("console without --console-token: %d, want 404", w.Code)
	}
	w = httptest.NewRecorder()
	o.Handler.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "--console-token") {
		t.Fatalf("GET / without a console: %d %q, want 200 saying how to turn it on", w.Code, w.Body)
	}
	if _, err := newOps(&opsOptions{consoleToken: "short"}, opsParts{Store: idemmem.New(nil)}); err == nil {
		t.Fatal("a short console token was accepted")
	}
}

// TestProxyOpsAndCache runs idem proxy with a replay cache and the ops
// listener: a replay is served, /metrics counts it, the console answers.
func TestProxyOpsAndCache(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	defer up.Close()
	token := strings.Repeat("t", 24)
	base, e, _ := startProxy(t, "--upstream", up.URL, "--store", "memory:", "--cache", "memory:",
		"--ops-listen", "127.0.0.1:0", "--console-token", token, "--maintain")
	for i := range 3 {
		req, _ := http.NewRequest("POST", base+"/v1/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || (i > 0) != (resp.Header.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("request %d: %d replayed=%q", i, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("upstream called %d times", calls.Load())
	}
	m := regexp.MustCompile(`ops_addr=(\S+)`).FindStringSubmatch(e.stderr.String())
	if m == nil {
		t.Fatalf("no ops address in the log:\n%s", e.stderr)
	}
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Labelled by the method alone: the proxy knows no routes, and a raw
	// path is never a label by default (--metrics-routes,
	// --metrics-path-segments).
	if !strings.Contains(string(body), `idem_decisions_total{decision="replayed",endpoint="POST /*",tenant=""} 2`) || strings.Contains(string(body), "/v1/pay") {
		t.Fatalf("/metrics does not count the two replays:\n%s", body)
	}
	req, _ := http.NewRequest("GET", "http://"+m[1]+"/_idem/", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("console: %d", resp.StatusCode)
	}
}

func TestOpenCacheRefusesUnknownScheme(t *testing.T) {
	t.Parallel()
	if _, _, err := openCache(t.Context(), "memcached://x", idemmem.New(nil), nil); err == nil {
		t.Fatal("an unknown cache scheme was accepted")
	}
}

// TestOpsBacklogFromStore: idem_unknown_backlog and
// idem_unknown_oldest_age_seconds are read from the store on every scrape,
// so two nodes on one store (two stores on one SQLite file, one of them
// without a maintainer) report the same, and at once, not after a pass.
func TestOpsBacklogFromStore(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	var nodes []*ops
	var stores []*idemsqlite.Store
	for i := range 2 {
		s, err := idemsqlite.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
		parts := opsParts{Store: s}
		if i == 0 {
			parts.Maintainer = idemmaint.New(s, nil)
		}
		o, err := newOps(&opsOptions{}, parts)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, o)
	}
	scrape := func(o *ops) string {
		t.Helper()
		w := httptest.NewRecorder()
		o.Handler.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
		return w.Body.String()
	}
	backlog := regexp.MustCompile(`(?m)^idem_unknown_backlog (\S+)$`)
	oldest := regexp.MustCompile(`(?m)^idem_unknown_oldest_age_seconds (\S+)$`)
	for want, n := range []int{0, 1, 2} {
		if n > 0 {
			// An unknown record made through the other node's store.
			s := stores[n%2]
			id := idemstore.Identity{Endpoint: "POST /pay", Key: "k" + strconv.Itoa(n)}
			if _, err := s.KeyReserve(t.Context(), &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if err := s.KeyMarkUnknown(t.Context(), &idemstore.FinishParams{Identity: id, Token: "t"}); err != nil {
				t.Fatal(err)
			}
		}
		for i, o := range nodes {
			body := scrape(o)
			m := backlog.FindStringSubmatch(body)
			if m == nil || m[1] != strconv.Itoa(want) {
				t.Fatalf("node %d after %d unknown records: idem_unknown_backlog %v, want %d", i, want, m, want)
			}
			if m := oldest.FindStringSubmatch(body); m == nil || (want == 0) != (m[1] == "0") {
				t.Fatalf("node %d: idem_unknown_oldest_age_seconds %v with %d unknown records", i, m, want)
			}
		}
	}
	if body := scrape(nodes[0]); !strings.Contains(body, "idem_reconcile_scheduled_total 0") {
		t.Fatal("/metrics lacks idem_reconcile_scheduled_total")
	}
}

// --console-secure-cookie (IDEM_CONSOLE_SECURE_COOKIE) marks the session
// cookie Secure even on a plain request, for a TLS proxy that does not say
// so; without it a plain login's cookie is not.
func TestOpsConsoleSecureCookie(t *testing.T) {
	t.Parallel()
	token := strings.Repeat("s", 32)
	login := func(o *opsOptions) *http.Cookie {
		t.Helper()
		ops, err := newOps(o, opsParts{Store: idemmem.New(nil)})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("POST", "/_idem/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		ops.Handler.ServeHTTP(w, r)
		for _, c := range w.Result().Cookies() {
			if c.Name == "idem_console" {
				return c
			}
		}
		t.Fatalf("login: %d, no session cookie", w.Code)
		return nil
	}
	if c := login(&opsOptions{consoleToken: token}); c.Secure {
		t.Error("a plain login's cookie is Secure without the flag")
	}
	vars := map[string]string{"IDEM_CONSOLE_TOKEN": token, "IDEM_CONSOLE_SECURE_COOKIE": "true"}
	o, err := parseProxy([]string{"--upstream", "http://127.0.0.1:1"}, newTestEnv(vars).env)
	if err != nil {
		t.Fatal(err)
	}
	if c := login(&o.ops); !c.Secure {
		t.Error("IDEM_CONSOLE_SECURE_COOKIE=true: the cookie is not Secure")
	}
	p, err := parsePayments([]string{"--console-token", token, "--console-secure-cookie"}, newTestEnv(nil).env)
	if err != nil {
		t.Fatal(err)
	}
	if c := login(&p.ops); !c.Secure {
		t.Error("payments --console-secure-cookie: the cookie is not Secure")
	}
}
