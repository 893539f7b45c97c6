package console_test

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/console"
	"github.com/idem-dev/idem/idemstore"
)

func TestNewRequiresTokenAndStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := console.New(console.Config{Store: b.store}); !errors.Is(err, console.ErrNoToken) {
		t.Errorf("no token: err = %v, want ErrNoToken", err)
	}
	if _, err := console.New(console.Config{Store: b.store, Token: "short"}); err == nil {
		t.Error("short token: no error")
	}
	if _, err := console.New(console.Config{Token: testToken}); err == nil {
		t.Error("no store: no error")
	}
}

// routes are every route of the console, with a harmless request each.
var routes = []struct{ method, path string }{
	{"GET", "/_idem/"},
	{"HEAD", "/_idem/"},
	{"GET", "/_idem/unknown"},
	{"GET", "/_idem/keys"},
	{"GET", "/_idem/keys?state=unknown"},
	{"GET", "/_idem/key?ref=x"},
	{"GET", "/_idem/outbox"},
	{"GET", "/_idem/outbox?state=dead"},
	{"GET", "/_idem/no-such-page"},
	{"POST", "/_idem/key/resolve"},
	{"POST", "/_idem/outbox/retry"},
	{"POST", "/_idem/logout"},
	{"POST", "/_idem/"},
	{"DELETE", "/_idem/key"},
}

func TestEveryRouteNeedsTheToken(t *testing.T) {
	t.Parallel()
	// The table sends many wrong Authorization headers from one address;
	// their limit has tests of its own (limit_test.go).
	b := setup(t, func(c *console.Config) { c.MaxLoginFailures = 1000 })
	unknown(t, b.store, testIdentity)
	b.outbox.add(console.OutboxMessage{Topic: "charge", IdempotencyKey: "k", State: "dead"})
	before := getRecord(t, b.store, testIdentity)

	good := b.login(t)
	expiredClock := setup(t)
	expired := expiredClock.login(t)
	forged := &http.Cookie{Name: "idem_console", Value: testToken}
	tampered := &http.Cookie{Name: "idem_console", Value: good.Value[:len(good.Value)-2] + "AA"}
	otherConsole := setup(t, func(c *console.Config) { c.Token = "another-token-0123456789abcdef" })

	creds := []struct {
		name  string
		apply func(*http.Request)
	}{
		{"none", func(*http.Request) {}},
		{"wrong bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer wrong-token-0123456789abcdef") }},
		{"bearer prefix", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+testToken[:20]) }},
		{"basic", func(r *http.Request) { r.SetBasicAuth("admin", testToken) }},
		{"empty bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer ") }},
		{"token as cookie", func(r *http.Request) { r.AddCookie(forged) }},
		{"tampered cookie", func(r *http.Request) { r.AddCookie(tampered) }},
		{"other console's cookie", func(r *http.Request) { r.AddCookie(otherConsole.login(t)) }},
		{"wrong bearer with a good cookie", func(r *http.Request) {
			r.AddCookie(good)
			r.Header.Set("Authorization", "Bearer wrong-token-0123456789abcdef")
		}},
		{"token in query", func(r *http.Request) {
			q := r.URL.Query()
			q.Set("token", testToken)
			r.URL.RawQuery = q.Encode()
		}},
	}
	// The session of expiredClock's console has expired on its clock.
	expiredClock.clock.Advance(console.DefaultSessionTTL + time.Second)

	for _, rt := range routes {
		for _, cr := range creds {
			req := postRequest(rt.path, url.Values{"csrf": {"x"}, "id": {"1"}, "to": {"released"}})
			req.Method = rt.method
			cr.apply(req)
			rec := b.do(req)
			if rec.Code != http.StatusUnauthorized {
				t.Errorf("%s %s with %s: status %d, want 401", rt.method, rt.path, cr.name, rec.Code)
			}
			if rec.Header().Get("WWW-Authenticate") == "" {
				t.Errorf("%s %s with %s: no WWW-Authenticate", rt.method, rt.path, cr.name)
			}
			if rt.method == "GET" && !strings.Contains(rec.Body.String(), `name="token"`) {
				t.Errorf("%s %s with %s: the 401 page has no login form", rt.method, rt.path, cr.name)
			}
		}
		req := postRequest(rt.path, nil)
		req.Method = rt.method
		req.AddCookie(expired)
		if rec := expiredClock.do(req); rec.Code != http.StatusUnauthorized {
			t.Errorf("%s %s with an expired session: status %d, want 401", rt.method, rt.path, rec.Code)
		}
	}
	if after := getRecord(t, b.store, testIdentity); after.State != before.State || after.UpdatedAt != before.UpdatedAt {
		t.Errorf("an unauthenticated request changed the record: %v -> %v", before.State, after.State)
	}
	if b.outbox.state(1) != "dead" {
		t.Error("an unauthenticated request retried the outbox message")
	}

	// With the token (header or cookie) the pages open.
	for _, path := range []string{"/_idem/", "/_idem/unknown", "/_idem/keys", "/_idem/outbox"} {
		if rec := b.get(t, path); rec.Code != http.StatusOK {
			t.Errorf("GET %s with the bearer token: status %d, want 200", path, rec.Code)
		}
		req := postRequest(path, nil)
		req.Method = http.MethodGet
		req.AddCookie(good)
		if rec := b.do(req); rec.Code != http.StatusOK {
			t.Errorf("GET %s with the session cookie: status %d, want 200", path, rec.Code)
		}
	}
	if rec := b.get(t, "/_idem/no-such-page"); rec.Code != http.StatusNotFound {
		t.Errorf("GET an unknown page: status %d, want 404", rec.Code)
	}
}

