package idemmaint

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// ordersMux is an orders API served by Go's http.ServeMux, which cleans
// paths: its lookup by key, GET /orders/by-key/{key}, knows the keys in
// known; GET /orders/ lists every order; anything else is 404. It records
// every request that reached a handler, by route.
type ordersMux struct {
	*httptest.Server
	known map[string]bool

	mu     sync.Mutex
	byKey  []string // the key of each lookup by key
	others []string // the path of every other request
}

func newOrdersMux(t *testing.T, known ...string) *ordersMux {
	t.Helper()
	s := &ordersMux{known: make(map[string]bool)}
	for _, k := range known {
		s.known[k] = true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /orders/by-key/{key}", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		s.mu.Lock()
		s.byKey = append(s.byKey, key)
		s.mu.Unlock()
		if !s.known[key] {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"order_for_key": key})
	})
	mux.HandleFunc("GET /orders/", func(w http.ResponseWriter, r *http.Request) {
		s.other(r)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`[{"order":"ord_1"},{"order":"ord_2"}]`))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.other(r)
		http.NotFound(w, r)
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func (s *ordersMux) other(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.others = append(s.others, r.URL.Path)
}

// seen returns the keys looked up by key and the paths of the other
// requests.
func (s *ordersMux) seen() (byKey, others []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.byKey...), append([]string(nil), s.others...)
}

// TestHTTPReconcilerKeyCannotChangeThePath looks up keys made of dots and
// slashes against a Go http.ServeMux. A key must never turn the lookup into
// a request for another path: /orders/by-key/.. is /orders/ once cleaned (a
// listing, 200: the record would complete with it) and a lone %2F is read
// by ServeMux as a trailing slash. Such a key is not looked up at all (it
// stays unknown with an error naming the reason, for an operator), a value
// made only of dots elsewhere is percent-encoded, and a redirect is never
// followed, even by a caller's client that follows redirects.
func TestHTTPReconcilerKeyCannotChangeThePath(t *testing.T) {
	t.Parallel()
	clients := map[string]*http.Client{
		"default client":             nil,
		"client following redirects": {}, // the zero Client follows up to 10 redirects
	}
	for name, client := range clients {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			up := newOrdersMux(t, ".", "..", "...", "/", "ord-1")
			inPath, err := ParseURLTemplate(up.URL + "/orders/by-key/{key}")
			if err != nil {
				t.Fatal(err)
			}
			reconcile := HTTPReconciler(inPath, &HTTPConfig{Client: client, Timeout: 5 * time.Second})
			for _, key := range []string{".", "..", "...", "/", "./..", "//"} {
				rec := &idemstore.Record{Identity: idemstore.Identity{Endpoint: "POST /orders", Key: key}, State: idemstore.StateUnknown}
				got, err := reconcile(t.Context(), rec)
				if err == nil || got != (Resolution{}) || !strings.Contains(err.Error(), "{key} would make a path segment of only dots or slashes") {
					t.Errorf("key %q in the path: %+v, %v; want it left unknown, not looked up", key, got, err)
				}
			}
			byKey, others := up.seen()
			if len(byKey) != 0 || len(others) != 0 {
				t.Errorf("the upstream was asked about keys %q and paths %q; want nothing", byKey, others)
			}

			// An ordinary key still works, and a redirect is an answer.
			rec := &idemstore.Record{Identity: idemstore.Identity{Endpoint: "POST /orders", Key: "ord-1"}}
			if got, err := reconcile(t.Context(), rec); err != nil || got.State != idemstore.StateCompleted ||
				string(got.Response.Body) != `{"order_for_key":"ord-1"}`+"\n" {
				t.Errorf("key ord-1: %+v, %v; want completed with its order", got, err)
			}
			redirected, err := ParseURLTemplate(up.URL + "/orders/by-key/x/../{key}")
			if err != nil {
				t.Fatal(err)
			}
			got, err := HTTPReconciler(redirected, &HTTPConfig{Client: client})(t.Context(), rec)
			if err == nil || !strings.Contains(err.Error(), "the lookup answered 307 Temporary Redirect") || got != (Resolution{}) {
				t.Errorf("a lookup answered with a redirect: %+v, %v; want unknown, the redirect not followed", got, err)
			}

			// In the query, where no server cleans anything, every key is
			// looked up; an all-dot one percent-encoded.
			inQuery, err := ParseURLTemplate(up.URL + "/orders/by-key/q?key={key}")
			if err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{".", "..", "..."} {
				u, err := inQuery.Expand(idemstore.Identity{Key: key})
				if want := up.URL + "/orders/by-key/q?key=" + strings.Repeat("%2E", len(key)); err != nil || u != want {
					t.Errorf("Expand(%q) = %q, %v; want %q", key, u, err, want)
				}
			}
			if client != nil && client.CheckRedirect != nil {
				t.Errorf("HTTPReconciler changed the caller's client")
			}
			byKey, others = up.seen()
			if len(byKey) != 1 || byKey[0] != "ord-1" || len(others) != 0 {
				t.Errorf("the upstream was asked about keys %q and paths %q; want the lookup of ord-1 only", byKey, others)
			}
		})
	}
}

