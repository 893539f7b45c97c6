package idemcache_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemcache"
	"github.com/idem-dev/idem/idemmem"
)

// Example_lru puts an in-process LRU in front of a store: the first replay
// of a key fills the cache, later replays are answered from it.
func Example_lru() {
	store := idemcache.New(idemmem.New(nil), idemcache.NewLRU(10_000, 64<<20), nil)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_1"}`)
	})
	srv := httptest.NewServer(idem.New(store, nil)(handler))
	defer srv.Close()

	for range 3 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Idempotency-Key", "order-42")
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// 201 {"id":"pay_1"} replayed: false
	// 201 {"id":"pay_1"} replayed: true
	// 201 {"id":"pay_1"} replayed: true
}
