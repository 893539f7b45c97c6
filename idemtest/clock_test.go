package idemtest_test

import (
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
