package deadline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemtest"
)

type ctxKey struct{}

func newClock() *idemtest.Clock {
	return idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}

// within fails the test unless ch is closed within a generous bound: the
// derived contexts are cancelled by a goroutine of their own.
func within(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestCtx(t *testing.T) {
	t.Parallel()
	clock := newClock()
	alarms := NewAlarms(clock)
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	var c Ctx

	ctx := c.Arm(alarms, parent, 30*time.Second)
	cancel() // the client hangs up: the store call goes on
	if ctx.Err() != nil || ctx.Value(ctxKey{}) != "v" {
		t.Fatalf("err %v value %v", ctx.Err(), ctx.Value(ctxKey{}))
	}
	if d, ok := ctx.Deadline(); !ok || !d.Equal(clock.Now().Add(30*time.Second)) {
		t.Fatalf("deadline %v %v, want 30s from the clock's now", d, ok)
	}
	child, stop := context.WithCancel(ctx) // derived by a store
	defer stop()
	done := ctx.Done()
	clock.Advance(30*time.Second - time.Nanosecond)
	if isClosed(done) || ctx.Err() != nil {
		t.Fatalf("expired before the deadline: %v", ctx.Err())
	}
	clock.Advance(time.Nanosecond) // the alarm fires within Advance
	if !isClosed(done) || ctx.Err() != context.DeadlineExceeded {
		t.Fatalf("at the deadline: closed %v, err %v", isClosed(done), ctx.Err())
	}
	within(t, child.Done(), "a derived context was not cancelled")
	c.Disarm()

	// The next call starts afresh, and a disarmed context never expires,
	// nor does a late alarm of an earlier arm hit a later one.
	ctx = c.Arm(alarms, parent, time.Hour)
	if ctx.Err() != nil {
		t.Fatalf("re-armed context: %v", ctx.Err())
	}
	done = ctx.Done()
	c.Disarm()
	clock.Advance(2 * time.Hour)
	if isClosed(done) || ctx.Err() != nil {
		t.Fatalf("disarmed context expired: %v", ctx.Err())
	}
	ctx = c.Arm(alarms, parent, time.Second)
	done = ctx.Done()
	ctx = c.Arm(alarms, parent, time.Hour) // armed again without Disarm
	clock.Advance(time.Minute)
	if isClosed(done) || ctx.Err() != nil {
		t.Fatalf("the alarm of an earlier arm expired a later one: %v", ctx.Err())
	}
	c.Disarm()

	// Err alone notices the deadline (no alarm was set). The deadline runs
	// from the first look.
	var lazy Ctx
	ctx = lazy.Arm(alarms, parent, time.Second)
	clock.Advance(time.Hour) // before the first look: does not count
	if err := ctx.Err(); err != nil {
		t.Fatalf("first look: %v", err)
	}
	clock.Advance(time.Second - time.Nanosecond)
	if err := ctx.Err(); err != nil {
		t.Fatalf("before the deadline: %v", err)
	}
	clock.Advance(time.Nanosecond)
	if ctx.Err() != context.DeadlineExceeded || lazy.watched {
		t.Fatalf("lazy expiry: %v, watched %v", ctx.Err(), lazy.watched)
	}
	if !isClosed(ctx.Done()) {
		t.Fatal("Done of an expired context is open")
	}
	// AfterFunc on an expired context runs at once.
	ran := make(chan struct{})
	context.AfterFunc(ctx, func() { close(ran) })
	within(t, ran, "AfterFunc of an expired context did not run")

	// A stopped AfterFunc never runs.
	ctx = lazy.Arm(alarms, parent, time.Second)
	stopped := make(chan struct{})
	if !context.AfterFunc(ctx, func() { close(stopped) })() {
		t.Fatal("stop of a registered AfterFunc reported false")
	}
	clock.Advance(time.Minute)
	if ctx.Err() != context.DeadlineExceeded {
		t.Fatalf("err %v", ctx.Err())
	}
	lazy.Disarm()
	if isClosed(stopped) {
		t.Fatal("a stopped AfterFunc ran")
	}
	requireEmpty(t, alarms)
}

// TestCtxCancel: Cancel ends an armed context at once with
// context.Canceled (its Done closes, derived contexts follow), leaves its
// later expiry without effect, and does nothing to a disarmed one.
// TestCtxArmAt: the deadline counts from the reading given, not from the
// first look; the first look (Err, as the memory store's) finds it ahead,
// later looks compare the clock; Arm again counts from its own first look.
func TestCtxArmAt(t *testing.T) {
	t.Parallel()
	clock := newClock()
	alarms := NewAlarms(clock)
	var c Ctx
	at := clock.Now()
	clock.Advance(5 * time.Second) // between the reading and the first look
	ctx := c.ArmAt(alarms, context.Background(), 30*time.Second, at)
	if err := ctx.Err(); err != nil {
		t.Fatalf("first look: %v", err)
	}
	if d, ok := ctx.Deadline(); !ok || !d.Equal(at.Add(30*time.Second)) {
		t.Fatalf("deadline %v %v, want 30s from the reading given", d, ok)
	}
	done := ctx.Done()
	clock.Advance(25*time.Second - time.Nanosecond)
	if isClosed(done) || ctx.Err() != nil {
		t.Fatalf("expired before the deadline: %v", ctx.Err())
	}
	clock.Advance(time.Nanosecond)
	within(t, done, "the context did not expire at the deadline")
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("after the deadline: %v", ctx.Err())
	}
	c.Disarm()

	ctx = c.Arm(alarms, context.Background(), 30*time.Second)
	clock.Advance(time.Second)
	if d, ok := ctx.Deadline(); ctx.Err() != nil || !ok || !d.Equal(clock.Now().Add(30*time.Second)) {
		t.Fatalf("rearmed: err %v, deadline %v, want 30s from the first look", ctx.Err(), d)
	}
	c.Disarm()
	requireEmpty(t, alarms)
}