func TestLoginCookie(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := b.do(postRequest("/_idem/login", url.Values{"token": {testToken}, "next": {"/_idem/unknown"}}))
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/_idem/unknown" {
		t.Fatalf("login: %d to %q, want 303 to /_idem/unknown", rec.Code, rec.Header().Get("Location"))
	}
	cookies := rec.Result().Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login set %d cookies, want 1", len(cookies))
	}
	c := cookies[0]
	switch {
	case !c.HttpOnly:
		t.Error("the session cookie is not HttpOnly")
	case c.SameSite != http.SameSiteStrictMode:
		t.Errorf("SameSite = %v, want Strict", c.SameSite)
	case c.Path != "/_idem/":
		t.Errorf("Path = %q, want /_idem/", c.Path)
	case strings.Contains(c.Value, testToken) || strings.Contains(c.Value, testToken[:12]):
		t.Error("the session cookie holds the token")
	case c.MaxAge <= 0:
		t.Errorf("MaxAge = %d, want a lifetime", c.MaxAge)
	}
	if !strings.Contains(b.logs.String(), "idem console: login") || strings.Contains(b.logs.String(), testToken) {
		t.Errorf("login log: %s", b.logs)
	}

	// Over TLS the cookie is Secure.
	req := postRequest("/_idem/login", url.Values{"token": {testToken}})
	req.TLS = b.tlsState()
	if c := b.do(req).Result().Cookies(); len(c) != 1 || !c[0].Secure {
		t.Error("a login over TLS set no Secure cookie")
	}

	// The session ends after SessionTTL.
	get := func() int {
		req := postRequest("/_idem/", nil)
		req.Method = http.MethodGet
		req.AddCookie(c)
		return b.do(req).Code
	}
	if code := get(); code != http.StatusOK {
		t.Fatalf("GET with the cookie: %d, want 200", code)
	}
	b.clock.Advance(console.DefaultSessionTTL - time.Second)
	if code := get(); code != http.StatusOK {
		t.Fatalf("GET before the session ends: %d, want 200", code)
	}
	b.clock.Advance(2 * time.Second)
	if code := get(); code != http.StatusUnauthorized {
		t.Fatalf("GET after the session ended: %d, want 401", code)
	}
}

func TestLoginFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 10 {
		rec := b.do(postRequest("/_idem/login", url.Values{"token": {"wrong"}}))
		if rec.Code != http.StatusUnauthorized || len(rec.Result().Cookies()) != 0 {
			t.Fatalf("failed login %d: %d with %d cookies, want 401 and none", i, rec.Code, len(rec.Result().Cookies()))
		}
		if !strings.Contains(rec.Body.String(), "Wrong token.") {
			t.Fatal("the failed login page does not say so")
		}
	}
	// The limit is reached: even the right token waits for the next minute.
	if rec := b.do(postRequest("/_idem/login", url.Values{"token": {testToken}})); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("login over the limit: %d, want 429", rec.Code)
	}
	b.clock.Advance(time.Minute)
	if rec := b.do(postRequest("/_idem/login", url.Values{"token": {testToken}})); rec.Code != http.StatusSeeOther {
		t.Fatalf("login a minute later: %d, want 303", rec.Code)
	}
	if strings.Contains(b.logs.String(), "wrong") {
		t.Error("a tried token reached the log")
	}
}

