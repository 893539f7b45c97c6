package proxy

import (
	"context"
	"errors"
	"net"
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

// These tests pin down the proxy's part of issue 24: a protected request is
// never written to the upstream once its lease is gone, even after a slow
// dial; the exchange ends when the middleware gives the lease up; and the
// upstream gets the attempt's fencing token in Idempotency-Attempt.

const testLease = 30 * time.Second // the margin is Lease/6: the lease is given up at 25 s

// pausedClock is a test clock that can jump without running its timers, as
// the wall clock does for a process that was stopped: its readings are
// ahead by slept, its timers due on the time before.
type pausedClock struct {
	*idemtest.Clock
	mu    sync.Mutex
	slept time.Duration
}

func (c *pausedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Clock.Now().Add(c.slept)
}

func (c *pausedClock) sleep(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept += d
}

// countingUpstream counts the requests that reach it and keeps the
// Idempotency-Attempt header of the last one.
type countingUpstream struct {
	*httptest.Server
	calls   atomic.Int32
	attempt atomic.Value // string
	block   chan struct{}
}

func newCountingUpstream(t *testing.T, block chan struct{}) *countingUpstream {
	t.Helper()
	u := &countingUpstream{block: block}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.calls.Add(1)
		u.attempt.Store(r.Header.Get(idem.HeaderAttempt))
		if u.block != nil {
			select {
			case <-u.block:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(u.Close)
	return u
}

// slowDialing makes the proxy's gated transport wait for proceed before it
// dials, and tell dialing when it starts.
func slowDialing(t *testing.T, p *Handler) (dialing, proceed chan struct{}) {
	t.Helper()
	dialing, proceed = make(chan struct{}, 4), make(chan struct{})
	var d net.Dialer
	p.cfg.Transport.(*http.Transport).DialContext = gatedDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialing <- struct{}{}
		<-proceed // not ctx: the transport's dial outlives a cancelled request
		return d.DialContext(ctx, network, addr)
	})
	return dialing, proceed
}

func wait[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		panic("unreachable")
	}
}

func goPost(h http.Handler, key string) <-chan *httptest.ResponseRecorder {
	c := make(chan *httptest.ResponseRecorder, 1)
	go func() { c <- post(h, key) }()
	return c
}

// leaseBundle is a proxy behind the middleware on a memory store whose
// clock never moves: the store keeps the lease, whatever the middleware's
// clock says, so what the attempt records afterwards shows.
type leaseBundle struct {
	store *idemmem.Store
	h     http.Handler
	p     *Handler
}

func leaseSetup(t *testing.T, upstream string, clock idem.Clock, wrap ...func(idemstore.Store) idemstore.Store) *leaseBundle {
	t.Helper()
	storeClock := idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := &leaseBundle{store: idemmem.New(&idemmem.Config{Now: storeClock.Now})}
	var store idemstore.Store = b.store
	for _, w := range wrap {
		store = w(store)
	}
	b.p = New(mustURL(t, upstream), &Config{Logger: quietLogger()})
	t.Cleanup(b.p.CloseIdleConnections)
	b.h = idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Logger: quietLogger(), Lease: testLease, Clock: clock}})(b.p)
	return b
}

func (b *leaseBundle) record(t *testing.T, key string) (*idemstore.Record, error) {
	t.Helper()
	return b.store.KeyGet(context.Background(), idemstore.Identity{Endpoint: "POST /v1/payments", Key: key})
}

