package idem

import (
	"cmp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testenv"
)

// TestScopeLimitsBounded drives 1,000,000 distinct scopes through the
// per-scope limiter, each creating one key that finishes, as a tenant
// spray (or a long-lived process seeing every tenant once) does: the map
// of scopes stays within its bound, and so does the heap. Every scope in
// one instant (no bucket refills: only the hard bound can forget), one
// scope per microsecond, a rate whose bucket refills in 10 s, and both
// limits at once.
//
// Not parallel: the heap is measured, and the package's parallel tests
// only start once the serial ones are done.
func TestScopeLimitsBounded(t *testing.T) {
	n := 1_000_000
	if testenv.RaceEnabled {
		n = 200_000 // the race detector makes each lock about 20 times slower
	}
	for _, tc := range []struct {
		name          string
		scopes        int
		maxInProgress int
		rate          float64
		step          time.Duration
		bound         int // the most scopes tracked at once; maxTrackedScopes when 0
	}{
		{"rate, one instant", n, 0, 5, 0, 0},
		{"rate, a scope per microsecond", n, 0, 5, time.Microsecond, 0},
		{"rate below one per second", n / 4, 0, 0.1, time.Microsecond, 0},
		{"rate and in-progress limit", n / 4, 3, 5, 0, 0},
		// A bucket refills in 200 ms: the sweeps alone keep the map small.
		{"rate, a scope per millisecond", n / 4, 0, 5, time.Millisecond, minSweep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := liveHeap()
			l := newScopeLimits(tc.maxInProgress, tc.rate)
			now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			most := 0
			for i := range tc.scopes {
				scope := "tenant-" + strconv.Itoa(i)
				if ok, _ := l.admit(scope, now); !ok {
					t.Fatalf("scope %d, new, refused", i)
				}
				l.done(scope)
				most = max(most, len(l.scopes))
				now = now.Add(tc.step)
			}
			bound := cmp.Or(tc.bound, maxTrackedScopes)
			if most > bound {
				t.Errorf("the limiter tracked %d scopes at once, want at most %d", most, bound)
			}
			grew := int64(liveHeap()) - int64(before)
			t.Logf("%d scopes: at most %d tracked, live heap grew by %d KiB", tc.scopes, most, grew>>10)
			const limit = 32 << 20
			if grew > limit {
				t.Errorf("the live heap grew by %d MiB after %d scopes, want under %d MiB", grew>>20, tc.scopes, limit>>20)
			}
			runtime.KeepAlive(l)
		})
	}
}

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestScopeLimitsForgetOnlyIdle: forgetting scopes never tightens a limit
// nor loosens a busy scope's: a scope whose bucket is empty stays refused
// while the limiter forgets the scopes around it (below its hard bound
// only those whose bucket refilled), and a scope with requests in progress
// is never forgotten.
func TestScopeLimitsForgetOnlyIdle(t *testing.T) {
	t.Parallel()
	l := newScopeLimits(1, 1)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if ok, _ := l.admit("busy", now); !ok {
		t.Fatal("busy: refused")
	}
	if ok, _ := l.admit("spent", now); !ok {
		t.Fatal("spent: refused")
	}
	l.done("spent") // idle, its one token spent
	// Below the bound, in one instant: sweeps forget only refilled buckets.
	for i := range maxTrackedScopes / 4 {
		scope := "now-" + strconv.Itoa(i)
		l.admit(scope, now)
		l.done(scope)
	}
	if ok, _ := l.admit("spent", now); ok {
		t.Fatal("spent: admitted with an empty bucket after the sweeps below the bound")
	}
	// Past the bound, over time: idle scopes go, busy ones stay.
	for i := range 4 * maxTrackedScopes {
		scope := "later-" + strconv.Itoa(i)
		l.admit(scope, now)
		l.done(scope)
		now = now.Add(time.Millisecond)
	}
	if l.scopes["busy"] == nil {
		t.Fatal("a scope with a request in progress was forgotten")
	}
	if ok, _ := l.admit("busy", now); ok {
		t.Fatal("busy: admitted over its in-progress limit")
	}
	l.done("busy")
	if ok, _ := l.admit("busy", now); !ok {
		t.Fatal("busy: refused after its request finished")
	}
}
