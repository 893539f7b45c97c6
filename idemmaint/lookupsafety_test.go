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
	m := New(store, &Config{Logger: logs.logger(), Reconcile: HTTPReconciler(tmpl, &HTTPConfig{Client: &http.Client{}})})
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
