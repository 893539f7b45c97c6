package idemmaint

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// lookupServer is the upstream's lookup by key: GET /lookup/{key}. What it
// answers depends on the key's prefix; it records every lookup.
type lookupServer struct {
	*httptest.Server
	release chan struct{} // closed at the end of the test: frees slow lookups

	mu    sync.Mutex
	asked []*http.Request
}

const lookupBody = `{"order":"ord_1","status":"created"}`

func newLookupServer(t *testing.T) *lookupServer {
	t.Helper()
	s := &lookupServer{release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /lookup/{key}", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.asked = append(s.asked, r)
		s.mu.Unlock()
		key := r.PathValue("key")
		switch {
		case strings.HasPrefix(key, "applied"):
			h := w.Header()
			h.Set("Content-Type", "application/json")
			h.Set("Location", "/v1/orders/ord_1")
			h.Set("X-Trace", "t-1")            // not on the allow-list
			h.Set("Set-Cookie", "session=abc") // never stored
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(lookupBody))
		case strings.HasPrefix(key, "big"):
			w.WriteHeader(http.StatusOK)
			w.Write(bytes.Repeat([]byte("x"), 101))
		case strings.HasPrefix(key, "missing"):
			http.NotFound(w, r)
		case strings.HasPrefix(key, "gone"):
			w.WriteHeader(http.StatusGone)
		case strings.HasPrefix(key, "redirect"):
			http.Redirect(w, r, "/lookup/applied", http.StatusFound)
		case strings.HasPrefix(key, "slow"):
			select {
			case <-s.release:
			case <-r.Context().Done():
			}
		default:
			http.Error(w, "boom", http.StatusInternalServerError)
		}
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(func() {
		close(s.release)
		s.Close()
	})
	return s
}

// requests returns the lookups received so far.
func (s *lookupServer) requests() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.asked...)
}

