package console_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// from sets the request's client address.
func from(req *http.Request, addr string) *http.Request {
	req.RemoteAddr = addr
	return req
}

// A guesser locks out only its own address: the operator's logins from
// another address go on working.
func TestLoginLockoutIsPerAddress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const attacker, operator = "198.51.100.7:40000", "203.0.113.9:50000"
	for i := range 10 {
		// Another port of the same host is the same client.
		addr := "198.51.100.7:" + string(rune('0'+i)) + "0001"
		if rec := b.do(from(postRequest("/_idem/login", url.Values{"token": {"guess-" + strings.Repeat("x", i)}}), addr)); rec.Code != http.StatusUnauthorized {
			t.Fatalf("failed login %d: %d, want 401", i, rec.Code)
		}
	}
	rec := b.do(from(postRequest("/_idem/login", url.Values{"token": {testToken}}), attacker))
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("the guesser's next login: %d, want 429", rec.Code)
	}
	if ra := rec.Header().Get("Retry-After"); ra == "" || ra == "0" {
		t.Errorf("429 without Retry-After (%q)", ra)
	}
	if rec := b.do(from(postRequest("/_idem/login", url.Values{"token": {testToken}}), operator)); rec.Code != http.StatusSeeOther {
		t.Fatalf("the operator's login from another address: %d, want 303", rec.Code)
	}
	logs := b.logs.String()
	if strings.Contains(logs, "guess-") {
		t.Error("a tried token reached the log")
	}
	if n := strings.Count(logs, "authentication failed"); n != 10 {
		t.Errorf("%d failed logins logged, want 10:\n%s", n, logs)
	}
	if !strings.Contains(logs, "remote_addr=198.51.100.7:") {
		t.Errorf("the failed logins do not name the client address:\n%s", logs)
	}
}

// Wrong bearer tokens on console pages count as failed logins: limited per
// address, logged without the token.
func TestBearerGuessesAreLimitedAndLogged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const attacker, operator = "198.51.100.7:40000", "203.0.113.9:50000"
	bearer := func(token, addr string) *httptest.ResponseRecorder {
		req := from(httptest.NewRequest(http.MethodGet, "/_idem/", nil), addr)
		req.Header.Set("Authorization", "Bearer "+token)
		return b.do(req)
	}
	for i := range 10 {
		if rec := bearer("guess-"+strings.Repeat("y", i), attacker); rec.Code != http.StatusUnauthorized {
			t.Fatalf("wrong bearer %d: %d, want 401", i, rec.Code)
		}
	}
	if rec := bearer(testToken, attacker); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("the guesser's next bearer request: %d (Retry-After %q), want 429 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
	}
	// A form login from that address is under the same limit.
	if rec := b.do(from(postRequest("/_idem/login", url.Values{"token": {testToken}}), attacker)); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("the guesser's form login: %d, want 429", rec.Code)
	}
	if rec := bearer(testToken, operator); rec.Code != http.StatusOK {
		t.Fatalf("the operator's bearer request from another address: %d, want 200", rec.Code)
	}
	b.clock.Advance(time.Minute)
	if rec := bearer(testToken, attacker); rec.Code != http.StatusOK {
		t.Fatalf("the right token a minute later: %d, want 200", rec.Code)
	}
	logs := b.logs.String()
	if strings.Contains(logs, "guess-") {
		t.Error("a tried bearer token reached the log")
	}
	if n := strings.Count(logs, "authentication failed"); n != 10 || !strings.Contains(logs, "method=bearer") {
		t.Errorf("%d failed bearer attempts logged, want 10 with method=bearer:\n%s", n, logs)
	}
}
