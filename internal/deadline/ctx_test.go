package deadline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

type ctxKey struct{}

func TestOpCtx(t *testing.T) {
	t.Parallel()
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	var c Ctx

	ctx := c.Arm(parent, 30*time.Millisecond)
	cancel() // the client hangs up: the store call goes on
	if ctx.Err() != nil || ctx.Value(ctxKey{}) != "v" {
		t.Fatalf("err %v value %v", ctx.Err(), ctx.Value(ctxKey{}))
	}
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > 30*time.Millisecond {
		t.Fatalf("deadline %v %v", d, ok)
	}
	child, stop := context.WithCancel(ctx) // derived by a store
	defer stop()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed at the deadline")
	}
	if ctx.Err() != context.DeadlineExceeded {
		t.Fatalf("err %v", ctx.Err())
	}
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a derived context was not cancelled")
	}
	c.Disarm()

	// The next call starts afresh, and a disarmed context never expires.
	ctx = c.Arm(parent, time.Hour)
	if ctx.Err() != nil {
		t.Fatalf("re-armed context: %v", ctx.Err())
	}
	done := ctx.Done()
	c.Disarm()
	select {
	case <-done:
		t.Fatal("closed without a deadline")
	default:
	}

	// Err alone notices the deadline (no timer was started). The
	// deadline runs from the first look.
	var lazy Ctx
	ctx = lazy.Arm(parent, time.Millisecond)
	if err := ctx.Err(); err != nil {
		t.Fatalf("first look: %v", err)
	}
	time.Sleep(5 * time.Millisecond)
	if ctx.Err() != context.DeadlineExceeded || lazy.watched {
		t.Fatalf("lazy expiry: %v, watched %v", ctx.Err(), lazy.watched)
	}
	select {
	case <-ctx.Done():
	default:
		t.Fatal("Done of an expired context is open")
	}
}

// TestOpCtxDeadlines arms many contexts at once with different timeouts,
// as concurrent requests do: those still armed at their deadline expire
// (Done closes, a derived context is cancelled), those disarmed before it
// never do, and the list is left empty.
func TestOpCtxDeadlines(t *testing.T) {
	t.Parallel()
	const n = 200
	ctxs := make([]Ctx, n)
	var wg sync.WaitGroup
	for i := range ctxs {
		c := &ctxs[i]
		timeout := time.Duration(20+i%7*15) * time.Millisecond
		if i%2 == 1 {
			// Disarmed at once, well before its deadline, even on a
			// loaded machine: it must not expire.
			timeout += 200 * time.Millisecond
		}
		ctx := c.Arm(context.Background(), timeout)
		if i%2 == 1 {
			c.Disarm()
		}
		child, stop := context.WithCancel(ctx)
		defer stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 1 {
				done := ctx.Done()
				select {
				case <-done:
					t.Errorf("context %d closed after disarm", i)
				case <-time.After(timeout + 50*time.Millisecond):
				}
				return
			}
			select {
			case <-child.Done():
			case <-time.After(5 * time.Second):
				t.Errorf("context %d: not expired 5 s after a %v deadline", i, timeout)
				return
			}
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Errorf("context %d: %v", i, ctx.Err())
			}
			c.Disarm()
		}()
	}
	wg.Wait()
	Proc.listed(func(a *Alarm) {
		for i := range ctxs {
			if a == &ctxs[i].alarm {
				t.Errorf("context %d is still watched", i)
			}
		}
	})
}
