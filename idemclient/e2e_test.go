package idemclient_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
	"github.com/idem-dev/idem/idemmem"
)

// execution is what the test handler answers: which execution this was and
// the request it executed.
type execution struct {
	Exec int64  `json:"exec"`
	Key  string `json:"key"`
	Echo string `json:"echo"`
}

// ledger is a handler that counts its executions per Idempotency-Key.
type ledger struct {
	total atomic.Int64
	mu    sync.Mutex
	byKey map[string][]int64 // key field line -> the executions it caused
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get(idemclient.HeaderKey)
	n := l.total.Add(1)
	l.mu.Lock()
	l.byKey[key] = append(l.byKey[key], n)
	l.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(execution{Exec: n, Key: key, Echo: string(body)})
}

func (l *ledger) executions(key string) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.byKey[key]...)
}

// newIdemServer starts a real idem server over the memory store in front of
// a counting handler, behind a fault proxy that loses the responses of the
// connections drop picks.
func newIdemServer(t *testing.T, drop func(n int64) bool) (*ledger, *faultProxy) {
	t.Helper()
	l := &ledger{byKey: map[string][]int64{}}
	mw := idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{Logger: slog.New(slog.DiscardHandler)}})
	srv := httptest.NewServer(mw(l))
	t.Cleanup(srv.Close)
	return l, newFaultProxy(t, srv.Listener.Addr().String(), drop)
}

func decode(t *testing.T, resp *idemclient.Response) execution {
	t.Helper()
	var e execution
	if err := json.Unmarshal([]byte(readBody(t, resp)), &e); err != nil {
		t.Fatalf("decoding the answer: %v", err)
	}
	return e
}