// TestNotSentAfterPauseDuringDial: the process is paused while it dials
// the upstream, past its lease, and resumes before any alarm has run. The
// connection is made, but the request is never written: the lease check
// at the write refuses it. The client gets 503 lease-lost, and the record
// is dropped, so the retry runs the operation once.
func TestNotSentAfterPauseDuringDial(t *testing.T) {
	t.Parallel()
	up := newCountingUpstream(t, nil)
	clock := &pausedClock{Clock: idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	b := leaseSetup(t, up.URL, clock)
	dialing, proceed := slowDialing(t, b.p)
	res := goPost(b.h, "k")
	wait(t, dialing, "dial")
	clock.sleep(testLease) // the process was stopped while it dialed
	close(proceed)
	w := wait(t, res, "answer")
	assertProblem(t, w, http.StatusServiceUnavailable, CodeLeaseLost)
	if w.Header().Get("Retry-After") == "" {
		t.Error("503 lease-lost without Retry-After")
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests after the lease was gone, want 0", n)
	}
	if _, err := b.record(t, "k"); err != idemstore.ErrNotFound {
		t.Fatalf("the record after a request never sent: %v, want dropped", err)
	}
	if w := post(b.h, "k"); w.Code != http.StatusCreated || up.calls.Load() != 1 {
		t.Fatalf("the retry: %d, upstream calls %d; want 201 and one call", w.Code, up.calls.Load())
	}
}

// noRenew is a store whose lease renewals fail, as when the process is cut
// off from it: the attempt gives its lease up at the margin.
type noRenew struct{ idemstore.Store }

func (noRenew) wrap(s idemstore.Store) idemstore.Store { return noRenew{s} }

func (noRenew) KeyRenew(context.Context, *idemstore.RenewParams) error {
	return errors.New("connection refused")
}

// TestGivenUpWhileDialing: the lease is given up (renewals fail, the
// clock reaches the margin) while the dial is slow: the exchange ends at
// once with 503 lease-lost, and the connection the dial then makes never
// carries the request: the next request is the first the upstream sees.
func TestGivenUpWhileDialing(t *testing.T) {
	t.Parallel()
	up := newCountingUpstream(t, nil)
	clock := idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := leaseSetup(t, up.URL, clock, noRenew{}.wrap)
	dialing, proceed := slowDialing(t, b.p)
	res := goPost(b.h, "k")
	wait(t, dialing, "dial")
	clock.Advance(testLease - testLease/6 - time.Nanosecond)
	select {
	case w := <-res:
		t.Fatalf("answered %d before the margin", w.Code)
	default:
	}
	clock.Advance(time.Nanosecond)
	w := wait(t, res, "answer before the dial completes")
	assertProblem(t, w, http.StatusServiceUnavailable, CodeLeaseLost)
	if _, err := b.record(t, "k"); err != idemstore.ErrNotFound {
		t.Fatalf("the record after a request never sent: %v, want dropped", err)
	}
	close(proceed)
	if w := post(b.h, "other"); w.Code != http.StatusCreated {
		t.Fatalf("the next request: %d", w.Code)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("the upstream got %d requests, want only the next one", n)
	}
}

// TestGivenUpWhileUpstreamWorks: the lease is given up while the upstream
// works on the request: the exchange ends (the handler's context, the
// upstream request's included, is cancelled), and since the upstream may
// have acted the outcome is unknown: a retry is not run again.
func TestGivenUpWhileUpstreamWorks(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	defer close(block)
	up := newCountingUpstream(t, block)
	clock := idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := leaseSetup(t, up.URL, clock, noRenew{}.wrap)
	res := goPost(b.h, "k")
	for up.calls.Load() == 0 {
		time.Sleep(time.Millisecond) // the request reaches the upstream on real time
	}
	clock.Advance(testLease - testLease/6)
	w := wait(t, res, "answer")
	assertProblem(t, w, http.StatusServiceUnavailable, CodeLeaseLost)
	rec, err := b.record(t, "k")
	if err != nil || rec.State != idemstore.StateUnknown {
		t.Fatalf("the record: %+v, %v; want unknown", rec, err)
	}
	assertProblem(t, post(b.h, "k"), http.StatusConflict, idem.CodeOutcomeUnknown)
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("the upstream got %d requests, want 1", n)
	}
}

// TestAttemptHeader: the upstream gets the attempt's fencing token in
// Idempotency-Attempt, a new one for every attempt; a client's own header
// is never forwarded, protected or not.
func TestAttemptHeader(t *testing.T) {
	t.Parallel()
	up := newCountingUpstream(t, nil)
	store := idemmem.New(nil)
	p := New(mustURL(t, up.URL), &Config{Logger: quietLogger()})
	t.Cleanup(p.CloseIdleConnections)
	h := idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Logger: quietLogger()}})(p)
	send := func(key, forged string) string {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1}`))
		if key != "" {
			req.Header.Set(idem.HeaderKey, key)
		}
		req.Header.Set(idem.HeaderAttempt, forged)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			t.Fatalf("status %d", w.Code)
		}
		return up.attempt.Load().(string)
	}
	token := func(key string) string {
		t.Helper()
		rec, err := store.KeyGet(context.Background(), idemstore.Identity{Endpoint: "POST /v1/payments", Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return rec.Token
	}
	a := send("a", "forged")
	if a == "" || a == "forged" || a != token("a") {
		t.Fatalf("Idempotency-Attempt = %q, want the attempt's token %q", a, token("a"))
	}
	if b := send("b", "forged"); b == "" || b == a || b != token("b") {
		t.Fatalf("the second attempt's Idempotency-Attempt = %q, want its own token %q", b, token("b"))
	}
	if got := send("", "forged"); got != "" {
		t.Fatalf("an unprotected request forwarded Idempotency-Attempt %q", got)
	}
}