func TestCtxCancel(t *testing.T) {
	t.Parallel()
	clock := newClock()
	alarms := NewAlarms(clock)
	var c Ctx
	ctx := c.Arm(alarms, context.Background(), time.Minute)
	done := ctx.Done()
	child, stop := context.WithCancel(ctx)
	defer stop()
	c.Cancel()
	if !isClosed(done) || ctx.Err() != context.Canceled {
		t.Fatalf("after Cancel: closed %v, err %v", isClosed(done), ctx.Err())
	}
	within(t, child.Done(), "a derived context was not cancelled")
	clock.Advance(time.Hour)
	if ctx.Err() != context.Canceled {
		t.Fatalf("the expiry after Cancel changed the error to %v", ctx.Err())
	}
	c.Cancel() // twice: nothing
	c.Disarm()
	requireEmpty(t, alarms)

	ctx = c.Arm(alarms, context.Background(), time.Minute)
	if ctx.Err() != nil {
		t.Fatalf("re-armed after Cancel: %v", ctx.Err())
	}
	c.Disarm()
	c.Cancel() // disarmed: nothing
	if ctx.Err() != nil {
		t.Fatalf("Cancel of a disarmed context: %v", ctx.Err())
	}
}

// TestCtxWallClock runs one deadline on the wall clock, the production
// path: the store call's context expires and a derived context follows.
func TestCtxWallClock(t *testing.T) {
	t.Parallel()
	var c Ctx
	ctx := c.Arm(Wall, context.Background(), time.Millisecond)
	child, stop := context.WithCancel(ctx)
	defer stop()
	within(t, child.Done(), "a wall-clock deadline of 1ms did not expire within 10s")
	if ctx.Err() != context.DeadlineExceeded {
		t.Fatalf("err %v", ctx.Err())
	}
	c.Disarm()
}

// TestCtxDeadlines arms many contexts at once with different timeouts,
// from many goroutines, as concurrent requests do: when the clock passes a
// deadline, the contexts still armed on it have expired (Done is closed,
// a derived context is cancelled) and no other has; those disarmed before
// their deadline never expire, and the list is left empty.
func TestCtxDeadlines(t *testing.T) {
	t.Parallel()
	const n = 200
	clock := newClock()
	alarms := NewAlarms(clock)
	ctxs := make([]Ctx, n)
	type armed struct {
		ctx, child context.Context
		timeout    time.Duration
	}
	arms := make([]armed, n)
	var wg sync.WaitGroup
	for i := range ctxs {
		wg.Go(func() {
			c := &ctxs[i]
			timeout := time.Duration(1+i%7) * time.Second
			ctx := c.Arm(alarms, context.Background(), timeout)
			child, stop := context.WithCancel(ctx) // sets the alarm
			t.Cleanup(stop)
			if i%2 == 1 {
				c.Disarm()
			}
			arms[i] = armed{ctx, child, timeout}
		})
	}
	wg.Wait()
	for step := range 8 {
		elapsed := time.Duration(step) * time.Second
		for i, a := range arms {
			want := i%2 == 0 && a.timeout <= elapsed
			if got := isClosed(a.ctx.Done()); got != want {
				t.Fatalf("after %v: context %d (timeout %v, disarmed %v) closed %v", elapsed, i, a.timeout, i%2 == 1, got)
			}
			if want {
				within(t, a.child.Done(), "a derived context was not cancelled")
				if !errors.Is(a.ctx.Err(), context.DeadlineExceeded) {
					t.Fatalf("context %d: %v", i, a.ctx.Err())
				}
			}
		}
		clock.Advance(time.Second)
	}
	for i := range ctxs {
		ctxs[i].Disarm()
	}
	requireEmpty(t, alarms)
}

// requireEmpty fails unless no alarm is listed on alarms.
func requireEmpty(t *testing.T, alarms *Alarms) {
	t.Helper()
	alarms.listed(func(a *Alarm) {
		t.Errorf("an alarm due %v is still listed", a.due)
	})
}

// TestCtxValueWhileRearmed: a derived context's cancellation, run by the
// expiry in a goroutine of its own, asks the Ctx for values (context.Cause)
// while the next store call arms it again with its values: run with -race.
func TestCtxValueWhileRearmed(t *testing.T) {
	t.Parallel()
	clock := newClock()
	alarms := NewAlarms(clock)
	values := context.WithValue(context.Background(), ctxKey{}, "v")
	var c Ctx
	for range 50 {
		ctx := c.Arm(alarms, values, time.Second)
		child, stop := context.WithCancel(ctx)
		clock.Advance(time.Second)
		c.Arm(alarms, values, time.Second) // the completion's arm
		within(t, child.Done(), "the derived context was not cancelled")
		if got := context.Cause(child); !errors.Is(got, context.DeadlineExceeded) {
			t.Fatalf("cause %v, want the deadline", got)
		}
		stop()
		c.Disarm()
	}
}
