// Package benchkit holds what the middleware benchmarks of every store share:
// a ~200-byte JSON payment request and the trivial handler it goes to, so
// the figures of the root package, idempgx and idemredis measure the same
// request.
package benchkit

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Body is a ~200-byte JSON payment request.
const Body = `{"customer_id":"cus_8f14e45fceea167a5a36dedd4bea2543","amount_cents":129900,"currency":"EUR",` +
	`"description":"Order 2026-11-25 #48213","metadata":{"order_id":"48213","channel":"web"},"capture":true}`

// Handler reads the body and answers 201 with a small JSON payment.
var Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"pay_1","status":"pending","amount_cents":129900,"currency":"EUR"}`)
})

// Request is a POST /v1/payments of Body with key (none when empty).
func Request(key string) *http.Request {
	return RequestBody(key, Body)
}

// RequestBody is a POST /v1/payments of body with key (none when empty).
func RequestBody(key, body string) *http.Request {
	r := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

// BodyN is Body with order number i (modulo 100,000): the new-key
// benchmarks give every request its own body, as clients do, so the
// middleware's fingerprint cache does not spare them the canonicalisation.
func BodyN(i int64) string {
	return strings.ReplaceAll(Body, "48213", fmt.Sprintf("%05d", i%100000))
}

// DiscardLogger logs nothing.
func DiscardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// RawVariants are the two forms of the Raw benchmarks: the statements
// alone (the comparison SPEC's ratio is about), and the statements plus the
// work every request does with or without idem in these benchmarks:
// building the httptest request and recorder and running the bare handler.
// The second shows how much of the gap is the benchmark's own HTTP
// scaffolding rather than the middleware.
var RawVariants = []struct {
	Name    string
	Handler bool
}{{"statements", false}, {"with_handler", true}}

// BareRequest runs the bare handler on a new request with key and body, as
// the middleware benchmarks do around the middleware.
func BareRequest(key, body string) {
	Handler.ServeHTTP(httptest.NewRecorder(), RequestBody(key, body))
}

// Recorder keeps what a driver hook sees while it is on, so a benchmark can
// learn the exact statements or commands one request sends and replay them
// in a raw loop.
type Recorder[T any] struct {
	on   atomic.Bool
	mu   sync.Mutex
	seen []T
}

// Add keeps v when the recorder is on; hooks call it for everything they
// see.
func (r *Recorder[T]) Add(v func() T) {
	if r.on.Load() {
		r.mu.Lock()
		r.seen = append(r.seen, v())
		r.mu.Unlock()
	}
}

// Record returns what the hooks added while f ran.
func (r *Recorder[T]) Record(f func()) []T {
	r.mu.Lock()
	r.seen = nil
	r.mu.Unlock()
	r.on.Store(true)
	f()
	r.on.Store(false)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen
}

// Parallelism returns def, or the value of IDEM_BENCH_PARALLELISM when it
// is a positive integer: the b.SetParallelism of the benchmarks that take
// it, so that a run can put another number of requests in flight (16 on
// two processors, say) without editing them.
func Parallelism(def int) int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_BENCH_PARALLELISM")); err == nil && n > 0 {
		return n
	}
	return def
}
