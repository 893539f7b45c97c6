package idemtest

import (
	"slices"
	"sync"
	"time"
)

// Clock is a concurrency-safe test clock. Stores and workers take its Now
// method as their clock, and tests move time with Advance and Set instead of
// sleeping. Code that waits on the clock (the middleware's store deadlines,
// lease renewals and waits) takes the Clock itself: its timers (AfterFunc)
// fire when a test moves the clock past them.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*clockTimer // pending, in the order they were set
	// changed is closed and replaced when timers are added, so that
	// WaitForTimers can wait for them.
	changed chan struct{}
}

type clockTimer struct {
	due time.Time
	f   func()
}

// NewClock returns a Clock that reads t until it is moved.
func NewClock(t time.Time) *Clock {
	return &Clock{now: t}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (backward when d is negative), then
// runs the timers it made due (see AfterFunc).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	c.fire()
}

// Set moves the clock to t, then runs the timers it made due (see
// AfterFunc).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
	c.fire()
}

// AfterFunc calls f once the clock reads d from now or later, unless stop
// is called first; stop reports whether it prevented the call. Unlike
// time.AfterFunc, f runs on the goroutine that moves the clock (Advance or
// Set), before that call returns, timers in the order they are due: when
// Advance returns, what its timers do synchronously is done. With d <= 0, f
// runs at once in a goroutine of its own, as time.AfterFunc runs it.
func (c *Clock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	if d <= 0 {
		go f()
		return func() bool { return false }
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &clockTimer{due: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.timers, t)
		if i < 0 {
			return false
		}
		c.timers = slices.Delete(c.timers, i, i+1)
		return true
	}
}

// WaitForTimers blocks until at least n timers set with AfterFunc are
// pending (neither fired nor stopped): a test waits for the code under test
// to start waiting on the clock before it moves the clock.
func (c *Clock) WaitForTimers(n int) {
	for {
		c.mu.Lock()
		if len(c.timers) >= n {
			c.mu.Unlock()
			return
		}
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		ch := c.changed
		c.mu.Unlock()
		<-ch
	}
}

// fire runs the timers that are due, earliest first, one at a time and
// without the lock, so that a timer's function may use the clock.
func (c *Clock) fire() {
	for {
		c.mu.Lock()
		i := -1
		for j, t := range c.timers {
			if !t.due.After(c.now) && (i < 0 || t.due.Before(c.timers[i].due)) {
				i = j
			}
		}
		if i < 0 {
			c.mu.Unlock()
			return
		}
		t := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		c.mu.Unlock()
		t.f()
	}
}
