package idemtest_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemtest"
)

func TestClock(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	c := idemtest.NewClock(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want %v", got, start)
	}
	c.Advance(90 * time.Second)
	if got, want := c.Now(), start.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("after Advance: Now = %v, want %v", got, want)
	}
	c.Set(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("after Set: Now = %v, want %v", got, start)
	}

	// Concurrent use is safe (run with -race) and loses no advance.
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for range 20 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(time.Second); !got.Equal(want) {
		t.Fatalf("after 1000 concurrent advances of 1ms: Now = %v, want %v", got, want)
	}
}

// TestClockTimers pins down AfterFunc: a timer fires when the clock is moved
// to its due time, not before, in due order, on the goroutine that moves
// the clock; a stopped timer never fires; WaitForTimers returns once the
// timers are set.
func TestClockTimers(t *testing.T) {
	t.Parallel()
	c := idemtest.NewClock(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))
	var fired []string
	c.AfterFunc(2*time.Second, func() { fired = append(fired, "2s") })
	c.AfterFunc(time.Second, func() {
		fired = append(fired, "1s")
		// A timer set by a timer counts from the clock's time: the
		// end of the move.
		c.AfterFunc(500*time.Millisecond, func() { fired = append(fired, "2.5s") })
	})
	stop := c.AfterFunc(1500*time.Millisecond, func() { fired = append(fired, "stopped") })
	c.AfterFunc(time.Hour, func() { fired = append(fired, "1h") })
	if !stop() || stop() {
		t.Fatal("stop of a pending timer: want true, then false")
	}
	c.Advance(999 * time.Millisecond)
	if len(fired) != 0 {
		t.Fatalf("fired before due: %v", fired)
	}
	c.Advance(time.Second + time.Millisecond) // now 2s
	if got := strings.Join(fired, " "); got != "1s 2s" {
		t.Fatalf("fired %q, want %q", got, "1s 2s")
	}
	c.Advance(500 * time.Millisecond)
	if got := strings.Join(fired, " "); got != "1s 2s 2.5s" {
		t.Fatalf("fired %q, want %q", got, "1s 2s 2.5s")
	}
	c.Set(c.Now().Add(-time.Hour)) // backwards: nothing is due
	if len(fired) != 3 {
		t.Fatalf("fired going backwards: %v", fired)
	}

	// A timer due now runs at once, in a goroutine of its own.
	done := make(chan struct{})
	c.AfterFunc(0, func() { close(done) })
	<-done

	// WaitForTimers waits for a timer another goroutine sets.
	ready := make(chan struct{})
	go func() {
		<-ready
		c.AfterFunc(time.Minute, func() {})
		c.AfterFunc(time.Minute, func() {})
	}()
	close(ready)
	c.WaitForTimers(3) // the hour's timer and these two
}
