package idemclient_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemclient"
)

// The server is busy with the first attempt and answers 409 key-in-use; the
// client waits as Retry-After says and sends the same key again, which gets
// the stored answer of the first execution.
func ExampleClient_Do() {
	var mu sync.Mutex
	calls := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.Header.Get("Idempotency-Key")]++
		n := calls[r.Header.Get("Idempotency-Key")]
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"title":"Key in use","status":409,"code":"key-in-use"}`)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"payment":"pay_1"}`)
	}))
	defer srv.Close()

	client := idemclient.NewClient()
	client.RetryWaitMin, client.RetryWaitMax = 10*time.Millisecond, 100*time.Millisecond

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", strings.NewReader(`{"amount_cents":1200}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status, string(body))
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("attempts:", resp.Attempts, "replayed:", resp.Replayed, "keys used:", len(calls))
	// Output:
	// 201 Created {"payment":"pay_1"}
	// attempts: 2 replayed: true keys used: 1
}