// The same keys through a Maintainer: they stay unknown with the reason as
// their reconcile error, counted as failed attempts, and the lookup's
// answer for another path never settles them.
func TestHTTPReconcilerDotKeysStayUnknown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	up := newOrdersMux(t, ".", "..", "...", "/")
	store := idemmem.New(nil)
	keys := []string{".", "..", "...", "/"}
	for _, k := range keys {
		id := idemstore.Identity{Scope: "acme", Endpoint: "POST /orders", Key: k}
		if _, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t-" + k,
			Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
			t.Fatal(err)
		}
	}
	tmpl, err := ParseURLTemplate(up.URL + "/orders/by-key/{key}?scope={scope}")
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	m := New(store, &Config{Logger: logs.logger(), Grace: -1, Reconcile: HTTPReconciler(tmpl, &HTTPConfig{Client: &http.Client{}})})
	res, err := m.Reconcile(ctx)
	if err != nil || res.Attempted != len(keys) || res.Errors != len(keys) || res.Completed+res.Released != 0 {
		t.Fatalf("Reconcile = %+v, %v; want every attempt failed", res, err)
	}
	for _, k := range keys {
		rec, err := store.KeyGet(ctx, idemstore.Identity{Scope: "acme", Endpoint: "POST /orders", Key: k})
		if err != nil || rec.State != idemstore.StateUnknown || !strings.Contains(rec.ReconcileError, "path segment of only dots or slashes") {
			t.Errorf("key %q: %+v, %v; want unknown with the reason", k, rec, err)
		}
	}
	if byKey, others := up.seen(); len(byKey)+len(others) != 0 {
		t.Errorf("the upstream was asked about keys %q and paths %q; want nothing", byKey, others)
	}
}

