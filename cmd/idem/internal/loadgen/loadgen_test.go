package loadgen

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// server is an httptest server with the idem middleware on the memory store
// in front of a handler that counts its executions per key, and a count of
// the requests that arrived per key.
type server struct {
	*httptest.Server
	mu       sync.Mutex
	arrived  map[string]int // before the middleware
	executed map[string]int // by the handler
	bodies   map[string]bool
}

func newServer(t *testing.T) *server {
	t.Helper()
	s := &server{arrived: make(map[string]int), executed: make(map[string]int), bodies: make(map[string]bool)}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.executed[r.Header.Get("Idempotency-Key")]++
		s.bodies[string(body)] = true
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_1"}`)
	})
	mw := idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{Logger: discardLogger()}})(handler)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.arrived[r.Header.Get("Idempotency-Key")]++
		s.mu.Unlock()
		mw.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestRunPlan(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	const keys, dups = 20, 5
	res, err := Run(t.Context(), &Config{URL: s.URL, Concurrency: 4, Keys: keys, Duplicates: dups})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != keys*dups || res.Responses != keys*dups || res.Errors != 0 {
		t.Fatalf("requests %d, responses %d, errors %d (%v); want %d answered", res.Requests, res.Responses, res.Errors, res.FirstError, keys*dups)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.arrived) != keys {
		t.Errorf("%d distinct keys arrived, want %d", len(s.arrived), keys)
	}
	for k, n := range s.arrived {
		if n != dups {
			t.Errorf("key %s arrived %d times, want %d", k, n, dups)
		}
		if s.executed[k] != 1 {
			t.Errorf("key %s executed %d times, want 1", k, s.executed[k])
		}
	}
	// Every duplicate is a replay, or a 409 when it met its key in progress.
	if got := res.Status[http.StatusCreated] + res.Status[http.StatusConflict]; got != keys*dups || len(res.Status) > 2 {
		t.Errorf("status counts %v, want only 201 and 409, %d in all", res.Status, keys*dups)
	}
	if got, want := res.Replayed["true"], res.Status[http.StatusCreated]-keys; got != want {
		t.Errorf("%d replayed answers, want the %d 201s that did not execute", got, want)
	}
	if got, want := res.Replayed[""], keys+res.Status[http.StatusConflict]; got != want {
		t.Errorf("%d answers without %s, want %d (first executions and 409s)", got, HeaderReplayed, want)
	}
	if res.Keys != keys || res.Duplicates != dups || res.Concurrency != 4 {
		t.Errorf("result describes keys %d, duplicates %d, concurrency %d", res.Keys, res.Duplicates, res.Concurrency)
	}
	if !s.bodies[DefaultBody] || len(s.bodies) != 1 {
		t.Errorf("bodies received %v, want only the default body", s.bodies)
	}
	checkLatency(t, res)
}

