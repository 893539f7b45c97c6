package idem

import (
	"math"
	"sync"
	"time"
)

// maxTrackedScopes bounds the scopes the limiter tracks, apart from scopes
// with a request in progress, which concurrency bounds. At about 150 bytes
// a scope it is 10 MiB at most.
const maxTrackedScopes = 1 << 16

// minSweep is the map size of the first sweep: below it, sweeping is not
// worth its cost.
const minSweep = 1024

// scopeLimits bounds, per scope and in this process, the requests holding a
// lease and the rate of new keys (a token bucket with a burst of one second's
// worth). A nil *scopeLimits admits everything.
//
// A scope is tracked while it has requests in progress or its bucket is
// not full: a scope that is not tracked starts with a full bucket, so
// forgetting an idle scope whose bucket refilled changes nothing. A scope
// goes when its last request finishes with its bucket full, and otherwise
// at a sweep: whenever the map has doubled since the last one, admit drops
// the idle scopes whose bucket refilled by now, so the sweeps cost O(1) a
// new scope. The map then holds the scopes active in the last refill time
// (one second, or 1/rate when the rate is below one a second). Should
// those be more than maxTrackedScopes/2, the sweep also drops idle scopes
// whose bucket is not full yet: each gets a full bucket again, which
// loosens its rate by at most one burst, never tightens a limit, and never
// touches a scope with a request in progress (whose slots are the
// in-progress limit). The map holds at most maxTrackedScopes scopes, or
// twice the scopes with requests in progress when those are more.
type scopeLimits struct {
	maxInProgress int
	rate          float64
	burst         float64 // the bucket's size: max(rate, 1)

	mu      sync.Mutex
	scopes  map[string]*scopeState
	sweepAt int // the map's size that triggers the next sweep
}

type scopeState struct {
	inProgress int
	tokens     float64
	last       time.Time
}

func newScopeLimits(maxInProgress int, rate float64) *scopeLimits {
	return &scopeLimits{
		maxInProgress: maxInProgress,
		rate:          rate,
		burst:         max(rate, 1),
		scopes:        make(map[string]*scopeState),
		sweepAt:       minSweep,
	}
}

// admit takes an in-progress slot and a rate token for a request that may
// create a key. It answers false and a Retry-After in seconds when over a limit.
func (l *scopeLimits) admit(scope string, now time.Time) (bool, int) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.scopes[scope]
	if s == nil {
		if len(l.scopes) >= l.sweepAt {
			l.sweep(now)
		}
		s = &scopeState{tokens: l.burst, last: now}
		l.scopes[scope] = s
	}
	if l.maxInProgress > 0 && s.inProgress >= l.maxInProgress {
		return false, 1
	}
	if l.rate > 0 {
		s.tokens = l.refilled(s, now)
		s.last = now
		if s.tokens < 1 {
			return false, max(int(math.Ceil((1-s.tokens)/l.rate)), 1)
		}
		s.tokens--
	}
	s.inProgress++
	return true, 0
}

// refilled returns the tokens in s's bucket at now.
func (l *scopeLimits) refilled(s *scopeState, now time.Time) float64 {
	return min(s.tokens+now.Sub(s.last).Seconds()*l.rate, l.burst)
}

// refund returns the slot and the token of a request that created nothing
// (a replay, a conflict, a store error).
func (l *scopeLimits) refund(scope string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.scopes[scope]; s != nil {
		s.inProgress--
		if l.rate > 0 {
			s.tokens = min(s.tokens+1, l.burst)
		}
		l.forget(scope, s)
	}
}

// done returns the slot of a request whose attempt finished.
func (l *scopeLimits) done(scope string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.scopes[scope]; s != nil {
		s.inProgress--
		l.forget(scope, s)
	}
}

// forget drops an idle scope whose bucket is full: it is as good as new.
func (l *scopeLimits) forget(scope string, s *scopeState) {
	if s.inProgress == 0 && (l.rate == 0 || s.tokens >= l.burst) {
		delete(l.scopes, scope)
	}
}

// sweep drops the idle scopes whose bucket refilled by now and, when more
// than half the bound remain, idle scopes whose bucket has not (see
// scopeLimits). It sets the size of the next sweep. l.mu is held.
func (l *scopeLimits) sweep(now time.Time) {
	for scope, s := range l.scopes {
		if s.inProgress == 0 && (l.rate == 0 || l.refilled(s, now) >= l.burst) {
			delete(l.scopes, scope)
		}
	}
	for scope, s := range l.scopes {
		if len(l.scopes) <= maxTrackedScopes/2 {
			break
		}
		if s.inProgress == 0 {
			delete(l.scopes, scope)
		}
	}
	l.sweepAt = max(2*len(l.scopes), minSweep)
}
