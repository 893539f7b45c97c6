package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
)

// AttemptHeader carries a client attempt's id through the proxy to the
// upstream, so that every execution names the attempt that caused it.
const AttemptHeader = "X-Chaos-Attempt"

// FenceHeader is the header in which `idem proxy` sends the attempt's
// fencing token to the upstream, when it does (SPEC section 3).
const FenceHeader = "Idempotency-Attempt"

// LookupPath is the upstream's reconciliation lookup: GET LookupPath+{key}.
const LookupPath = "/lookup/"

// requestBody is what the clients send: the key again and which of its two
// bodies this is.
type requestBody struct {
	Key  string `json:"key"`
	Body string `json:"body"`
}

// answerBody is the upstream's answer to an execution, and to a lookup of
// an applied key: the same bytes, so that a record the reconciler settles
// replays the original answer.
type answerBody struct {
	Execution string `json:"execution"`
	Key       string `json:"key"`
	Attempt   int    `json:"attempt"`
}

// Upstream is the API behind the proxies. It records every execution in
// the history before it answers (so its log is complete even when a proxy
// dies mid-request), fails a share of them with a 500 that applies
// nothing, and answers the reconciler's lookup from that log: 201 with the
// original answer for an applied key, 404 when nothing was applied. A
// lookup that finds an execution of its key still running waits for it
// (up to LookupWait), as an API that looks up under the key's lock would.
type Upstream struct {
	h *History
	// FailRate is the share of executions answered 500 (void).
	FailRate float64
	// Latency bounds the time an execution takes: uniform in [Min, Max],
	// plus the slow-down set by Slow.
	MinLatency, MaxLatency time.Duration
	// LookupWait bounds how long a lookup waits for a running execution.
	LookupWait time.Duration

	slow atomic.Int64 // extra latency, ns

	mu      sync.Mutex
	rng     *rand.Rand
	changed chan struct{} // closed and replaced when an execution ends
}

// NewUpstream returns an upstream recording into h, its random choices
// drawn from seed.
func NewUpstream(h *History, seed uint64) *Upstream {
	return &Upstream{
		h: h, FailRate: 0.05, MinLatency: 2 * time.Millisecond, MaxLatency: 40 * time.Millisecond,
		LookupWait: 4 * time.Second,
		rng:        rand.New(rand.NewPCG(seed, 0x5eed)), changed: make(chan struct{}),
	}
}

// Slow adds d to every execution from now on (0 ends it): the slow
// upstream fault.
func (u *Upstream) Slow(d time.Duration) { u.slow.Store(int64(d)) }

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && len(r.URL.Path) > len(LookupPath) && r.URL.Path[:len(LookupPath)] == LookupPath {
		u.lookup(w, r, r.URL.Path[len(LookupPath):])
		return
	}
	u.execute(w, r)
}

func (u *Upstream) execute(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	var body requestBody
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	attempt := 0
	fmt.Sscan(r.Header.Get(AttemptHeader), &attempt)
	e := u.h.Executed(r.Header.Get(idem.HeaderKey), body.Body, attempt, r.Header.Get(FenceHeader))
	u.mu.Lock()
	fail := u.rng.Float64() < u.FailRate
	d := u.MinLatency + time.Duration(u.rng.Int64N(int64(u.MaxLatency-u.MinLatency)+1))
	u.mu.Unlock()
	time.Sleep(d + time.Duration(u.slow.Load())) // the upstream's work
	status := http.StatusCreated
	if fail {
		status = http.StatusInternalServerError
	}
	u.h.Answered(e, status) // committed before it is told
	u.mu.Lock()
	close(u.changed)
	u.changed = make(chan struct{})
	u.mu.Unlock()
	writeAnswer(w, status, e)
}

func writeAnswer(w http.ResponseWriter, status int, e *Execution) {
	b, _ := json.Marshal(answerBody{Execution: e.ID, Key: e.Key, Attempt: e.Attempt})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

func (u *Upstream) lookup(w http.ResponseWriter, r *http.Request, key string) {
	deadline := time.NewTimer(u.LookupWait)
	defer deadline.Stop()
	for {
		u.mu.Lock()
		changed := u.changed
		u.mu.Unlock()
		applied, running := u.h.KeyState(key)
		l := Lookup{Key: key, At: time.Now()}
		switch {
		case applied != nil:
			l.Status, l.Exec = http.StatusCreated, applied.ID
			u.h.LookedUp(l)
			writeAnswer(w, http.StatusCreated, applied)
			return
		case !running:
			l.Status = http.StatusNotFound
			u.h.LookedUp(l)
			w.WriteHeader(http.StatusNotFound)
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-deadline.C:
			l.Status = http.StatusServiceUnavailable
			u.h.LookedUp(l)
			w.WriteHeader(http.StatusServiceUnavailable) // still running: ask again later
			return
		}
	}
}
