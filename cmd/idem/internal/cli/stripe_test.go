package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"
)

// fakeStripe is a Stripe-like upstream: POST /v1/customers creates a
// customer and answers it as Stripe does. It counts the customers it
// created; a customer whose email is "slow@example.com" waits for release.
type fakeStripe struct {
	*httptest.Server
	created atomic.Int32
	started chan struct{} // receives when a slow customer's request arrived
	release chan struct{}
}

func newFakeStripe(t *testing.T) *fakeStripe {
	t.Helper()
	f := &fakeStripe{started: make(chan struct{}, 1), release: make(chan struct{})}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/customers" {
			http.NotFound(w, r)
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		email := r.PostForm.Get("email")
		if email == "slow@example.com" {
			f.started <- struct{}{}
			select {
			case <-f.release:
			case <-time.After(10 * time.Second): // bound a broken test
			}
		}
		n := f.created.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cus_%d","object":"customer","email":%q}`, n, email)
	}))
	t.Cleanup(f.Close)
	t.Cleanup(func() {
		select {
		case <-f.release:
		default:
			close(f.release)
		}
	})
	return f
}

// lossyRelay stands between the client and the proxy. It forwards every
// request and, while drops is positive, throws the answer away and closes
// the client's connection instead: the request was served, its response
// lost, as with a network cut after the server answered. It records the
// Idempotency-Key of every request it saw.
type lossyRelay struct {
	*httptest.Server
	drops atomic.Int32
	mu    sync.Mutex
	keys  []string
}

func newLossyRelay(t *testing.T, target string) *lossyRelay {
	t.Helper()
	l := &lossyRelay{}
	client := &http.Client{Timeout: 10 * time.Second}
	l.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.keys = append(l.keys, r.Header.Get("Idempotency-Key"))
		l.mu.Unlock()
		out, err := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.RequestURI(), r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		out.Header = r.Header.Clone()
		res, err := client.Do(out)
		if err != nil {
			t.Errorf("relay: %v", err)
			return
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Errorf("relay: %v", err)
			return
		}
		if l.drops.Add(-1) >= 0 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("relay: %v", err)
				return
			}
			conn.Close()
			return
		}
		for name, vs := range res.Header {
			w.Header()[name] = vs
		}
		w.WriteHeader(res.StatusCode)
		w.Write(body)
	}))
	t.Cleanup(l.Close)
	return l
}

// seen returns the keys of the requests the relay saw, and forgets them.
func (l *lossyRelay) seen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := l.keys
	l.keys = nil
	return keys
}

// stripeClient is stripe-go's client with its API backend at url, two
// network retries (its default) and no sleep between them.
func stripeClient(url string) *stripe.Client {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(url),
		// A fresh connection per request: net/http would otherwise resend a
		// request with an Idempotency-Key itself when a reused connection
		// closes, and the relay would count more tries than stripe-go made.
		HTTPClient:        &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		MaxNetworkRetries: stripe.Int64(2),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	backend.(*stripe.BackendImplementation).SetNetworkRetriesSleep(false)
	return stripe.NewClient("sk_test_idem", stripe.WithBackends(&stripe.Backends{API: backend, Connect: backend, Uploads: backend, MeterEvents: backend}))
}

// Stripe's own Go SDK, pointed at `idem proxy --profile stripe`, behaves as
// it does against Stripe: its retries after lost responses create one
// customer, and a reused key or a key still in use comes back at once as a
// typed idempotency_error, never retried.
func TestStripeGoThroughTheStripeProfile(t *testing.T) {
	t.Parallel()
	up := newFakeStripe(t)
	base, _, _ := startProxy(t, "--upstream", up.URL, "--profile", "stripe",
		"--store", "sqlite:"+filepath.Join(t.TempDir(), "idem-proxy.db"))
	relay := newLossyRelay(t, base)
	sc := stripeClient(relay.URL)
	ctx := context.Background()

	t.Run("lost responses", func(t *testing.T) {
		relay.drops.Store(2) // the first try's and the first retry's answers are lost
		created := up.created.Load()
		c, err := sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("ada@example.com")})
		if err != nil {
			t.Fatalf("create after two lost responses: %v", err)
		}
		keys := relay.seen()
		if len(keys) != 3 || keys[0] == "" || keys[1] != keys[0] || keys[2] != keys[0] {
			t.Fatalf("the relay saw keys %q, want three tries with one generated key", keys)
		}
		if n := up.created.Load() - created; n != 1 {
			t.Fatalf("the upstream created %d customers, want 1", n)
		}
		if c.Email != "ada@example.com" || c.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("customer %+v replayed %q, want ada's, replayed", c, c.LastResponse.Header.Get("Idempotent-Replayed"))
		}
	})

	t.Run("key reused with other parameters", func(t *testing.T) {
		key := "order-7"
		if _, err := sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{
			Params: stripe.Params{IdempotencyKey: stripe.String(key)}, Email: stripe.String("bob@example.com"),
		}); err != nil {
			t.Fatal(err)
		}
		relay.seen()
		created := up.created.Load()
		_, err := sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{
			Params: stripe.Params{IdempotencyKey: stripe.String(key)}, Email: stripe.String("eve@example.com"),
		})
		requireStripeError(t, err, http.StatusBadRequest, "key-reused")
		var idemErr *stripe.IdempotencyError
		if !errors.As(err, &idemErr) {
			t.Errorf("error %v is not a *stripe.IdempotencyError", err)
		}
		if keys := relay.seen(); len(keys) != 1 {
			t.Fatalf("stripe-go sent %d requests, want 1: a reused key is not retried", len(keys))
		}
		if up.created.Load() != created {
			t.Fatal("the reused key reached the upstream")
		}
	})

	t.Run("key in use", func(t *testing.T) {
		key := "order-8"
		params := func() *stripe.CustomerCreateParams {
			return &stripe.CustomerCreateParams{Params: stripe.Params{IdempotencyKey: stripe.String(key)}, Email: stripe.String("slow@example.com")}
		}
		first := make(chan error, 1)
		go func() { _, err := sc.V1Customers.Create(ctx, params()); first <- err }()
		select {
		case <-up.started:
		case <-time.After(10 * time.Second):
			t.Fatal("the first request never reached the upstream")
		}
		relay.seen()
		_, err := sc.V1Customers.Create(ctx, params())
		requireStripeError(t, err, http.StatusConflict, string(stripe.ErrorCodeIdempotencyKeyInUse))
		if keys := relay.seen(); len(keys) != 1 {
			t.Fatalf("stripe-go sent %d requests, want 1", len(keys))
		}
		close(up.release)
		if err := <-first; err != nil {
			t.Fatalf("the first request: %v", err)
		}
	})
}

// requireStripeError fails unless err is stripe-go's typed error for an
// idempotency_error with this status and code.
func requireStripeError(t *testing.T, err error, status int, code string) {
	t.Helper()
	var se *stripe.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a *stripe.Error", err, err)
	}
	if se.Type != stripe.ErrorTypeIdempotency || se.HTTPStatusCode != status || string(se.Code) != code || se.Msg == "" {
		t.Fatalf("stripe error type %q status %d code %q message %q, want idempotency_error %d %s",
			se.Type, se.HTTPStatusCode, se.Code, se.Msg, status, code)
	}
}
