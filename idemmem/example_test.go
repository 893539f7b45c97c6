package idemmem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// The memory store behind the middleware, as in tests and local
// development: the second request with the key is a replay of the first.
func ExampleNew() {
	charges := 0
	h := idem.New(idemmem.New(nil), nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, charges)
	}))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", "order-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d %s replayed=%q\n", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge":1} replayed=""
	// 201 {"charge":1} replayed="true"
	// charges: 1
}

// In transactional mode the handler's writes (here, string values of the
// store's copy-on-write transaction) commit with the key's completion, and
// a failed request leaves nothing behind.
func ExampleTxFromContext() {
	store := idemmem.New(nil)
	h := idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Transactional: true}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idemmem.TxFromContext(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		tx.Put("balance/"+r.Header.Get("Idempotency-Key"), "100")
		if r.URL.Query().Get("fail") != "" {
			w.WriteHeader(http.StatusServiceUnavailable) // rolls the write back
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	for _, target := range []string{"/v1/credits?fail=1", "/v1/credits"} {
		r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "credit-"+fmt.Sprint(len(target)))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(target, w.Code, store.Values())
	}
	// Output:
	// /v1/credits?fail=1 503 map[]
	// /v1/credits 201 map[balance/credit-11:100]
}
