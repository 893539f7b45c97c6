package idemnats

import (
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
)

// TestErrorDelay: after the handler failed on delivery n the delay is
// ErrorDelay·2^(n-1), at most MaxErrorDelay, jittered within its upper
// half; a negative ErrorDelay naks at once.
func TestErrorDelay(t *testing.T) {
	t.Parallel()
	c := New(idemmem.New(nil), nil, &Config{ErrorDelay: 100 * time.Millisecond, MaxErrorDelay: 2 * time.Second})
	for n := uint64(1); n <= 70; n++ {
		want := 2 * time.Second
		if n <= 5 {
			want = 100 * time.Millisecond << (n - 1) // 100 ms to 1.6 s
		}
		lo, hi := want, time.Duration(0)
		for range 200 {
			d := c.errorDelay(n)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < want/2 || hi > want || hi-lo < want/4 {
			t.Errorf("delivery %d: delays in [%v, %v], want jittered over [%v, %v]", n, lo, hi, want/2, want)
		}
	}
	defaults := New(idemmem.New(nil), nil, nil)
	if d := defaults.errorDelay(1); d < 500*time.Millisecond || d > time.Second {
		t.Errorf("default first delay %v, want within [0.5 s, 1 s]", d)
	}
	if d := defaults.errorDelay(1000); d < 150*time.Second || d > 5*time.Minute {
		t.Errorf("default delay after 1000 deliveries %v, want within [2.5 min, 5 min]", d)
	}
	atOnce := New(idemmem.New(nil), nil, &Config{ErrorDelay: -1})
	if d := atOnce.errorDelay(7); d != 0 {
		t.Errorf("negative ErrorDelay: %v, want 0 (nak at once)", d)
	}
}

func TestVersionAtLeast(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		version string
		want    bool
	}{
		{"2.10.4", true},
		{"v2.10.4", true},
		{"2.10.5", true},
		{"2.11.0", true},
		{"3.0.0", true},
		{"2.14.9-beta.1", true},
		{"2.10.3", false},
		{"2.9.10", false},
		{"1.99.99", false},
		{"", false},
		{"2.10", false},
		{"x.y.z", false},
	} {
		if got := versionAtLeast(tc.version, 2, 10, 4); got != tc.want {
			t.Errorf("versionAtLeast(%q, 2.10.4) = %v, want %v", tc.version, got, tc.want)
		}
	}
}
