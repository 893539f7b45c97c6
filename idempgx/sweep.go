package idempgx

import (
	"sync"
	"time"
)

// The sweep's watermarks (see sweepMark).
const (
	// sweepSlack is how far before the previous pass's time a pass starts:
	// a lease committed up to a lease, the slack and the sweep interval late
	// (or by a node whose clock is as far behind) is still found.
	sweepSlack = 10 * time.Second
	// sweepDeepEvery is how often a deep pass runs, which starts that long
	// before the previous deep pass: a lease committed up to an hour late.
	sweepDeepEvery = time.Hour
)

// sweepMark is where KeySweep's next pass starts reading the sweep index
// (by locked_until). The index holds every record, so that a completion
// changes none of its entries, and a pass from the start would read every
// record's entry and row; a pass instead starts a little (sweepSlack)
// before the previous complete pass's time, so that it reads the records
// whose lease ended since then. A lease that becomes visible after the
// watermark passed it (committed late, or by a node with a clock behind)
// is found by a deep pass, every sweepDeepEvery from sweepDeepEvery before
// the previous one, and a lease later still by the store's first pass,
// which starts from the beginning, as does a pass whose clock went back.
type sweepMark struct {
	mu       sync.Mutex
	last     time.Time // time of the last complete pass; zero before the first
	from     time.Time // start of the next pass
	deepAt   time.Time // when the next deep pass runs
	deepFrom time.Time // start of the next deep pass
}

// start returns where a pass at now starts (nil: from the beginning) and
// whether it is a deep pass.
func (m *sweepMark) start(now time.Time) (*time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.last.IsZero() || now.Before(m.last):
		return nil, true
	case !now.Before(m.deepAt):
		from := m.deepFrom
		return &from, true
	default:
		from := m.from
		return &from, false
	}
}

// done records a complete pass (one that found fewer leases than its
// limit) that started at now. A pass that completes after a later one
// moves the watermarks back, which only makes the next pass read more.
func (m *sweepMark) done(now time.Time, deep bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.last = now
	m.from = now.Add(-sweepSlack)
	if deep || m.deepAt.IsZero() {
		m.deepFrom = now.Add(-sweepDeepEvery)
		m.deepAt = now.Add(sweepDeepEvery)
	}
}
