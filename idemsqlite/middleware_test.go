package idemsqlite_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// paymentsService is a handler in transactional mode on the embedded store:
// it inserts a payment through the request's transaction and fails with 500
// when asked to.
func paymentsService(t *testing.T) (*idemsqlite.Store, http.Handler, func() int) {
	t.Helper()
	s := openStore(t, nil)
	if _, err := s.DB().Exec("CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idemsqlite.TxFromContext(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		res, err := tx.ExecContext(r.Context(), "INSERT INTO payments (amount) VALUES (1000)")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.Header.Get("X-Fail") != "" {
			http.Error(w, "provider down", http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	count := func() int {
		t.Helper()
		var n int
		if err := s.DB().QueryRow("SELECT count(*) FROM payments").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return s, idem.New(s, &idem.Config{GuardConfig: idem.GuardConfig{Transactional: true}})(h), count
}

func post(h http.Handler, key string, fail bool) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1000}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, key)
	if fail {
		req.Header.Set("X-Fail", "1")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestMiddlewareTransactional(t *testing.T) {
	t.Parallel()
	s, h, count := paymentsService(t)

	first := post(h, "k1", false)
	if first.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", first.Code, first.Body)
	}
	replay := post(h, "k1", false)
	if replay.Code != http.StatusCreated || replay.Body.String() != first.Body.String() ||
		replay.Header().Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("replay: %d %q %v, want the first answer replayed", replay.Code, replay.Body, replay.Header())
	}
	if n := count(); n != 1 {
		t.Fatalf("%d payments after a request and its replay, want 1", n)
	}

	// A failure rolls the payment back and releases the key.
	if rec := post(h, "k2", true); rec.Code != http.StatusInternalServerError {
		t.Fatalf("failing request: %d %s", rec.Code, rec.Body)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d payments after a failed request, want 1 (rolled back)", n)
	}
	var id idemstore.Identity
	recs, err := s.KeyList(t.Context(), &idemstore.ListParams{State: idemstore.StateReleased})
	if err != nil || len(recs) != 1 || recs[0].Key != "k2" {
		t.Fatalf("released records = %v, %v; want k2", recs, err)
	}
	id = recs[0].Identity
	if rec := post(h, "k2", false); rec.Code != http.StatusCreated {
		t.Fatalf("retry after the failure: %d %s", rec.Code, rec.Body)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d payments after the retry, want 2", n)
	}
	r, err := s.KeyGet(t.Context(), id)
	if err != nil || r.State != idemstore.StateCompleted || r.Attempts != 2 {
		t.Fatalf("k2 after the retry: %+v, %v; want completed after 2 attempts", r, err)
	}
}

func TestMiddlewareTransactionalConcurrent(t *testing.T) {
	t.Parallel()
	_, h, count := paymentsService(t)
	const requests = 50
	codes := make([]int, requests)
	bodies := make([]string, requests)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range requests {
		wg.Go(func() {
			<-start
			rec := post(h, "same-key", false)
			codes[i], bodies[i] = rec.Code, rec.Body.String()
		})
	}
	close(start)
	wg.Wait()
	created := ""
	for i, code := range codes {
		switch code {
		case http.StatusCreated:
			if created != "" && bodies[i] != created {
				t.Fatalf("two different 201 answers: %s and %s", created, bodies[i])
			}
			created = bodies[i]
		case http.StatusConflict:
		default:
			t.Fatalf("request %d: %d %s", i, code, bodies[i])
		}
	}
	if created == "" {
		t.Fatal("no request created the payment")
	}
	if n := count(); n != 1 {
		t.Fatalf("%d concurrent requests with one key made %d payments, want 1", requests, n)
	}
}
