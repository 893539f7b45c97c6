package idem

import (
	"math"
	"sync"
	"time"
)

// scopeLimits bounds, per scope and in this process, the requests holding a
// lease and the rate of new keys (a token bucket with a burst of one second's
// worth). A nil *scopeLimits admits everything.
type scopeLimits struct {
	maxInProgress int
	rate          float64

	mu     sync.Mutex
	scopes map[string]*scopeState
}

type scopeState struct {
	inProgress int
	tokens     float64
	last       time.Time
}

func newScopeLimits(maxInProgress int, rate float64) *scopeLimits {
	return &scopeLimits{maxInProgress: maxInProgress, rate: rate, scopes: make(map[string]*scopeState)}
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
		s = &scopeState{tokens: max(l.rate, 1), last: now}
		l.scopes[scope] = s
	}
	if l.maxInProgress > 0 && s.inProgress >= l.maxInProgress {
		return false, 1
	}
	if l.rate > 0 {
		s.tokens = min(s.tokens+now.Sub(s.last).Seconds()*l.rate, max(l.rate, 1))
		s.last = now
		if s.tokens < 1 {
			return false, max(int(math.Ceil((1-s.tokens)/l.rate)), 1)
		}
		s.tokens--
	}
	s.inProgress++
	return true, 0
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
			s.tokens = min(s.tokens+1, max(l.rate, 1))
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

// forget drops an idle scope whose bucket is full, so the map stays bounded
// by the scopes active in the last second.
func (l *scopeLimits) forget(scope string, s *scopeState) {
	if s.inProgress == 0 && (l.rate == 0 || s.tokens >= max(l.rate, 1)) {
		delete(l.scopes, scope)
	}
}
