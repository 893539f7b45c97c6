package idem_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// Problem "type" URIs lead to the README's table by default, and follow
// Config.ProblemBaseURI when set.
func TestProblemBaseURI(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  idem.Config
		want string
	}{
		{"default", idem.Config{}, "https://github.com/idem-dev/idem#problem-key-reused"},
		{"ProblemBaseURI", idem.Config{ProblemBaseURI: "https://api.example.com/problems/"}, "https://api.example.com/problems/key-reused"},
	}
	for _, tt := range tests {
		b := setup(t, &tt.cfg, nil)
		b.do(t, http.MethodPost, "k", `{"a":1}`)
		w := b.do(t, http.MethodPost, "k", `{"a":2}`)
		if !strings.Contains(w.Body.String(), `"type":"`+tt.want+`"`) {
			t.Errorf("%s: problem %s, want type %s", tt.name, w.Body, tt.want)
		}
	}
}

// Every problem code the middleware answers has its anchor and its row in
// the README, where the default "type" URIs lead.
func TestREADMEDocumentsEveryProblem(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{
		idem.CodeKeyMissing, idem.CodeKeyInvalid, idem.CodeKeyReused, idem.CodeKeyInUse, idem.CodeOutcomeUnknown,
		idem.CodeNotReplayable, idem.CodeBodyTooLarge, idem.CodeStoreUnavailable, idem.CodeTooManyKeys,
		idem.CodeBodyUnreadable, idem.CodeBodyTimeout, idem.CodeConflict, idem.CodeUnauthorized,
		idem.CodeResponseUntrusted,
	} {
		anchor := strings.TrimPrefix(idem.DefaultProblemBaseURI, "https://github.com/idem-dev/idem#") + code
		if !strings.Contains(string(readme), `<a id="`+anchor+`"></a>`) {
			t.Errorf("README has no anchor %q for problem %s", anchor, code)
		}
	}
}

// The Appstrate profile covers every write by default; the others POST and
// PATCH. Methods, when set, wins.
func TestProfileMethods(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg     idem.Config
		covered map[string]bool
	}{
		{idem.Config{}, map[string]bool{"POST": true, "PATCH": true, "PUT": false, "DELETE": false}},
		{idem.Config{Profile: idem.ProfileStripe}, map[string]bool{"POST": true, "PATCH": true, "PUT": false, "DELETE": false}},
		{idem.Config{Profile: idem.ProfileAppstrate}, map[string]bool{"POST": true, "PATCH": true, "PUT": true, "DELETE": true}},
		{idem.Config{Profile: idem.ProfileAppstrate, Methods: []string{"POST"}}, map[string]bool{"POST": true, "PUT": false, "DELETE": false}},
	}
	for _, tt := range tests {
		for method, want := range tt.covered {
			b := setup(t, &tt.cfg, nil)
			b.do(t, method, "k", `{"a":1}`)
			w := b.do(t, method, "k", `{"a":1}`)
			if got := w.Header().Get(idem.HeaderReplayed) == "true"; got != want {
				t.Errorf("profile %q methods %v: %s covered = %v, want %v", tt.cfg.Profile, tt.cfg.Methods, method, got, want)
			}
		}
	}
}

// stripeErrorBody is Stripe's error object, as stripe-go decodes it.
type stripeErrorBody struct {
	Error struct {
		Type, Code, Message string
		DocURL              string `json:"doc_url"`
	}
}

