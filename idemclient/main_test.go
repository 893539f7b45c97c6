package idemclient_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the package when a test leaks a goroutine, such as a
// connection whose abandoned response body was never closed. The check is
// written here rather than taken from go.uber.org/goleak so that the root
// module, which holds this package, names no test-only dependency: a
// program that imports idem gets only what idem's own packages need.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if stacks := leaked(5 * time.Second); stacks != nil {
			fmt.Fprintf(os.Stderr, "leaked goroutines:\n\n%s\n", strings.Join(stacks, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// leaked waits up to d for every goroutine but the caller's to end, and
// returns the stacks of those still running then.
func leaked(d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		stacks := otherGoroutines()
		if len(stacks) == 0 || time.Now().After(deadline) {
			return stacks
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// otherGoroutines returns the stacks of the goroutines other than the
// caller's, leaving out the test framework's and the runtime's own.
func otherGoroutines() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var stacks []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 || ignored(g) { // the first is the caller's
			continue
		}
		stacks = append(stacks, g)
	}
	return stacks
}

// ignored reports whether the goroutine of stack belongs to the testing
// package or the runtime rather than to a test.
func ignored(stack string) bool {
	for _, s := range []string{
		"testing.(*M).",
		"testing.tRunner",
		"testing.runTests",
		"os/signal.signal_recv",
		"os/signal.loop",
		"runtime.ensureSigM",
	} {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}

// TestLeakCheck: the check sees a goroutine a test left running, and stops
// seeing it once it ends.
func TestLeakCheck(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		leakCheckParked(stop)
	}()
	if stacks := leaked(50 * time.Millisecond); !strings.Contains(strings.Join(stacks, "\n"), "leakCheckParked") {
		t.Fatalf("a parked goroutine was not reported; stacks: %v", stacks)
	}
	close(stop)
	<-done
	for _, s := range leaked(time.Second) {
		if strings.Contains(s, "leakCheckParked") {
			t.Fatalf("an ended goroutine is still reported:\n%s", s)
		}
	}
}

func leakCheckParked(stop chan struct{}) { <-stop }
