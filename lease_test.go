package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// These tests pin down the first defence of issue 24: an attempt never
// starts its effect after its lease is gone. The handler's context is
// cancelled, with cause idem.ErrLeaseLost, Config.LeaseMargin before the
// lease's end when renewals could not move that end, or at once when a
// renewal finds another attempt holding the key; and idem.CheckLease tells
// from the clock, even when the process was paused and its alarms have not
// run.

const testLease = 30 * time.Second // LeaseMargin defaults to Lease/6: 5 s

// holdHandler returns a handler that sends its request's context on ctxs
// and answers 503 once release is closed (a failure before any effect: the
// key is released, if the attempt still holds it).
func holdHandler() (ctxs chan context.Context, release chan struct{}, h http.HandlerFunc) {
	ctxs, release = make(chan context.Context, 1), make(chan struct{})
	return ctxs, release, func(w http.ResponseWriter, r *http.Request) {
		ctxs <- r.Context()
		<-release
		w.WriteHeader(http.StatusServiceUnavailable)
	}
}

// requireHeld fails the test when the attempt of ctx gave up its lease.
func requireHeld(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	if err := ctx.Err(); err != nil {
		t.Fatalf("%s: the handler's context is done (%v, cause %v), want it running", when, err, context.Cause(ctx))
	}
	if err := idem.CheckLease(ctx); err != nil {
		t.Fatalf("%s: CheckLease = %v, want nil", when, err)
	}
}

// requireLost fails the test unless the attempt of ctx gave up its lease:
// its context is cancelled (before anything asks CheckLease) and
// CheckLease fails.
func requireLost(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
		t.Fatalf("%s: the handler's context: %v, cause %v; want cancelled by ErrLeaseLost", when, ctx.Err(), context.Cause(ctx))
	}
	if err := idem.CheckLease(ctx); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("%s: CheckLease = %v, want ErrLeaseLost", when, err)
	}
}

func receive[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		panic("unreachable")
	}
}

// TestLeaseGivenUpWhenRenewalsFail: the store cannot be reached to renew
// the lease. Until LeaseMargin before the lease's end the handler runs on;
// at that moment its context is cancelled, while the lease is still the
// attempt's (a duplicate gets key-in-use, not outcome-unknown), so the
// handler can still record that it did nothing.
func TestLeaseGivenUpWhenRenewalsFail(t *testing.T) {
	t.Parallel()
	ctxs, release, h := holdHandler()
	b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Lease: testLease}}, h)
	b.store.failRenew.Store(true)
	first := b.goDo(t, "POST", "key-one", "{}")
	ctx := receive(t, ctxs, "handler")
	requireHeld(t, ctx, "at the start")
	b.clock.Advance(testLease / 3)
	receive(t, b.store.renewed, "renewal") // it failed
	requireHeld(t, ctx, "after a failed renewal")
	giveUp := testLease - testLease/6
	b.clock.Advance(giveUp - testLease/3 - time.Nanosecond)
	requireHeld(t, ctx, "a nanosecond before the margin")
	b.clock.Advance(time.Nanosecond)
	requireLost(t, ctx, "LeaseMargin before the lease's end")
	requireProblem(t, b.do(t, "POST", "key-one", "{}"), http.StatusConflict, "key-in-use")
	close(release)
	if w := answer(t, first); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d", w.Code)
	}
	// The handler's 503 released the key: the lease was still its own.
	b.store.failRenew.Store(false)
	if w := b.do(t, "POST", "key-one", "{}"); w.Code != http.StatusServiceUnavailable || b.calls.Load() != 2 {
		t.Fatalf("retry: %d after %d calls, want a second execution", w.Code, b.calls.Load())
	}
	if !strings.Contains(b.logs.String(), "could not be renewed in time") {
		t.Fatalf("the given-up lease was not logged:\n%s", b.logs)
	}
}

// TestLeaseGivenUpWhenTakenOver: a renewal finds another attempt holding
// the key; the handler's context is cancelled at once.
func TestLeaseGivenUpWhenTakenOver(t *testing.T) {
	t.Parallel()
	ctxs, release, h := holdHandler()
	defer close(release)
	b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Lease: testLease}}, h)
	b.store.loseRenew.Store(true)
	b.goDo(t, "POST", "key-one", "{}")
	ctx := receive(t, ctxs, "handler")
	requireHeld(t, ctx, "before the renewal")
	b.clock.Advance(testLease / 3)
	receive(t, ctx.Done(), "cancellation after the renewal found the key taken")
	requireLost(t, ctx, "after the renewal")
}