// Under the Stripe profile every rejection speaks Stripe: its status codes,
// {"error":{"type","code","message"}} as application/json, and
// Stripe-Should-Retry, so Stripe's SDKs read a typed error and stop (or
// retry) as they would against Stripe. Nothing else changes: the key is not
// in the answer, and the record is not touched.
func TestStripeProfileAnswersInStripeShape(t *testing.T) {
	t.Parallel()
	stripe := func(c idem.Config) *idem.Config { c.Profile = idem.ProfileStripe; return &c }
	tests := []struct {
		name        string
		cfg         *idem.Config
		handler     http.HandlerFunc
		answer      func(t *testing.T, b *testBundle) *httptest.ResponseRecorder
		status      int
		typ, code   string
		shouldRetry string
		retryAfter  bool
	}{
		{name: "key missing", cfg: stripe(idem.Config{RequireKey: true}),
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder { return b.do(t, "POST", "", "{}") },
			status: 400, typ: "idempotency_error", code: "key-missing", shouldRetry: "false"},
		{name: "key invalid", cfg: stripe(idem.Config{GuardConfig: idem.GuardConfig{MinKeyLength: 16}}),
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder { return b.do(t, "POST", "key-one", "{}") },
			status: 400, typ: "idempotency_error", code: "key-invalid", shouldRetry: "false"},
		{name: "key reused", cfg: stripe(idem.Config{}),
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder {
				b.do(t, "POST", "key-one", `{"amount":1}`)
				return b.do(t, "POST", "key-one", `{"amount":2}`)
			},
			status: 400, typ: "idempotency_error", code: "key-reused", shouldRetry: "false"},
		{name: "key in use", cfg: stripe(idem.Config{}),
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) },
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder {
				b.store.failComplete.Store(true) // the record stays in progress
				b.do(t, "POST", "key-one", "{}")
				b.store.failComplete.Store(false)
				return b.do(t, "POST", "key-one", "{}")
			},
			status: 409, typ: "idempotency_error", code: "idempotency_key_in_use", shouldRetry: "true", retryAfter: true},
		{name: "outcome unknown", cfg: stripe(idem.Config{}),
			handler: func(w http.ResponseWriter, r *http.Request) { idem.MarkUnknown(r.Context()); w.WriteHeader(201) },
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder {
				b.do(t, "POST", "key-one", "{}")
				return b.do(t, "POST", "key-one", "{}")
			},
			status: 409, typ: "idempotency_error", code: "outcome-unknown", shouldRetry: "false", retryAfter: true},
		{name: "not replayable", cfg: stripe(idem.Config{GuardConfig: idem.GuardConfig{MaxResponse: 4}}),
			handler: func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "a long answer") },
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder {
				b.do(t, "POST", "key-one", "{}")
				return b.do(t, "POST", "key-one", "{}")
			},
			status: 409, typ: "idempotency_error", code: "not-replayable", shouldRetry: "false"},
		{name: "body too large", cfg: stripe(idem.Config{MaxBody: 4}),
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder {
				return b.do(t, "POST", "key-one", `{"a":1}`)
			},
			status: 400, typ: "invalid_request_error", code: "body-too-large", shouldRetry: "false"},
		{name: "unauthorized", cfg: stripe(idem.Config{Scope: func(*http.Request) (string, error) { return "", errors.New("no tenant") }}),
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder { return b.do(t, "POST", "key-one", "{}") },
			status: 401, typ: "invalid_request_error", code: "unauthorized", shouldRetry: "false"},
		{name: "too many keys", cfg: stripe(idem.Config{GuardConfig: idem.GuardConfig{NewKeysPerSecondPerScope: 1}}),
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder {
				b.do(t, "POST", "k1", "{}")
				return b.do(t, "POST", "k2", "{}")
			},
			status: 429, typ: "invalid_request_error", code: "rate_limit", retryAfter: true},
		{name: "store unavailable", cfg: stripe(idem.Config{}),
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder {
				b.store.failReserve.Store(true)
				return b.do(t, "POST", "key-one", "{}")
			},
			status: 503, typ: "api_error", code: "store-unavailable", shouldRetry: "true", retryAfter: true},
		{name: "response untrusted", cfg: stripe(idem.Config{GuardConfig: idem.GuardConfig{Keyring: testKeyring(t, "k1"), EncryptionRequired: true}}),
			answer: func(t *testing.T, b *testBundle) *httptest.ResponseRecorder {
				// Completed by a middleware without encryption: stored in the clear.
				clear := idem.New(b.store, &idem.Config{Profile: idem.ProfileStripe, GuardConfig: idem.GuardConfig{Clock: b.clock}})(
					http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
				r := httptest.NewRequest("POST", "/v1/things", strings.NewReader("{}"))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", "key-one")
				clear.ServeHTTP(httptest.NewRecorder(), r)
				return b.do(t, "POST", "key-one", "{}")
			},
			status: 500, typ: "api_error", code: "response-untrusted", shouldRetry: "false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.cfg, tt.handler)
			w := tt.answer(t, b)
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d; body %s", w.Code, tt.status, w.Body)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q, want application/json; body %s", ct, w.Body)
			}
			var e stripeErrorBody
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
				t.Fatalf("body %s: %v", w.Body, err)
			}
			if e.Error.Type != tt.typ || e.Error.Code != tt.code || e.Error.Message == "" {
				t.Fatalf("error %+v, want type %s code %s and a message", e.Error, tt.typ, tt.code)
			}
			if !strings.HasPrefix(e.Error.DocURL, idem.DefaultProblemBaseURI) {
				t.Errorf("doc_url %q, want the problem's type URI", e.Error.DocURL)
			}
			if got := w.Header().Get("Stripe-Should-Retry"); got != tt.shouldRetry {
				t.Errorf("Stripe-Should-Retry %q, want %q", got, tt.shouldRetry)
			}
			if got := w.Header().Get("Retry-After") != ""; got != tt.retryAfter {
				t.Errorf("Retry-After present %v, want %v", got, tt.retryAfter)
			}
			if strings.Contains(w.Body.String(), "key-one") {
				t.Errorf("the answer reveals the key: %s", w.Body)
			}
		})
	}
}
