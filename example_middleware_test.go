package idem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// Wrap a handler and send the same request twice: the second answer is the
// stored response, marked Idempotent-Replayed.
func Example_middleware() {
	charges := 0
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, charges)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", idem.New(idemmem.New(nil), &idem.Config{RequireKey: true})(pay))

	for range 2 {
		r := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{"amount_cents":500}`))
		r.Header.Set("Idempotency-Key", "order-48213")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		body, _ := io.ReadAll(w.Body)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), string(body))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201  {"id":"pay_1"}
	// 201 true {"id":"pay_1"}
	// charges: 1
}
