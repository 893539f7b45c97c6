package idemsqlite_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
)

// The embedded default: one file, durable (WAL, synchronous=FULL), its
// schema migrated on Open. A retry after a restart is still a replay.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "idem.db")

	charges := 0
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, charges)
	})
	for run := range 2 { // the second run is the process restarted
		store, err := idemsqlite.Open(path, nil)
		if err != nil {
			panic(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", "order-1")
		w := httptest.NewRecorder()
		idem.New(store, nil)(handler).ServeHTTP(w, r)
		fmt.Printf("run %d: %d %s replayed=%q\n", run+1, w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
		store.Close()
	}
	// Output:
	// run 1: 201 {"charge":1} replayed=""
	// run 2: 201 {"charge":1} replayed="true"
}
