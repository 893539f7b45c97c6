package idemtest_test

import (
	"fmt"
	"time"

	"github.com/idem-dev/idem/idemtest"
)

// The test clock moves only when told to: a lease, a deadline or a timer
// of the code under test runs when Advance reaches it, so tests never sleep.
func ExampleClock() {
	clock := idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	clock.AfterFunc(10*time.Second, func() { fmt.Println("lease renewal due at", clock.Now().Format(time.TimeOnly)) })
	clock.Advance(5 * time.Second)
	fmt.Println("now", clock.Now().Format(time.TimeOnly))
	clock.Advance(5 * time.Second)
	// Output:
	// now 03:04:10
	// lease renewal due at 03:04:15
}
