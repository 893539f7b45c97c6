package idem

import (
	"context"
	"testing"
	"time"
)

type ctxKey struct{}

func TestOpCtx(t *testing.T) {
	t.Parallel()
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	var c opCtx

	ctx := c.arm(parent, 30*time.Millisecond)
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
	c.disarm()

	// The next call starts afresh, and a disarmed context never expires.
	ctx = c.arm(parent, time.Hour)
	if ctx.Err() != nil {
		t.Fatalf("re-armed context: %v", ctx.Err())
	}
	done := ctx.Done()
	c.disarm()
	select {
	case <-done:
		t.Fatal("closed without a deadline")
	default:
	}

	// Err alone notices the deadline (no timer was started). The
	// deadline runs from the first look.
	var lazy opCtx
	ctx = lazy.arm(parent, time.Millisecond)
	if err := ctx.Err(); err != nil {
		t.Fatalf("first look: %v", err)
	}
	time.Sleep(5 * time.Millisecond)
	if ctx.Err() != context.DeadlineExceeded || lazy.timer != nil {
		t.Fatalf("lazy expiry: %v timer %v", ctx.Err(), lazy.timer)
	}
	select {
	case <-ctx.Done():
	default:
		t.Fatal("Done of an expired context is open")
	}
}