func TestHTTPReconcilerAnswers(t *testing.T) {
	t.Parallel()
	srv := newLookupServer(t)
	tmpl, err := ParseURLTemplate(srv.URL + "/lookup/{key}?method={method}&path={path}&scope={scope}")
	if err != nil {
		t.Fatal(err)
	}
	reconcile := HTTPReconciler(tmpl, &HTTPConfig{
		Header:  http.Header{"Authorization": {"Bearer s3cret"}, "X-Tenant": {"t1", "t2"}},
		Timeout: 200 * time.Millisecond,
		MaxBody: 100,
	})
	replay := &idemstore.Response{Status: http.StatusCreated, Body: []byte(lookupBody),
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/orders/ord_1"}}}
	tests := []struct {
		key     string
		want    Resolution
		wantErr string
	}{
		{key: "applied/1?x&y#z", want: Resolution{State: idemstore.StateCompleted, Response: replay}},
		{key: "big", want: Resolution{State: idemstore.StateCompleted}}, // not replayable
		{key: "missing 1", want: Resolution{State: idemstore.StateReleased}},
		{key: "gone+1", want: Resolution{State: idemstore.StateReleased}},
		{key: "broken%1", wantErr: "the lookup answered 500 Internal Server Error"},
		{key: "redirect", wantErr: "the lookup answered 302 Found"},
		{key: "slow", wantErr: "no answer to the lookup within 200ms"},
	}
	for _, tt := range tests {
		rec := &idemstore.Record{Identity: idemstore.Identity{Scope: "acme/eu", Endpoint: "POST /v1/orders", Key: tt.key}, State: idemstore.StateUnknown}
		got, err := reconcile(t.Context(), rec)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("key %q: %+v, %v; want an error containing %q", tt.key, got, err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), tt.key) {
				t.Errorf("key %q: the error names the key: %v", tt.key, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("key %q: %+v, %v; want %+v", tt.key, got, err, tt.want)
		}
	}

	asked := srv.requests()
	if len(asked) != len(tests) {
		t.Fatalf("%d lookups, want %d (a redirect is not followed)", len(asked), len(tests))
	}
	for i, r := range asked {
		q := r.URL.Query()
		if r.Method != http.MethodGet || r.PathValue("key") != tests[i].key || q.Get("method") != "POST" ||
			q.Get("path") != "/v1/orders" || q.Get("scope") != "acme/eu" {
			t.Errorf("lookup %d: %s %s (key %q, query %v); want GET of key %q", i, r.Method, r.URL, r.PathValue("key"), q, tests[i].key)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer s3cret" {
			t.Errorf("lookup %d: Authorization %q", i, got)
		}
		if got := r.Header.Values("X-Tenant"); !reflect.DeepEqual(got, []string{"t1", "t2"}) {
			t.Errorf("lookup %d: X-Tenant %q", i, got)
		}
		if got := r.Header.Get("User-Agent"); got != "idem-reconciler" {
			t.Errorf("lookup %d: User-Agent %q", i, got)
		}
	}
}

func TestHTTPReconcilerNoAnswer(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close() // nothing listens there any more
	tmpl, err := ParseURLTemplate(addr + "/lookup/{key}")
	if err != nil {
		t.Fatal(err)
	}
	rec := &idemstore.Record{Identity: idemstore.Identity{Endpoint: "POST /v1/orders", Key: "secret-key"}}
	got, err := HTTPReconciler(tmpl, nil)(t.Context(), rec)
	if err == nil || got != (Resolution{}) || !strings.HasPrefix(err.Error(), "lookup failed: ") || strings.Contains(err.Error(), "secret-key") {
		t.Errorf("lookup of a closed server: %+v, %v; want an error without the key", got, err)
	}
}

func TestHTTPReconcilerHostHeader(t *testing.T) {
	t.Parallel()
	hosts := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts <- r.Host
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	tmpl, err := ParseURLTemplate(srv.URL + "/{key}")
	if err != nil {
		t.Fatal(err)
	}
	rec := &idemstore.Record{Identity: idemstore.Identity{Endpoint: "POST /", Key: "k"}}
	got, err := HTTPReconciler(tmpl, &HTTPConfig{Header: http.Header{"Host": {"api.internal"}}})(t.Context(), rec)
	want := Resolution{State: idemstore.StateCompleted, Response: &idemstore.Response{Status: http.StatusNoContent, Header: http.Header{}, Body: []byte{}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("resolution = %+v, %v; want %+v", got, err, want)
	}
	if h := <-hosts; h != "api.internal" {
		t.Errorf("Host = %q, want api.internal", h)
	}
}

// The HTTP reconciler in a Maintainer: every answer settles its record, the
// records it cannot settle stay unknown, and neither the keys nor the
// header's credential reach the logs.
func TestHTTPReconcilerInMaintainer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := newLookupServer(t)
	store := idemmem.New(nil)
	keys := []string{"applied-raw-client-key", "missing-raw-client-key", "broken-raw-client-key", "slow-raw-client-key"}
	for _, k := range keys {
		id := idemstore.Identity{Scope: "acme", Endpoint: "POST /v1/orders", Key: k}
		if _, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t-" + k,
			Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
			t.Fatal(err)
		}
	}
	tmpl, err := ParseURLTemplate(srv.URL + "/lookup/{key}?scope={scope}")
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	m := New(store, &Config{
		Logger:    logs.logger(),
		Reconcile: HTTPReconciler(tmpl, &HTTPConfig{Header: http.Header{"Authorization": {"Bearer s3cret"}}, Timeout: 100 * time.Millisecond}),
		Grace:     -1, // the leases ended at once, and nothing was sent
	})
	if n, err := m.Sweep(ctx); err != nil || n != len(keys) {
		t.Fatalf("Sweep = %d, %v", n, err)
	}
	res, err := m.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempted != 4 || res.Completed != 1 || res.Released != 1 || res.Unresolved != 2 || res.Errors != 2 {
		t.Errorf("result = %+v; want 4 attempted, 1 completed, 1 released, 2 unresolved with errors", res)
	}
	want := map[string]idemstore.State{keys[0]: idemstore.StateCompleted, keys[1]: idemstore.StateReleased,
		keys[2]: idemstore.StateUnknown, keys[3]: idemstore.StateUnknown}
	for k, state := range want {
		rec, err := store.KeyGet(ctx, idemstore.Identity{Scope: "acme", Endpoint: "POST /v1/orders", Key: k})
		if err != nil || rec.State != state {
			t.Fatalf("%s: %+v, %v; want %s", k, rec, err, state)
		}
		if state == idemstore.StateCompleted && (rec.Response == nil || string(rec.Response.Body) != lookupBody || rec.Response.Status != http.StatusCreated) {
			t.Errorf("%s: stored response %+v, want the lookup's answer", k, rec.Response)
		}
	}
	if failed := logs.lines(t, "reconciler failed"); len(failed) != 2 {
		t.Errorf("%d lines say the reconciler failed, want 2:\n%s", len(failed), logs.String())
	}
	logs.requireNoRawKeys(t)
	if strings.Contains(logs.String(), "s3cret") {
		t.Errorf("the lookup's credential reached the logs:\n%s", logs.String())
	}
}