func TestLoginRefusesCrossSiteAndOpenRedirects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	req := postRequest("/_idem/login", url.Values{"token": {testToken}})
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if rec := b.do(req); rec.Code != http.StatusForbidden || len(rec.Result().Cookies()) != 0 {
		t.Errorf("cross-site login: %d, want 403 without a cookie", rec.Code)
	}
	for _, next := range []string{"//evil.example/_idem/", "https://evil.example/_idem/", "/other", "/_idem/\\evil", "javascript:alert(1)"} {
		rec := b.do(postRequest("/_idem/login", url.Values{"token": {testToken}, "next": {next}}))
		if loc := rec.Header().Get("Location"); loc != "/_idem/" {
			t.Errorf("login with next=%q redirects to %q, want /_idem/", next, loc)
		}
	}
	// GET /login while signed in goes to the console.
	req = httptestGet("/_idem/login")
	req.AddCookie(b.login(t))
	if rec := b.do(req); rec.Code != http.StatusSeeOther {
		t.Errorf("GET /login signed in: %d, want 303", rec.Code)
	}
}

func TestCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown(t, b.store, testIdentity)
	b.outbox.add(console.OutboxMessage{Topic: "charge", IdempotencyKey: "k", State: "dead"})
	cookie := b.login(t)
	keyPage := func() string {
		req := httptestGet(links(b.get(t, "/_idem/unknown").Body.String(), "/_idem/key?")[0])
		req.AddCookie(cookie)
		return b.do(req).Body.String()
	}
	page := keyPage()
	csrf, ref := formValue(t, page, "csrf"), formValue(t, page, "ref")
	otherSession := func() string {
		b.clock.Advance(time.Second) // another issue time: another session
		c := b.login(t)
		req := httptestGet("/_idem/")
		req.AddCookie(c)
		return formValue(t, b.do(req).Body.String(), "csrf")
	}()
	if otherSession == csrf {
		t.Fatal("two sessions share a CSRF token")
	}

	for _, tt := range []struct {
		name   string
		csrf   string
		header map[string]string
	}{
		{"no token", "", nil},
		{"wrong token", "AAAA" + csrf[4:], nil},
		{"another session's token", otherSession, nil},
		{"bearer session's token", b.csrf(t), nil},
		{"cross-site", csrf, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"same-site", csrf, map[string]string{"Sec-Fetch-Site": "same-site"}},
		{"foreign origin", csrf, map[string]string{"Origin": "https://evil.example"}},
		{"null origin", csrf, map[string]string{"Origin": "null"}},
	} {
		for _, path := range []string{"/_idem/key/resolve", "/_idem/outbox/retry", "/_idem/logout"} {
			form := url.Values{"ref": {ref}, "to": {"released"}, "id": {"1"}}
			if tt.csrf != "" {
				form.Set("csrf", tt.csrf)
			}
			req := postRequest(path, form)
			req.AddCookie(cookie)
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			rec := b.do(req)
			if rec.Code != http.StatusForbidden {
				t.Errorf("POST %s, %s: status %d, want 403", path, tt.name, rec.Code)
			}
			if len(rec.Result().Cookies()) != 0 {
				t.Errorf("POST %s, %s: it changed a cookie", path, tt.name)
			}
		}
	}
	if s := getRecord(t, b.store, testIdentity).State; s != idemstore.StateUnknown {
		t.Fatalf("a refused POST resolved the record: %s", s)
	}
	if b.outbox.state(1) != "dead" {
		t.Fatal("a refused POST retried the outbox message")
	}

	// The right token from the same origin passes.
	req := postRequest("/_idem/key/resolve", url.Values{"csrf": {csrf}, "ref": {ref}, "to": {"released"}})
	req.AddCookie(cookie)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set("Origin", "http://example.com")
	if rec := b.do(req); rec.Code != http.StatusSeeOther {
		t.Fatalf("POST with the right token: %d, want 303\n%s", rec.Code, rec.Body)
	}
	if s := getRecord(t, b.store, testIdentity).State; s != idemstore.StateReleased {
		t.Fatalf("state %s, want released", s)
	}
}

func TestTrustedOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.TrustedOrigins = []string{"https://ops.example.com"} })
	b.outbox.add(console.OutboxMessage{Topic: "charge", IdempotencyKey: "k", State: "dead"})
	req := postRequest("/_idem/outbox/retry", url.Values{"csrf": {b.csrf(t)}, "id": {"1"}})
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.Header.Set("Origin", "https://ops.example.com")
	if rec := b.do(req); rec.Code != http.StatusSeeOther {
		t.Fatalf("POST from a trusted origin: %d, want 303", rec.Code)
	}
}

func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, rec := range []interface{ Header() http.Header }{b.get(t, "/_idem/"), b.do(httptestGet("/_idem/"))} {
		h := rec.Header()
		csp := h.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("Content-Security-Policy = %q", csp)
		}
		for k, v := range map[string]string{"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"} {
			if h.Get(k) != v {
				t.Errorf("%s = %q, want %q", k, h.Get(k), v)
			}
		}
	}
}