func TestLostResponseIsReplayed(t *testing.T) {
	t.Parallel()
	const lost = 2
	l, proxy := newIdemServer(t, func(n int64) bool { return n <= lost })
	c := newClient(t)
	resp, err := c.Do(newRequest(t, t.Context(), http.MethodPost, proxy.URL()+"/v1/payments", `{"amount_cents":1200}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || resp.Attempts != lost+1 || !resp.Replayed {
		t.Errorf("Do = %d after %d attempts, replayed %v; want 201 after %d, replayed", resp.StatusCode, resp.Attempts, resp.Replayed, lost+1)
	}
	e := decode(t, resp)
	execs := l.executions(`"` + resp.Key + `"`)
	if len(execs) != 1 || l.total.Load() != 1 {
		t.Fatalf("the server executed the call %d times (%d in all), want once", len(execs), l.total.Load())
	}
	if e.Exec != execs[0] || e.Echo != `{"amount_cents":1200}` {
		t.Errorf("answer %+v, want the original answer of execution %d", e, execs[0])
	}
	if d := proxy.dropped.Load(); d != lost {
		t.Errorf("the proxy lost %d responses, want %d", d, lost)
	}
}

// An application that persisted its key resumes the call after a restart
// (here: a fresh client) and gets the original answer, not a second
// execution.
func TestResumeWithPersistedKey(t *testing.T) {
	t.Parallel()
	l, proxy := newIdemServer(t, func(n int64) bool { return n <= 3 })
	const key = "order-7f3a/charge"
	body := `{"amount_cents":500}`

	first := newClient(t)
	first.RetryMax = 2
	_, err := first.Do(newRequest(t, idemclient.WithKey(t.Context(), key), http.MethodPost, proxy.URL()+"/v1/payments", body))
	var e *idemclient.Error
	if !errors.As(err, &e) || !errors.Is(err, idemclient.ErrRetriesExhausted) || e.Key != key || e.Attempts != 3 {
		t.Fatalf("first run: Do error = %v, want retries exhausted after 3 attempts with the key", err)
	}
	if n := len(l.executions(`"` + key + `"`)); n != 1 {
		t.Fatalf("after the first run the server executed %d times, want 1", n)
	}

	restarted := newClient(t)
	resp, err := restarted.Do(newRequest(t, idemclient.WithKey(t.Context(), key), http.MethodPost, proxy.URL()+"/v1/payments", body))
	if err != nil {
		t.Fatal(err)
	}
	got := decode(t, resp)
	if !resp.Replayed || resp.Attempts != 1 || resp.Key != key {
		t.Errorf("resumed: replayed %v after %d attempts with key %q; want a replay at once with %q", resp.Replayed, resp.Attempts, resp.Key, key)
	}
	if execs := l.executions(`"` + key + `"`); len(execs) != 1 || got.Exec != execs[0] || got.Echo != body {
		t.Errorf("resumed answer %+v, executions %v; want the one original execution", got, execs)
	}
}

func TestConcurrentCallsThroughFlakyConnections(t *testing.T) {
	t.Parallel()
	const (
		workers = 100
		calls   = 20
	)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	l, proxy := newIdemServer(t, func(int64) bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < 0.2
	})
	c := newClient(t)
	// One connection per attempt, so the proxy's choice applies to each
	// attempt and no connection is reused.
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	c.HTTPClient = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	c.RetryMax = 30
	c.MaxElapsed = 0
	// Waits of at most a few milliseconds: a whole-second Retry-After would
	// only slow the test down.
	c.Backoff = func(min, max time.Duration, attempt int, _ *http.Response) time.Duration {
		return idemclient.DefaultBackoff(min, max, attempt, nil)
	}

	type result struct {
		key      string
		body     string
		answer   execution
		replayed bool
		attempts int
	}
	results := make([][]result, workers)
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := range calls {
				body := fmt.Sprintf(`{"worker":%d,"call":%d}`, g, i)
				// No t.Fatal in these goroutines: errors end the worker.
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, proxy.URL()+"/v1/orders", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Errorf("worker %d call %d: %v", g, i, err)
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				var answer execution
				if err == nil {
					err = json.Unmarshal(b, &answer)
				}
				if err != nil || resp.StatusCode != http.StatusCreated {
					t.Errorf("worker %d call %d: %d %q: %v", g, i, resp.StatusCode, b, err)
					return
				}
				results[g] = append(results[g], result{resp.Key, body, answer, resp.Replayed, resp.Attempts})
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	replays := 0
	for _, rs := range results {
		for _, r := range rs {
			execs := l.executions(`"` + r.key + `"`)
			if len(execs) != 1 {
				t.Errorf("call %s was executed %d times, want once", r.body, len(execs))
				continue
			}
			if r.answer.Exec != execs[0] || r.answer.Echo != r.body || r.answer.Key != `"`+r.key+`"` {
				t.Errorf("call %s got %+v, want the answer of its own execution %d", r.body, r.answer, execs[0])
			}
			if r.replayed {
				replays++
				if r.attempts < 2 {
					t.Errorf("call %s was a replay at its first attempt", r.body)
				}
			}
		}
	}
	if n := l.total.Load(); n != workers*calls {
		t.Errorf("the server executed %d times, want %d", n, workers*calls)
	}
	if replays == 0 || proxy.dropped.Load() == 0 {
		t.Errorf("%d replays, %d lost responses: the proxy did not lose anything, the test proves nothing", replays, proxy.dropped.Load())
	}
	t.Logf("%d connections, %d responses lost, %d calls answered by a replay", proxy.accepted.Load(), proxy.dropped.Load(), replays)
}

// An attempt that times out leaves the first execution running: the retry
// finds the key in use (409 key-in-use from the real middleware), waits, and
// gets the first execution's answer once it is stored.
func TestTimeoutThenKeyInUseThenReplay(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var execs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		execs.Add(1)
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged once")
	})
	srv := httptest.NewServer(idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{Logger: slog.New(slog.DiscardHandler)}})(handler))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	c := newClient(t)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c.HTTPClient = &http.Client{Transport: tr, Timeout: 200 * time.Millisecond}
	c.RetryMax = 20
	var inUse atomic.Int32
	c.Backoff = func(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
		if resp != nil && idemclient.ProblemCode(resp) == idemclient.CodeKeyInUse {
			if resp.Header.Get("Retry-After") == "" {
				t.Error("409 key-in-use without Retry-After")
			}
			if inUse.Add(1) == 1 {
				close(release) // let the first execution finish
			}
		}
		return idemclient.DefaultBackoff(min, max, attempt, nil)
	}
	resp, err := c.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL+"/v1/payments", `{"amount_cents":1}`))
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusCreated || body != "charged once" || !resp.Replayed || resp.Attempts < 3 {
		t.Errorf("Do = %d %q after %d attempts, replayed %v; want the replayed 201 after at least 3", resp.StatusCode, body, resp.Attempts, resp.Replayed)
	}
	if inUse.Load() == 0 || execs.Load() != 1 {
		t.Errorf("%d key-in-use answers, %d executions; want at least 1 and exactly 1", inUse.Load(), execs.Load())
	}
}

// The real middleware's 422 key-reused is final: it reaches the caller at
// once, body intact.
func TestKeyReusedIsFinal(t *testing.T) {
	t.Parallel()
	l, proxy := newIdemServer(t, func(int64) bool { return false })
	c := newClient(t)
	ctx := idemclient.WithKey(t.Context(), "reused-key")
	resp, err := c.Do(newRequest(t, ctx, http.MethodPost, proxy.URL()+"/v1/payments", `{"amount_cents":1}`))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	resp, err = c.Do(newRequest(t, ctx, http.MethodPost, proxy.URL()+"/v1/payments", `{"amount_cents":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusUnprocessableEntity || resp.Attempts != 1 || !strings.Contains(body, `"code":"key-reused"`) {
		t.Errorf("Do = %d %q after %d attempts; want the 422 key-reused at once", resp.StatusCode, body, resp.Attempts)
	}
	if n := l.total.Load(); n != 1 {
		t.Errorf("the server executed %d times, want 1", n)
	}
}