// The default allow-list is the middleware's.
func TestHTTPReconcilerStoredHeadersDefault(t *testing.T) {
	t.Parallel()
	if want := idem.DefaultStoredHeaders(); !reflect.DeepEqual(defaultStoredHeaders, want) {
		t.Errorf("defaultStoredHeaders = %v, idem.DefaultStoredHeaders() = %v", defaultStoredHeaders, want)
	}
	c := (*HTTPConfig)(nil).withDefaults()
	if c.Timeout != DefaultLookupTimeout || c.MaxBody != DefaultLookupMaxBody || c.Client == nil || c.Client.CheckRedirect == nil {
		t.Errorf("defaults = %+v", c)
	}
	if err := c.Client.CheckRedirect(nil, nil); err != http.ErrUseLastResponse {
		t.Errorf("the default client follows redirects: %v", err)
	}
}

// Headers the middleware never stores are never stored from a lookup
// either, even when the allow-list names them: Idem-Sealed above all, which
// would make the stored answer look sealed (and, without a keyring, refused
// as sealed under a key nobody has).
func TestHTTPReconcilerNeverStores(t *testing.T) {
	t.Parallel()
	never := []string{"Idem-Sealed", "Set-Cookie", "Authorization", "Idempotent-Replayed", "Content-Length", "Transfer-Encoding"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Idem-Sealed", "v1 k1")
		h.Set("Set-Cookie", "session=abc")
		h.Set("Authorization", "Bearer x")
		h.Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(lookupBody))
	}))
	t.Cleanup(srv.Close)
	tmpl, err := ParseURLTemplate(srv.URL + "/lookup/{key}")
	if err != nil {
		t.Fatal(err)
	}
	reconcile := HTTPReconciler(tmpl, &HTTPConfig{StoredHeaders: append([]string{"Content-Type"}, never...)})
	rec := &idemstore.Record{Identity: idemstore.Identity{Endpoint: "POST /v1/orders", Key: "applied"}, State: idemstore.StateUnknown}
	got, err := reconcile(t.Context(), rec)
	if err != nil || got.State != idemstore.StateCompleted || got.Response == nil {
		t.Fatalf("reconcile = %+v, %v; want completed with a response", got, err)
	}
	for _, name := range never {
		if v, ok := got.Response.Header[name]; ok {
			t.Errorf("the stored answer keeps %s: %q", name, v)
		}
	}
	if got.Response.Header.Get("Content-Type") != "application/json" {
		t.Errorf("stored header %v, want Content-Type kept", got.Response.Header)
	}
}
