package console

import (
	"sync"
	"time"
)

// rateTracker keeps samples of the decision totals taken when the overview
// is shown, to turn totals into rates without a time-series database.
type rateTracker struct {
	mu      sync.Mutex
	samples []sample
}

type sample struct {
	at     time.Time
	totals map[string]float64
}

// Sampling bounds: a new sample at most every rateEvery, none older than
// rateWindow kept (beyond the oldest one needed).
const (
	rateEvery  = 10 * time.Second
	rateWindow = 5 * time.Minute
)

// observe records totals at now and returns the per-second rate of each
// decision since the oldest sample in the window, and that window's length
// (zero, and no rates, on the first observation).
func (t *rateTracker) observe(now time.Time, totals map[string]float64) (map[string]float64, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Drop samples older than the window, and any from the future (a clock
	// step back), keeping the most recent old one as the baseline.
	for len(t.samples) > 1 && now.Sub(t.samples[1].at) >= rateWindow {
		t.samples = t.samples[1:]
	}
	if len(t.samples) > 0 && now.Before(t.samples[len(t.samples)-1].at) {
		t.samples = nil
	}
	var rates map[string]float64
	var window time.Duration
	if len(t.samples) > 0 {
		base := t.samples[0]
		if window = now.Sub(base.at); window >= time.Second {
			rates = make(map[string]float64, len(totals))
			for name, v := range totals {
				if d := v - base.totals[name]; d >= 0 {
					rates[name] = d / window.Seconds()
				}
			}
		} else {
			window = 0
		}
	}
	if len(t.samples) == 0 || now.Sub(t.samples[len(t.samples)-1].at) >= rateEvery {
		cp := make(map[string]float64, len(totals))
		for k, v := range totals {
			cp[k] = v
		}
		t.samples = append(t.samples, sample{at: now, totals: cp})
	}
	return rates, window
}