// tenantOrders is an orders API with one order, order-42 of tenant B:
// GET /tenants/{tenant}/orders/by-key/{key} looks it up for a tenant, GET
// /orders/by-key/{key} by key alone. It records every lookup's path.
func newTenantOrders(t *testing.T) (*httptest.Server, func() []string) {
	t.Helper()
	var (
		mu    sync.Mutex
		paths []string
	)
	answer := func(w http.ResponseWriter, r *http.Request, tenant string) {
		mu.Lock()
		paths = append(paths, r.URL.EscapedPath())
		mu.Unlock()
		if r.PathValue("key") != "order-42" || tenant != "" && tenant != "tenant-b" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"order":"order-42","tenant":"tenant-b"}`))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /tenants/{tenant}/orders/by-key/{key}", func(w http.ResponseWriter, r *http.Request) {
		answer(w, r, r.PathValue("tenant"))
	})
	mux.HandleFunc("GET /orders/by-key/{key}", func(w http.ResponseWriter, r *http.Request) { answer(w, r, "") })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), paths...)
	}
}

// TestHTTPReconcilerKeepsTheScope: tenants A and B each have an unknown
// order-42. A template without {scope} would settle A's record with B's
// answer, and A's retries would replay B's order: it is refused for scoped
// records (they stay unknown, nothing asked) unless Unscoped says the
// upstream's keys are global. With {scope}, each tenant gets its own answer.
func TestHTTPReconcilerKeepsTheScope(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, asked := newTenantOrders(t)
	a := idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /orders", Key: "order-42"}
	b := idemstore.Identity{Scope: "tenant-b", Endpoint: "POST /orders", Key: "order-42"}
	unscoped := idemstore.Identity{Endpoint: "POST /orders", Key: "order-42"}
	bAnswer := `{"order":"order-42","tenant":"tenant-b"}`
	setup := func(t *testing.T, tmpl *URLTemplate) (*idemmem.Store, ReconcileResult) {
		t.Helper()
		store := idemmem.New(nil)
		for _, id := range []idemstore.Identity{a, b} {
			if _, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t",
				Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
				t.Fatal(err)
			}
		}
		res, err := New(store, &Config{Logger: (&logBuffer{}).logger(), Grace: -1, Reconcile: HTTPReconciler(tmpl, nil)}).Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return store, res
	}
	get := func(t *testing.T, store *idemmem.Store, id idemstore.Identity) *idemstore.Record {
		t.Helper()
		rec, err := store.KeyGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}

	byKey, err := ParseURLTemplate(srv.URL + "/orders/by-key/{key}")
	if err != nil {
		t.Fatal(err)
	}
	if byKey.HasScope() {
		t.Errorf("HasScope of a template without {scope}")
	}
	store, res := setup(t, byKey)
	if res.Errors != 2 || res.Completed+res.Released != 0 {
		t.Errorf("template without {scope}: %+v; want both records left unknown", res)
	}
	for _, id := range []idemstore.Identity{a, b} {
		if rec := get(t, store, id); rec.State != idemstore.StateUnknown ||
			!strings.Contains(rec.ReconcileError, "the record is scoped and the template has no {scope}") {
			t.Errorf("%s: %s, error %q; want unknown, the scope named as the reason", id.Scope, rec.State, rec.ReconcileError)
		}
	}
	if p := asked(); len(p) != 0 {
		t.Fatalf("the upstream was asked %q; want nothing", p)
	}
	if _, err := byKey.Expand(a); err == nil {
		t.Errorf("Expand of a scoped record without {scope}: no error")
	}
	if u, err := byKey.Expand(unscoped); err != nil || u != srv.URL+"/orders/by-key/order-42" {
		t.Errorf("Expand of an unscoped record = %q, %v", u, err)
	}

	// The upstream's keys are global: the operator says so.
	global := byKey.Unscoped()
	if byKey.HasScope() || global.HasScope() {
		t.Errorf("HasScope of a template without {scope}")
	}
	if _, err := byKey.Expand(a); err == nil {
		t.Errorf("Unscoped changed the template it was called on")
	}
	store, res = setup(t, global)
	if res.Completed != 2 || get(t, store, a).State != idemstore.StateCompleted {
		t.Errorf("unscoped template: %+v; want both records completed with the global answer", res)
	}

	// With {scope}, each tenant gets its own answer.
	scoped, err := ParseURLTemplate(srv.URL + "/tenants/{scope}/orders/by-key/{key}")
	if err != nil {
		t.Fatal(err)
	}
	if !scoped.HasScope() {
		t.Errorf("HasScope of a template with {scope}")
	}
	store, res = setup(t, scoped)
	if res.Completed != 1 || res.Released != 1 {
		t.Errorf("template with {scope}: %+v; want one completed, one released", res)
	}
	if rec := get(t, store, a); rec.State != idemstore.StateReleased {
		t.Errorf("tenant A: %s; want released, B's order is not A's", rec.State)
	}
	if rec := get(t, store, b); rec.State != idemstore.StateCompleted || string(rec.Response.Body) != bAnswer {
		t.Errorf("tenant B: %+v; want completed with its order", rec)
	}
}