func TestRunNewKeys(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	res, err := Run(t.Context(), &Config{
		URL: s.URL, Concurrency: 3, Requests: 50,
		Body: []byte(`{"a":1}`), Header: http.Header{"X-Tenant": {"t1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Responses != 50 || res.Errors != 0 || res.Status[http.StatusCreated] != 50 || res.Replayed[""] != 50 {
		t.Fatalf("responses %d, errors %d, status %v, replayed %v; want 50 new 201s", res.Responses, res.Errors, res.Status, res.Replayed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.executed) != 50 {
		t.Errorf("%d distinct keys executed, want 50", len(s.executed))
	}
	if !s.bodies[`{"a":1}`] || len(s.bodies) != 1 {
		t.Errorf("bodies received %v, want only the configured one", s.bodies)
	}
	checkLatency(t, res)
}

// checkLatency checks that the percentiles are in order and positive, and
// that the throughput agrees with the count and the time.
func checkLatency(t *testing.T, res *Result) {
	t.Helper()
	l := res.Latency
	if l.P50 <= 0 || l.P50 > l.P90 || l.P90 > l.P99 || l.P99 > l.Max || l.Mean <= 0 || l.Mean > l.Max {
		t.Errorf("latency %+v, want 0 < p50 <= p90 <= p99 <= max and 0 < mean <= max", l)
	}
	if l.Max > res.Elapsed {
		t.Errorf("max latency %v over the run's %v", l.Max, res.Elapsed)
	}
	if got, want := res.Throughput(), float64(res.Responses)/res.Elapsed.Seconds(); got != want {
		t.Errorf("throughput %v, want %v", got, want)
	}
}

func TestRunDuration(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	const d = 150 * time.Millisecond
	start := time.Now()
	res, err := Run(t.Context(), &Config{URL: s.URL, Concurrency: 2, Duration: d})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if res.Elapsed < d || took > d+5*time.Second {
		t.Errorf("run measured %v and took %v, want about %v", res.Elapsed, took, d)
	}
	if res.Responses == 0 || res.Errors != 0 || res.Status[http.StatusCreated] != res.Responses {
		t.Errorf("responses %d, errors %d (%v), status %v; want only 201s", res.Responses, res.Errors, res.FirstError, res.Status)
	}
}

func TestRunPlanCutByRequests(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	res, err := Run(t.Context(), &Config{URL: s.URL, Concurrency: 2, Keys: 10, Duplicates: 3, Requests: 7})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 7 {
		t.Errorf("%d requests, want the 7 asked for", res.Requests)
	}
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Close() // nothing listens any more
	res, err := Run(t.Context(), &Config{URL: s.URL, Concurrency: 2, Requests: 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 10 || res.Errors != 10 || res.Responses != 0 || res.FirstError == nil {
		t.Errorf("requests %d, errors %d (%v), responses %d; want 10 failed", res.Requests, res.Errors, res.FirstError, res.Responses)
	}
	if res.Latency != (Latency{}) {
		t.Errorf("latency %+v without answers, want zero", res.Latency)
	}
}

// A request that outlives Timeout counts as an error.
func TestRunTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body read, the server notices the client leaving.
		io.Copy(io.Discard, r.Body)
		select { // answers only when the client gives up
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs first
	res, err := Run(t.Context(), &Config{URL: srv.URL, Concurrency: 2, Requests: 2, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 2 || res.Responses != 0 || res.FirstError == nil || !strings.Contains(res.FirstError.Error(), "Timeout") {
		t.Errorf("errors %d (%v), responses %d; want 2 timeouts", res.Errors, res.FirstError, res.Responses)
	}
}

// A canceled context ends the run at once, requests in flight included.
func TestRunCanceled(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan *Result, 1)
	go func() {
		res, err := Run(ctx, &Config{URL: srv.URL, Concurrency: 2, Duration: time.Hour})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	<-arrived
	cancel()
	select {
	case res := <-done:
		if res != nil && (res.Errors == 0 || res.Responses != 0) {
			t.Errorf("errors %d, responses %d; want the requests in flight canceled", res.Errors, res.Responses)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestRunInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no URL", Config{Requests: 1}, "no URL"},
		{"unbounded", Config{URL: "http://x"}, "unbounded"},
		{"negative", Config{URL: "http://x", Requests: -1}, "negative"},
		{"duplicates without keys", Config{URL: "http://x", Requests: 1, Duplicates: 2}, "duplicates without"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Run(t.Context(), &tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	c := Config{Keys: 50, Duplicates: 4, KeyPrefix: "k-", Seed: 7}
	p := c.plan()
	if len(p) != 200 {
		t.Fatalf("plan of %d keys, want 200", len(p))
	}
	count := make(map[string]int)
	for _, k := range p {
		count[k]++
	}
	for i := range 50 {
		if n := count["k-"+strconv.Itoa(i)]; n != 4 {
			t.Errorf("key k-%d planned %d times, want 4", i, n)
		}
	}
	if slices.IsSorted(p) {
		t.Error("plan not shuffled")
	}
	if !slices.Equal(p, c.plan()) {
		t.Error("the same seed gave another plan")
	}
	if (&Config{}).plan() != nil {
		t.Error("a plan without keys, want nil (new keys only)")
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      int
		want   time.Duration
	}{
		{"one value", ms(5), 99, 5 * time.Millisecond},
		{"p50 of two", ms(1, 2), 50, time.Millisecond},
		{"p50 of 100", ms(hundred...), 50, 50 * time.Millisecond},
		{"p90 of 100", ms(hundred...), 90, 90 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 99, 99 * time.Millisecond},
		{"p99 of 10", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("%s: percentile(%d) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
	}
}

// discardLogger keeps the middleware quiet.
func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// The first body of each 4xx status is kept (bounded), so a run the
// service refuses can say why.
func TestRunKeepsTheFirstClientErrors(t *testing.T) {
	t.Parallel()
	var n sync.Mutex
	i := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Lock()
		i++
		k := i
		n.Unlock()
		switch {
		case k%4 == 0:
			w.WriteHeader(http.StatusCreated)
		case k%4 == 1:
			w.WriteHeader(http.StatusUnprocessableEntity)
			io.WriteString(w, `{"code":"validation-failed"}`+strings.Repeat(" ", 2*MaxErrorBody))
		default:
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"code":"unauthorized"}`)
		}
	}))
	defer srv.Close()
	res, err := Run(t.Context(), &Config{URL: srv.URL, Requests: 40, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status[401] != 20 || res.Status[422] != 10 || res.Status[201] != 10 {
		t.Fatalf("status %v", res.Status)
	}
	if share := res.ClientErrorShare(); share != 0.75 {
		t.Errorf("4xx share %v, want 0.75", share)
	}
	code, body := res.MostCommonClientError()
	if code != 401 || string(body) != `{"code":"unauthorized"}` {
		t.Errorf("most common 4xx: %d %q", code, body)
	}
	if b := res.ClientErrors[422]; len(b) != MaxErrorBody || !strings.HasPrefix(string(b), `{"code":"validation-failed"}`) {
		t.Errorf("422 body kept: %d bytes, want the first %d", len(b), MaxErrorBody)
	}
	if _, ok := res.ClientErrors[201]; ok {
		t.Error("a 2xx body was kept")
	}
}

// A run on the default client leaves no connection open to the server: a
// server that shuts down after it does not wait for one.
func TestRunClosesItsConnections(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	open := make(map[net.Conn]http.ConnState)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		if s == http.StateClosed || s == http.StateHijacked {
			delete(open, c)
			return
		}
		open[c] = s
	}
	srv.Start()
	defer srv.Close()
	res, err := Run(t.Context(), &Config{URL: srv.URL, Requests: 200, Concurrency: 8})
	if err != nil || res.Responses != 200 {
		t.Fatalf("Run: %+v, %v; want 200 answers", res, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(open)
		mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open 5s after Run returned", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
