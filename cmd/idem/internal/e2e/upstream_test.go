package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// upstream is the API behind the proxies: it counts its executions per
// Idempotency-Key (which the proxy forwards) and answers 201 with a body
// unique to the execution, so a replay can be told from a second run.
type upstream struct {
	*httptest.Server
	delay   time.Duration
	block   chan struct{} // when not nil, every execution waits for it to close
	entered chan string   // receives the key of every execution

	mu     sync.Mutex
	runs   map[string]int
	serial int
}

func newUpstream(t *testing.T, delay time.Duration, block chan struct{}) *upstream {
	t.Helper()
	u := &upstream{delay: delay, block: block, entered: make(chan string, 1024), runs: make(map[string]int)}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idem.HeaderKey)
	io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.runs[key]++
	u.serial++
	n := u.serial
	u.mu.Unlock()
	select {
	case u.entered <- key:
	default:
	}
	time.Sleep(u.delay) // the upstream's work
	if u.block != nil {
		select {
		case <-u.block:
		case <-r.Context().Done(): // the proxy died
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/v1/payments/%d", n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"payment":%d,"nonce":%q}`, n, randomHex(8))
}

// executions returns how many times key was executed.
func (u *upstream) executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

// total returns the number of executions of all keys.
func (u *upstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.serial
}

// downstream is the external service the phases call. It honours its own
// Idempotency-Key: the effect of a call happens when its key is first seen,
// and a repeated key is answered without a second effect. It records every
// call and every effect.
type downstream struct {
	*httptest.Server

	mu      sync.Mutex
	calls   map[string]int      // calls per key
	effects map[string][]string // phase -> keys whose effect happened, in order
}

func newDownstream(t *testing.T) *downstream {
	t.Helper()
	d := &downstream{calls: make(map[string]int), effects: make(map[string][]string)}
	d.Server = httptest.NewServer(http.HandlerFunc(d.serve))
	t.Cleanup(d.Close)
	return d
}

func (d *downstream) serve(w http.ResponseWriter, r *http.Request) {
	key, phase := r.Header.Get(idem.HeaderKey), r.Header.Get("X-Phase")
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	d.mu.Lock()
	d.calls[key]++
	if d.calls[key] == 1 {
		d.effects[phase] = append(d.effects[phase], key) // the effect
	}
	d.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}