// TestLeaseKeptByRenewals: renewals that succeed move the lease's end, so a
// handler that runs for two leases is never cancelled.
func TestLeaseKeptByRenewals(t *testing.T) {
	t.Parallel()
	ctxs, release, h := holdHandler()
	defer close(release)
	b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Lease: testLease}}, h)
	b.goDo(t, "POST", "key-one", "{}")
	ctx := receive(t, ctxs, "handler")
	// Each renewal is due Lease/3 after the one before, which the renewer
	// sets once it has moved the lease's end: receiving renewal k means
	// renewal k-1 is done.
	for i := range 6 {
		b.clock.Advance(testLease / 3)
		requireHeld(t, ctx, fmt.Sprintf("%v after the start", time.Duration(i+1)*testLease/3))
		receive(t, b.store.renewed, "renewal")
	}
}

// pausedClock is a test clock that can jump without running its timers, as
// the wall clock does for a process that was stopped (SIGSTOP, a VM stall):
// its readings are ahead by slept, its timers due on the time before.
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

// pauseAfterReserve pauses the clock for d after every reservation: the
// process stopped while the store's answer was on its way.
type pauseAfterReserve struct {
	idemstore.Store
	clock *pausedClock
	d     time.Duration
}

func (s pauseAfterReserve) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	res, err := s.Store.KeyReserve(ctx, p)
	s.clock.sleep(s.d)
	return res, err
}

// TestCheckLeaseAfterPause: a process paused past its lease resumes before
// the alarm that gives the lease up has run. CheckLease reads the clock:
// it fails at once, and cancels the handler's context.
func TestCheckLeaseAfterPause(t *testing.T) {
	t.Parallel()
	t.Run("while the handler runs", func(t *testing.T) {
		t.Parallel()
		ctxs, release, h := holdHandler()
		defer close(release)
		clock := &pausedClock{Clock: idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Lease: testLease, Clock: clock}}, h)
		b.goDo(t, "POST", "key-one", "{}")
		ctx := receive(t, ctxs, "handler")
		requireHeld(t, ctx, "before the pause")
		clock.sleep(testLease - testLease/6 - time.Nanosecond)
		requireHeld(t, ctx, "after a pause a nanosecond short of the margin")
		clock.sleep(time.Nanosecond)
		if err := ctx.Err(); err != nil {
			t.Fatalf("the context is done before the alarms ran: %v; the test proves nothing", err)
		}
		if err := idem.CheckLease(ctx); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("after a pause into the margin: CheckLease = %v, want ErrLeaseLost", err)
		}
		requireLost(t, ctx, "after CheckLease")
	})
	t.Run("between the reservation and the handler", func(t *testing.T) {
		t.Parallel()
		clock := &pausedClock{Clock: idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
		var effects int
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Lease: testLease, Clock: clock}}, func(w http.ResponseWriter, r *http.Request) {
			if r.Context().Err() == nil {
				t.Error("the handler's context was not cancelled when the lease ran out before it started")
			}
			if err := idem.CheckLease(r.Context()); err != nil {
				requireLost(t, r.Context(), "in the handler")
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			effects++
			w.WriteHeader(http.StatusCreated)
		})
		b.store.Store = pauseAfterReserve{Store: b.store.Store, clock: clock, d: testLease}
		if w := b.do(t, "POST", "key-one", "{}"); w.Code != http.StatusServiceUnavailable || effects != 0 {
			t.Fatalf("answer %d with %d effects, want 503 and none", w.Code, effects)
		}
	})
}

// TestFencingTokenFromContext: the handler reads its attempt's token, a
// new one for every attempt.
func TestFencingTokenFromContext(t *testing.T) {
	t.Parallel()
	var tokens []string
	b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		tok, ok := idem.FencingTokenFromContext(r.Context())
		if !ok || tok == "" {
			t.Error("no fencing token in a protected request")
		}
		tokens = append(tokens, tok)
		w.WriteHeader(http.StatusServiceUnavailable) // released: the retry is a new attempt
	})
	b.do(t, "POST", "key-one", "{}")
	b.do(t, "POST", "key-one", "{}")
	if len(tokens) != 2 || tokens[0] == tokens[1] {
		t.Fatalf("tokens %q, want two different ones", tokens)
	}
	if tok, ok := idem.FencingTokenFromContext(context.Background()); ok || tok != "" {
		t.Fatalf("outside a protected request: %q, %v", tok, ok)
	}
	if err := idem.CheckLease(context.Background()); err != nil {
		t.Fatalf("CheckLease outside a protected request: %v", err)
	}
}