func TestLogout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cookie := b.login(t)
	req := httptestGet("/_idem/")
	req.AddCookie(cookie)
	csrf := formValue(t, b.do(req).Body.String(), "csrf")
	req = postRequest("/_idem/logout", url.Values{"csrf": {csrf}})
	req.AddCookie(cookie)
	rec := b.do(req)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/_idem/login" {
		t.Fatalf("logout: %d to %q", rec.Code, rec.Header().Get("Location"))
	}
	if c := rec.Result().Cookies(); len(c) != 1 || c[0].MaxAge >= 0 || c[0].Value != "" {
		t.Fatalf("logout did not clear the cookie: %+v", c)
	}
}

func httptestGet(path string) *http.Request {
	req := postRequest(path, nil)
	req.Method = http.MethodGet
	req.Header.Del("Content-Type")
	return req
}

// Behind a proxy that terminated TLS (X-Forwarded-Proto: https, or
// Forwarded: proto=https) the session cookie is Secure, and with
// SecureCookie always; a plain request without either gets none (a browser
// on http:// would drop a Secure cookie).
func TestSessionCookieSecureBehindATLSProxy(t *testing.T) {
	t.Parallel()
	cookie := func(b *bundle, path string, set func(*http.Request)) *http.Cookie {
		t.Helper()
		req := postRequest(path, url.Values{"token": {testToken}})
		set(req)
		for _, c := range b.do(req).Result().Cookies() {
			if c.Name == "idem_console" {
				return c
			}
		}
		t.Fatalf("%s set no session cookie", path)
		return nil
	}
	b := setup(t)
	for _, tt := range []struct {
		name   string
		set    func(*http.Request)
		secure bool
	}{
		{"Plain", func(*http.Request) {}, false},
		{"XForwardedProto", func(r *http.Request) { r.Header.Set("X-Forwarded-Proto", "https") }, true},
		{"XForwardedProtoList", func(r *http.Request) { r.Header.Set("X-Forwarded-Proto", "HTTPS, http") }, true},
		{"Forwarded", func(r *http.Request) { r.Header.Set("Forwarded", `for=192.0.2.1;proto=https;host=ops.example.com`) }, true},
		{"ForwardedHTTP", func(r *http.Request) { r.Header.Set("X-Forwarded-Proto", "http") }, false},
	} {
		if c := cookie(b, "/_idem/login", tt.set); c.Secure != tt.secure {
			t.Errorf("%s: login cookie Secure = %v, want %v", tt.name, c.Secure, tt.secure)
		}
	}
	always := setup(t, func(c *console.Config) { c.SecureCookie = true })
	if c := cookie(always, "/_idem/login", func(*http.Request) {}); !c.Secure {
		t.Error("SecureCookie: a plain login set no Secure cookie")
	}
}

// Sessions are random and kept by the console: two logins in the same
// second get different cookies, and a logout ends its own session (a copy
// of the cookie no longer works) and no other.
func TestSessionsAreUniqueAndRevocable(t *testing.T) {
	t.Parallel()
	b := setup(t) // the test clock stands still: both logins in one instant
	first, second := b.login(t), b.login(t)
	if first.Value == second.Value {
		t.Fatalf("two logins in the same second got the same cookie %q", first.Value)
	}
	status := func(c *http.Cookie) int {
		req := httptestGet("/_idem/")
		req.AddCookie(c)
		return b.do(req).Code
	}
	if status(first) != http.StatusOK || status(second) != http.StatusOK {
		t.Fatal("a fresh session does not work")
	}
	req := httptestGet("/_idem/")
	req.AddCookie(first)
	csrf := formValue(t, b.do(req).Body.String(), "csrf")
	req = postRequest("/_idem/logout", url.Values{"csrf": {csrf}})
	req.AddCookie(first)
	if rec := b.do(req); rec.Code != http.StatusSeeOther {
		t.Fatalf("logout: %d", rec.Code)
	}
	if got := status(first); got != http.StatusUnauthorized {
		t.Fatalf("the logged-out cookie still works: %d, want 401", got)
	}
	if got := status(second); got != http.StatusOK {
		t.Fatalf("another session ended with the logout: %d", got)
	}
	// A made-up or altered cookie is no session.
	forged := *second
	last := "A"
	if strings.HasSuffix(second.Value, "A") {
		last = "B"
	}
	forged.Value = second.Value[:len(second.Value)-1] + last
	if got := status(&forged); got != http.StatusUnauthorized {
		t.Fatalf("an altered cookie works: %d", got)
	}
}
