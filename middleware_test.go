package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// testBundle is what setup returns: a store with a test clock, a counting
// handler behind the middleware, and the captured log.
type testBundle struct {
	clock   *idemtest.Clock
	store   *faultStore
	calls   atomic.Int64
	handler http.Handler
	logs    *syncBuffer
}

func setup(t *testing.T, cfg *idem.Config, h http.HandlerFunc) *testBundle {
	t.Helper()
	b := &testBundle{clock: idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), logs: &syncBuffer{}}
	// The memory store shares a completed record with every replay: fail
	// the test if the middleware changes one (idemstore.ReserveResult).
	b.store = newFaultStore(idemtest.CheckReserveResults(t, idemmem.New(&idemmem.Config{Now: b.clock.Now})))
	var c idem.Config
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = b.clock
	}
	c.Logger = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/v1/things/1")
			w.Header().Set("Set-Cookie", "session=secret")
			w.Header().Set("X-Not-Stored", "1")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"n":%d,"echo":%q}`, b.calls.Load(), body)
		}
	}
	b.handler = idem.New(b.store, &c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.calls.Add(1)
		h(w, r)
	}))
	t.Cleanup(func() {
		if strings.Contains(b.logs.String(), "key-one") {
			t.Errorf("a raw key appeared in the log:\n%s", b.logs.String())
		}
	})
	return b
}

func (b *testBundle) do(t *testing.T, method, key, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, "/v1/things", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	b.handler.ServeHTTP(w, r)
	return w
}

type problem struct {
	Type, Title, Detail, Code string
	Status                    int
}

func requireProblem(t *testing.T, w *httptest.ResponseRecorder, status int, code string) problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", ct)
	}
	var p problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body: %v: %s", err, w.Body)
	}
	if p.Code != code || p.Status != status || p.Title == "" || p.Detail == "" || p.Type != "https://github.com/idem-dev/idem#problem-"+code {
		t.Fatalf("problem = %+v, want code %s status %d", p, code, status)
	}
	if strings.Contains(w.Body.String(), "key-one") {
		t.Fatalf("problem reveals the key: %s", w.Body)
	}
	return p
}

func TestReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	first := b.do(t, "POST", "key-one", `{"amount": 100, "currency": "EUR"}`)
	if first.Code != http.StatusCreated || first.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %v", first.Code, first.Header())
	}
	if first.Header().Get("Set-Cookie") == "" {
		t.Fatal("the first answer lost the handler's Set-Cookie")
	}
	// Same request, other key order and whitespace: replayed.
	second := b.do(t, "POST", `"key-one"`, `{ "currency":"EUR","amount":1e2 }`)
	if second.Code != http.StatusCreated {
		t.Fatalf("replay status %d", second.Code)
	}
	if !bytes.Equal(second.Body.Bytes(), first.Body.Bytes()) {
		t.Fatalf("replay body %q, want %q", second.Body, first.Body)
	}
	if got := second.Header().Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("Idempotent-Replayed = %q", got)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if second.Header().Get(h) != first.Header().Get(h) {
			t.Errorf("%s not replayed", h)
		}
	}
	for _, h := range []string{"Set-Cookie", "X-Not-Stored"} {
		if v := second.Header().Get(h); v != "" {
			t.Errorf("%s replayed: %q", h, v)
		}
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestPassThrough(t *testing.T) {
	t.Parallel()
	t.Run("uncovered method", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, nil)
		b.do(t, "GET", "key-one", "")
		b.do(t, "GET", "key-one", "")
		if b.calls.Load() != 2 || b.store.reserves.Load() != 0 {
			t.Fatalf("calls %d reserves %d", b.calls.Load(), b.store.reserves.Load())
		}
	})
	t.Run("optional key missing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, nil)
		b.do(t, "POST", "", "{}")
		b.do(t, "POST", "", "{}")
		if b.calls.Load() != 2 || b.store.reserves.Load() != 0 {
			t.Fatalf("calls %d reserves %d", b.calls.Load(), b.store.reserves.Load())
		}
	})
	t.Run("required key missing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &idem.Config{RequireKey: true}, nil)
		requireProblem(t, b.do(t, "POST", "", "{}"), 400, "key-missing")
		if b.calls.Load() != 0 {
			t.Fatal("handler ran")
		}
	})
	t.Run("PUT covered when configured", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &idem.Config{Methods: []string{"PUT"}}, nil)
		b.do(t, "PUT", "key-one", "{}")
		if w := b.do(t, "PUT", "key-one", "{}"); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatal("PUT not protected")
		}
		b.do(t, "POST", "key-one", "{}")
		if b.calls.Load() != 2 {
			t.Fatalf("calls %d", b.calls.Load())
		}
	})
}

func TestBadKeys(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 256)
	cases := map[string][]string{
		"empty":             {""},
		"empty quoted":      {`""`},
		"256 characters":    {long},
		"non-ASCII":         {"clé"},
		"control character": {"ab\x01c"},
		"bad escape":        {`"ab\nc"`},
		"comma list":        {"a, b"},
		"quoted list":       {`"a", "b"`},
		"two field lines":   {"a", "b"},
		"below minimum":     {"short"},
	}
	for name, values := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{MinKeyLength: 8}}, nil)
			r := httptest.NewRequest("POST", "/v1/things", strings.NewReader("{}"))
			for _, v := range values {
				r.Header.Add("Idempotency-Key", v)
			}
			w := httptest.NewRecorder()
			b.handler.ServeHTTP(w, r)
			requireProblem(t, w, 400, "key-invalid")
			if b.calls.Load() != 0 || b.store.reserves.Load() != 0 {
				t.Fatalf("calls %d reserves %d", b.calls.Load(), b.store.reserves.Load())
			}
		})
	}
}

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, &idem.Config{MaxBody: 64}, nil)
	requireProblem(t, b.do(t, "POST", "key-one", strings.Repeat("x", 65)), 413, "body-too-large")
	// Without Content-Length (chunked) too.
	r := httptest.NewRequest("POST", "/v1/things", io.MultiReader(strings.NewReader(strings.Repeat("y", 65))))
	r.ContentLength = -1
	r.Header.Set("Idempotency-Key", "key-two")
	w := httptest.NewRecorder()
	b.handler.ServeHTTP(w, r)
	requireProblem(t, w, 413, "body-too-large")
	if b.calls.Load() != 0 || b.store.reserves.Load() != 0 {
		t.Fatalf("calls %d reserves %d", b.calls.Load(), b.store.reserves.Load())
	}
	if w := b.do(t, "POST", "key-one", strings.Repeat("x", 64)); w.Code != 201 {
		t.Fatalf("body at the limit: %d", w.Code)
	}
}

func TestKeyReused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		profile idem.Profile
		status  int
		code    string
	}{
		{idem.ProfileIETF, 422, "key-reused"},
		{idem.ProfileAppstrate, 409, "conflict"},
	} {
		t.Run(string(tc.profile), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idem.Config{Profile: tc.profile}, nil)
			b.do(t, "POST", "key-one", `{"amount":1}`)
			requireProblem(t, b.do(t, "POST", "key-one", `{"amount":2}`), tc.status, tc.code)
			if b.calls.Load() != 1 {
				t.Fatalf("calls %d", b.calls.Load())
			}
		})
	}
}

func TestInvalidJSONIsFingerprintedRaw(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		var v any
		if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		w.WriteHeader(201)
	})
	if w := b.do(t, "POST", "key-one", `{"amount":`); w.Code != 400 {
		t.Fatalf("status %d", w.Code)
	}
	if w := b.do(t, "POST", "key-one", `{"amount":`); w.Code != 400 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d replayed=%q", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	requireProblem(t, b.do(t, "POST", "key-one", `{"amount": `), 422, "key-reused")
	if b.calls.Load() != 1 {
		t.Fatalf("calls %d", b.calls.Load())
	}
}

func TestStatusPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status  int
		profile idem.Profile
		reruns  bool
	}{
		{200, idem.ProfileIETF, false},
		{302, idem.ProfileIETF, false},
		{404, idem.ProfileIETF, false},
		{408, idem.ProfileIETF, true},
		{425, idem.ProfileIETF, true},
		{429, idem.ProfileIETF, true},
		{500, idem.ProfileIETF, true},
		{503, idem.ProfileIETF, true},
		{500, idem.ProfileStripe, false},
		{429, idem.ProfileStripe, true},
	} {
		t.Run(fmt.Sprint(tc.profile, tc.status), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idem.Config{Profile: tc.profile}, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
			})
			b.do(t, "POST", "key-one", "{}")
			w := b.do(t, "POST", "key-one", "{}")
			want := int64(1)
			if tc.reruns {
				want = 2
			}
			if n := b.calls.Load(); n != want {
				t.Fatalf("handler ran %d times, want %d", n, want)
			}
			if w.Code != tc.status {
				t.Fatalf("second answer %d", w.Code)
			}
			if replayed := w.Header().Get("Idempotent-Replayed") == "true"; replayed == tc.reruns {
				t.Fatalf("replayed = %v", replayed)
			}
		})
	}
}

func TestMarkUnknownAndReject(t *testing.T) {
	t.Parallel()
	t.Run("unknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
			if !idem.MarkUnknown(r.Context()) {
				t.Error("MarkUnknown outside a protected request")
			}
			w.WriteHeader(502)
		})
		b.do(t, "POST", "key-one", "{}")
		w := b.do(t, "POST", "key-one", "{}")
		requireProblem(t, w, 409, "outcome-unknown")
		if w.Header().Get("Retry-After") == "" || b.calls.Load() != 1 {
			t.Fatalf("Retry-After %q calls %d", w.Header().Get("Retry-After"), b.calls.Load())
		}
	})
	t.Run("reject", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if string(body) == `{"amount":-1}` {
				idem.Reject(r.Context())
				w.WriteHeader(400)
				return
			}
			w.WriteHeader(201)
		})
		if w := b.do(t, "POST", "key-one", `{"amount":-1}`); w.Code != 400 {
			t.Fatalf("status %d", w.Code)
		}
		// The corrected request reuses the key.
		if w := b.do(t, "POST", "key-one", `{"amount":1}`); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("corrected: %d", w.Code)
		}
		if w := b.do(t, "POST", "key-one", `{"amount":1}`); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatal("corrected request not replayed")
		}
		if b.calls.Load() != 2 {
			t.Fatalf("calls %d", b.calls.Load())
		}
	})
	t.Run("outside a request", func(t *testing.T) {
		t.Parallel()
		if idem.MarkUnknown(context.Background()) || idem.Reject(context.Background()) || idem.DerivedKeyFromContext(context.Background(), "x") != "" {
			t.Fatal("context helpers accepted a bare context")
		}
	})
}

func TestPanicMarksUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the server")
			}
		}()
		b.do(t, "POST", "key-one", "{}")
	}()
	requireProblem(t, b.do(t, "POST", "key-one", "{}"), 409, "outcome-unknown")
	if b.calls.Load() != 1 {
		t.Fatalf("calls %d", b.calls.Load())
	}
}

func TestNotReplayable(t *testing.T) {
	t.Parallel()
	t.Run("over the response limit", func(t *testing.T) {
		t.Parallel()
		big := strings.Repeat("z", 100)
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{MaxResponse: 64}}, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, big[:50])
			io.WriteString(w, big[50:])
		})
		if w := b.do(t, "POST", "key-one", "{}"); w.Body.String() != big {
			t.Fatalf("first answer %q", w.Body)
		}
		requireProblem(t, b.do(t, "POST", "key-one", "{}"), 409, "not-replayable")
		if b.calls.Load() != 1 {
			t.Fatalf("calls %d", b.calls.Load())
		}
	})
	t.Run("flushed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "part1 ")
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Error(err)
			}
			io.WriteString(w, "part2")
		})
		w := b.do(t, "POST", "key-one", "{}")
		if w.Body.String() != "part1 part2" || !w.Flushed {
			t.Fatalf("first answer %q flushed=%v", w.Body, w.Flushed)
		}
		requireProblem(t, b.do(t, "POST", "key-one", "{}"), 409, "not-replayable")
	})
}

// gate returns a handler that closes started when it first runs, then
// waits for release before it answers 201 "done".
func gate() (started, release chan struct{}, h http.HandlerFunc) {
	started, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	return started, release, func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		<-release
		w.WriteHeader(201)
		io.WriteString(w, "done")
	}
}

func TestInProgress(t *testing.T) {
	t.Parallel()
	t.Run("409 with Retry-After", func(t *testing.T) {
		t.Parallel()
		started, release, h := gate()
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Lease: 30 * time.Second}}, h)
		go b.do(t, "POST", "key-one", "{}")
		<-started
		b.clock.Advance(5 * time.Second)
		w := b.do(t, "POST", "key-one", "{}")
		requireProblem(t, w, 409, "key-in-use")
		if got := w.Header().Get("Retry-After"); got != "5" {
			t.Fatalf("Retry-After = %q, want 5 (the elapsed time, not the lease)", got)
		}
		close(release)
	})
	t.Run("async 202", func(t *testing.T) {
		t.Parallel()
		started, release, h := gate()
		b := setup(t, &idem.Config{Async: true}, h)
		go b.do(t, "POST", "key-one", "{}")
		<-started
		if w := b.do(t, "POST", "key-one", "{}"); w.Code != 202 || w.Header().Get("Retry-After") == "" {
			t.Fatalf("status %d Retry-After %q", w.Code, w.Header().Get("Retry-After"))
		}
		close(release)
	})
	t.Run("wait mode gets the result", func(t *testing.T) {
		t.Parallel()
		started, release, h := gate()
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Wait: time.Minute}}, h)
		go b.do(t, "POST", "key-one", "{}")
		<-started
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- b.do(t, "POST", "key-one", "{}") }()
		close(release)
		select {
		case w := <-done:
			if w.Code != 201 || w.Body.String() != "done" || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("waiter got %d %q", w.Code, w.Body)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter was not woken by the completion")
		}
		if b.calls.Load() != 1 {
			t.Fatalf("calls %d", b.calls.Load())
		}
	})
	t.Run("wait mode bounded", func(t *testing.T) {
		t.Parallel()
		started, release, h := gate()
		defer close(release)
		const wait = 5 * time.Second
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Wait: wait}}, h)
		go b.do(t, "POST", "key-one", "{}")
		<-started // its lease renewal and its lease's end are the clock's first timers
		waiter := b.goDo(t, "POST", "key-one", "{}")
		b.clock.WaitForTimers(3) // the waiter's bound
		b.clock.Advance(wait - time.Nanosecond)
		select {
		case w := <-waiter:
			t.Fatalf("answered %d before the wait was over", w.Code)
		default:
		}
		b.clock.Advance(time.Nanosecond)
		requireProblem(t, answer(t, waiter), 409, "key-in-use")
	})
}

// TestWaitEndedByContext ends a waiting duplicate's request context, as a
// client that hangs up or a timeout middleware in front of the handler
// does: the middleware still writes its answer, never net/http's implicit
// empty 200, which a client behind such a timeout would read as success.
func TestWaitEndedByContext(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cause error
	}{
		{"client gone", context.Canceled},
		{"inner timeout", context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			started, release, h := gate()
			defer close(release)
			b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Wait: time.Minute}}, h)
			go b.do(t, "POST", "key-one", "{}")
			<-started // its lease renewal is the clock's first timer
			ctx, cancel := context.WithCancelCause(context.Background())
			res := make(chan *httptest.ResponseRecorder, 1)
			go func() {
				r := httptest.NewRequest("POST", "/v1/things", strings.NewReader("{}")).WithContext(ctx)
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", "key-one")
				w := httptest.NewRecorder()
				b.handler.ServeHTTP(w, r)
				res <- w
			}()
			b.clock.WaitForTimers(2) // the waiter's bound: it waits
			cancel(tc.cause)
			requireProblem(t, answer(t, res), 409, "key-in-use")
			if n := b.calls.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want 1", n)
			}
		})
	}
	t.Run("store fails during the wait", func(t *testing.T) {
		t.Parallel()
		started, release, h := gate()
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Wait: time.Minute}}, h)
		first := b.goDo(t, "POST", "key-one", "{}")
		<-started
		waiter := b.goDo(t, "POST", "key-one", "{}")
		b.clock.WaitForTimers(2) // the waiter's bound: it waits
		b.store.failReserve.Store(true)
		close(release) // the completion wakes the waiter, whose re-read fails
		if w := answer(t, first); w.Code != 201 {
			t.Fatalf("first: %d", w.Code)
		}
		requireProblem(t, answer(t, waiter), 503, "store-unavailable")
	})
}

// TestLeaseRenewedWhileHandlerRuns keeps a handler running for longer than
// its lease on the test clock: the middleware renews the lease every
// Lease/3, so a duplicate gets key-in-use all along (an expired lease would
// answer outcome-unknown), and the first request's answer is stored once.
func TestLeaseRenewedWhileHandlerRuns(t *testing.T) {
	t.Parallel()
	started, release, h := gate()
	const lease = 30 * time.Second
	b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Lease: lease}}, h)
	first := b.goDo(t, "POST", "key-one", "{}")
	<-started
	id := idemstore.Identity{Endpoint: "POST /v1/things", Key: "key-one"}
	for i := range 4 { // 40 s: past the lease of the reservation
		b.clock.Advance(lease / 3)
		select {
		case <-b.store.renewed:
		case <-time.After(10 * time.Second):
			t.Fatalf("renewal %d did not come", i+1)
		}
		rec, err := b.store.KeyGet(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if want := b.clock.Now().Add(lease); rec.State != idemstore.StateInProgress || !rec.LockedUntil.Equal(want) {
			t.Fatalf("after renewal %d: %s until %v, want in_progress until %v", i+1, rec.State, rec.LockedUntil, want)
		}
		requireProblem(t, b.do(t, "POST", "key-one", "{}"), 409, "key-in-use")
	}
	close(release)
	if w := answer(t, first); w.Code != 201 {
		t.Fatalf("first: %d", w.Code)
	}
	b.clock.Advance(time.Hour) // no renewal after the handler
	select {
	case <-b.store.renewed:
		t.Fatal("the lease was renewed after the handler returned")
	default:
	}
	if w := b.do(t, "POST", "key-one", "{}"); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after: %d", w.Code)
	}
	if b.calls.Load() != 1 {
		t.Fatalf("calls %d", b.calls.Load())
	}
}

func TestExpiredLeaseBecomesUnknown(t *testing.T) {
	t.Parallel()
	// The completion fails (store down after the handler ran): the record
	// stays in progress until its lease expires, then answers unknown.
	b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Lease: 10 * time.Second}}, nil)
	b.store.failComplete.Store(true)
	if w := b.do(t, "POST", "key-one", "{}"); w.Code != 201 {
		t.Fatalf("the client must still get the handler's answer: %d", w.Code)
	}
	b.store.failComplete.Store(false)
	requireProblem(t, b.do(t, "POST", "key-one", "{}"), 409, "key-in-use")
	b.clock.Advance(11 * time.Second)
	requireProblem(t, b.do(t, "POST", "key-one", "{}"), 409, "outcome-unknown")
	if b.calls.Load() != 1 {
		t.Fatalf("calls %d", b.calls.Load())
	}
	// An unknown outcome never expires (SPEC section 2): past the
	// retention the key is still unknown, never executed again.
	b.clock.Advance(25 * time.Hour)
	requireProblem(t, b.do(t, "POST", "key-one", "{}"), 409, "outcome-unknown")
	if b.calls.Load() != 1 {
		t.Fatalf("after retention: calls %d, want 1", b.calls.Load())
	}
}

func TestStoreOutage(t *testing.T) {
	t.Parallel()
	t.Run("reserve error", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, nil)
		b.store.failReserve.Store(true)
		w := b.do(t, "POST", "key-one", "{}")
		requireProblem(t, w, 503, "store-unavailable")
		if w.Header().Get("Retry-After") == "" || b.calls.Load() != 0 {
			t.Fatal("handler ran or no Retry-After")
		}
		b.store.failReserve.Store(false)
		if w := b.do(t, "POST", "key-one", "{}"); w.Code != 201 {
			t.Fatalf("after recovery: %d", w.Code)
		}
	})
	t.Run("reserve timeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, nil)
		b.store.hangReserve.Store(true)
		res := b.goDo(t, "POST", "key-one", "{}")
		w := b.expireHungCall(t, res, 2*time.Second) // the default StoreTimeout
		requireProblem(t, w, 503, "store-unavailable")
		if b.calls.Load() != 0 {
			t.Fatal("handler ran")
		}
	})
	t.Run("complete timeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{StoreTimeout: 50 * time.Millisecond}}, nil)
		b.store.hangComplete.Store(true)
		res := b.goDo(t, "POST", "key-one", "{}")
		if w := b.expireHungCall(t, res, 50*time.Millisecond); w.Code != 201 {
			t.Fatalf("status %d", w.Code)
		}
		b.store.hangComplete.Store(false)
		requireProblem(t, b.do(t, "POST", "key-one", "{}"), 409, "key-in-use")
		if b.calls.Load() != 1 {
			t.Fatalf("calls %d", b.calls.Load())
		}
	})
	t.Run("fail open", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{FailOpen: true}}, nil)
		b.store.failReserve.Store(true)
		if w := b.do(t, "POST", "key-one", "{}"); w.Code != 201 || b.calls.Load() != 1 {
			t.Fatalf("fail-open: %d", w.Code)
		}
		if !strings.Contains(b.logs.String(), "UNPROTECTED") {
			t.Fatal("fail-open is not loud in the log")
		}
	})
}

func TestIsolation(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	var calls atomic.Int64
	mw := idem.New(store, &idem.Config{Scope: func(r *http.Request) (string, error) {
		tenant := r.Header.Get("X-Tenant")
		if tenant == "" {
			return "", errors.New("no tenant")
		}
		return tenant, nil
	}})
	mux := http.NewServeMux()
	count := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1); io.WriteString(w, r.Pattern) })
	mux.Handle("POST /v1/a/{id}", mw(count))
	mux.Handle("POST /v1/b", mw(count))
	send := func(path, tenant string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", path, nil)
		r.Header.Set("Idempotency-Key", "same-key")
		if tenant != "" {
			r.Header.Set("X-Tenant", tenant)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	send("/v1/a/1", "t1")
	send("/v1/a/1", "t2") // other scope: executes
	send("/v1/b", "t1")   // other endpoint: executes
	if w := send("/v1/a/2", "t1"); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("the endpoint is the route pattern, not the raw path: /v1/a/2 should replay /v1/a/1")
	}
	if w := send("/v1/b", ""); w.Code != 401 {
		t.Fatalf("no tenant: %d", w.Code)
	}
	if calls.Load() != 3 {
		t.Fatalf("calls %d, want 3", calls.Load())
	}
}

func TestScopeLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{NewKeysPerSecondPerScope: 2}}, nil)
	b.do(t, "POST", "k1", "{}")
	b.do(t, "POST", "k2", "{}")
	w := b.do(t, "POST", "k3", "{}")
	requireProblem(t, w, 429, "too-many-keys")
	if w.Header().Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	reservesBefore := b.store.reserves.Load()
	requireProblem(t, b.do(t, "POST", "k4", "{}"), 429, "too-many-keys")
	if b.store.reserves.Load() != reservesBefore {
		t.Fatal("a refused key reached the store")
	}
	b.clock.Advance(time.Second)
	if w := b.do(t, "POST", "k3", "{}"); w.Code != 201 {
		t.Fatalf("after a second: %d", w.Code)
	}
}

func TestClientDisconnectStillStores(t *testing.T) {
	t.Parallel()
	store := newFaultStore(idemmem.New(nil))
	var calls atomic.Int64
	started, finished := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(idem.New(store, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(started)
			<-r.Context().Done() // the client hung up
			defer close(finished)
		}
		w.WriteHeader(201)
		io.WriteString(w, "charged")
	})))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "k")
	go func() { <-started; cancel() }()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("expected the client's request to be cancelled")
	}
	<-finished
	select {
	case <-store.completed:
	case <-time.After(10 * time.Second):
		t.Fatal("the completion was not written")
	}
	req, _ = http.NewRequest("POST", srv.URL, strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(body) != "charged" || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %q replayed=%q", resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
	}
	if calls.Load() != 1 {
		t.Fatalf("calls %d", calls.Load())
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	var calls atomic.Int64
	srv := httptest.NewServer(idem.New(store, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		time.Sleep(20 * time.Millisecond)
		w.WriteHeader(201)
		io.WriteString(w, "once")
	})))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	var wg sync.WaitGroup
	var created, replayed, inUse, other atomic.Int64
	for range 200 {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", srv.URL+"/pay", strings.NewReader(`{"a":1}`))
			req.Header.Set("Idempotency-Key", "one-key")
			resp, err := client.Do(req)
			if err != nil {
				other.Add(1)
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			switch {
			case resp.StatusCode == 201 && resp.Header.Get("Idempotent-Replayed") == "true" && string(body) == "once":
				replayed.Add(1)
			case resp.StatusCode == 201:
				created.Add(1)
			case resp.StatusCode == 409 && strings.Contains(string(body), "key-in-use"):
				inUse.Add(1)
			default:
				other.Add(1)
			}
		})
	}
	wg.Wait()
	if calls.Load() != 1 || created.Load() != 1 || other.Load() != 0 || replayed.Load()+inUse.Load() != 199 {
		t.Fatalf("calls %d created %d replayed %d in-use %d other %d", calls.Load(), created.Load(), replayed.Load(), inUse.Load(), other.Load())
	}
}

func TestDerivedKeyFromContext(t *testing.T) {
	t.Parallel()
	var got []string
	b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		got = append(got, idem.DerivedKeyFromContext(r.Context(), "charge"), idem.DerivedKeyFromContext(r.Context(), "refund"))
		k, _ := idem.KeyFromContext(r.Context())
		got = append(got, k)
		w.WriteHeader(500)
	})
	b.do(t, "POST", "key-one", "{}")
	b.do(t, "POST", "key-one", "{}")
	if len(got) != 6 || got[0] != got[3] || got[0] == got[1] || got[2] != "key-one" || strings.Contains(got[0], "key-one") {
		t.Fatalf("derived keys %q", got)
	}
}

// goDo is do in a goroutine of its own: the answer comes on the channel.
func (b *testBundle) goDo(t *testing.T, method, key, body string, hdr ...string) <-chan *httptest.ResponseRecorder {
	c := make(chan *httptest.ResponseRecorder, 1)
	go func() { c <- b.do(t, method, key, body, hdr...) }()
	return c
}

// answer receives the answer of a request started with goDo.
func answer(t *testing.T, res <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case w := <-res:
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
		return nil
	}
}

// expireHungCall waits until a store call hangs on its context, then moves
// the clock to the call's deadline, timeout after its start, and returns the
// answer: the request must not be answered a nanosecond before.
func (b *testBundle) expireHungCall(t *testing.T, res <-chan *httptest.ResponseRecorder, timeout time.Duration) *httptest.ResponseRecorder {
	t.Helper()
	<-b.store.hung
	b.clock.Advance(timeout - time.Nanosecond)
	select {
	case w := <-res:
		t.Fatalf("answered %d before the store call's deadline", w.Code)
	default:
	}
	b.clock.Advance(time.Nanosecond)
	return answer(t, res)
}

// faultStore wraps a store to count calls, inject outages and tell the test
// when a call hangs, a renewal is done and a completion is written.
type faultStore struct {
	idemstore.Store
	reserves, gets             atomic.Int64
	failReserve, hangReserve   atomic.Bool
	failComplete, hangComplete atomic.Bool
	// failRenew makes KeyRenew fail as an unreachable store does,
	// loseRenew as when another attempt holds the key.
	failRenew, loseRenew atomic.Bool
	// hung receives when a call hangs on its context (its deadline is
	// set), renewed and completed when a KeyRenew or KeyComplete returned.
	hung, renewed, completed chan struct{}
}

func newFaultStore(s idemstore.Store) *faultStore {
	return &faultStore{Store: s, hung: make(chan struct{}, 16), renewed: make(chan struct{}, 16), completed: make(chan struct{}, 16)}
}

// tell sends on c unless its buffer is full: a test that does not listen
// is not held up.
func tell(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// hang waits for the context to expire, after telling the test.
func (s *faultStore) hang(ctx context.Context) error {
	done := ctx.Done() // sets the deadline's alarm
	tell(s.hung)
	<-done
	return ctx.Err()
}

func (s *faultStore) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	var err error
	switch {
	case s.failRenew.Load():
		err = errOutage
	case s.loseRenew.Load():
		err = idemstore.ErrLeaseLost
	default:
		err = s.Store.KeyRenew(ctx, p)
	}
	tell(s.renewed)
	return err
}

var errOutage = errors.New("connection refused")

func (s *faultStore) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	s.reserves.Add(1)
	if s.failReserve.Load() {
		return nil, errOutage
	}
	if s.hangReserve.Load() {
		return nil, s.hang(ctx)
	}
	return s.Store.KeyReserve(ctx, p)
}

func (s *faultStore) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	s.gets.Add(1)
	return s.Store.KeyGet(ctx, id)
}

func (s *faultStore) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	if s.failComplete.Load() {
		return errOutage
	}
	if s.hangComplete.Load() {
		return s.hang(ctx)
	}
	err := s.Store.KeyComplete(ctx, p)
	tell(s.completed)
	return err
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type countingMetrics struct {
	mu        sync.Mutex
	decisions map[idem.Decision]int
	ops       map[string]int
}

func (c *countingMetrics) Decision(endpoint, scope string, d idem.Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.decisions[d]++
}

func (c *countingMetrics) StoreCall(op string, d time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[op]++
}

func (c *countingMetrics) ResponseStored(endpoint string, n int) {}

func TestMetricsDecisions(t *testing.T) {
	t.Parallel()
	m := &countingMetrics{decisions: map[idem.Decision]int{}, ops: map[string]int{}}
	status := 500
	b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Metrics: m}}, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) })
	b.do(t, "POST", "key-one", "{}") // created, released
	status = 201
	b.do(t, "POST", "key-one", "{}") // released_retried, completed
	b.do(t, "POST", "key-one", "{}") // replayed
	b.do(t, "POST", "key-one", "[]") // key_reused
	b.do(t, "POST", "bad key", "{}") // invalid
	b.store.failReserve.Store(true)
	b.do(t, "POST", "key-two", "{}") // store_error
	want := map[idem.Decision]int{
		idem.DecisionCreated: 1, idem.DecisionReleasedRetried: 1, idem.DecisionReplayed: 1,
		idem.DecisionKeyReused: 1, idem.DecisionInvalid: 1, idem.DecisionStoreError: 1,
	}
	for d, n := range want {
		if m.decisions[d] != n {
			t.Errorf("%s = %d, want %d (all: %v)", d, m.decisions[d], n, m.decisions)
		}
	}
	if m.ops["reserve"] != 5 || m.ops["release"] != 1 || m.ops["complete"] != 1 {
		t.Errorf("store calls %v", m.ops)
	}
}

type recordingTracer struct {
	mu    sync.Mutex
	spans []string
	attrs map[string]string
}

type recordingSpan struct {
	t    *recordingTracer
	name string
}

func (t *recordingTracer) Start(ctx context.Context, name string) (context.Context, idem.Span) {
	return ctx, &recordingSpan{t, name}
}

func (s *recordingSpan) SetAttribute(k, v string) {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	s.t.attrs[k] = v
}

func (s *recordingSpan) End(err error) {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	s.t.spans = append(s.t.spans, s.name)
}

func TestTracing(t *testing.T) {
	t.Parallel()
	tr := &recordingTracer{attrs: map[string]string{}}
	b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Tracer: tr}}, nil)
	b.do(t, "POST", "key-one", "{}")
	want := []string{"idem.reserve", "idem.handler", "idem.complete", "idem.request"}
	if fmt.Sprint(tr.spans) != fmt.Sprint(want) {
		t.Fatalf("spans %v, want %v", tr.spans, want)
	}
	if tr.attrs["idem.decision"] != "created" || tr.attrs["idem.endpoint"] != "POST /*" || len(tr.attrs["idem.key_hash"]) != 16 {
		t.Fatalf("attributes %v", tr.attrs)
	}
	for _, v := range tr.attrs {
		if strings.Contains(v, "key-one") {
			t.Fatal("a span attribute carries the raw key")
		}
	}
}

type failingBody struct{}

func (failingBody) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestUnreadableBody(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	r := httptest.NewRequest("POST", "/v1/things", io.NopCloser(failingBody{}))
	r.ContentLength = -1
	r.Header.Set("Idempotency-Key", "key-one")
	w := httptest.NewRecorder()
	b.handler.ServeHTTP(w, r)
	requireProblem(t, w, 400, "body-unreadable")
	if b.calls.Load() != 0 || b.store.reserves.Load() != 0 {
		t.Fatal("a request with an unreadable body reached the handler or the store")
	}
}
