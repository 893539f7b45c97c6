package deadline

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Ctx is the context of one request's store calls (reserve, then the
// completion). It carries the request's values but not its cancellation, so
// a client that hangs up does not stop the outcome from being recorded, and
// it expires StoreTimeout after each arm (counted from the store's first
// look at it, which comes at once: arming reads no clock; or from the clock
// reading ArmAt is given). Its deadline is
// on the clock of the alarm list it is armed on.
//
// It costs the hot path nothing it does not use: embedded in the attempt, it
// is one allocation with the request, and its channel is made only when a
// store asks for Done (a network store does; the memory store only asks
// Err, which compares the clock with the deadline). Its expiry is an alarm
// of a shared list (see Alarms), not a runtime timer per call.
// It implements AfterFunc, so contexts a store derives from it
// are cancelled without a watcher goroutine each (see context.AfterFunc).
type Ctx struct {
	context.Context // values only: Deadline, Done and Err are Ctx's own

	mu       sync.Mutex
	alarms   *Alarms // the list of this arm
	timeout  time.Duration
	deadline time.Time // zero until start; with from, the arm's clock reading
	gen      uint64    // counts arms, so a late expiry cannot hit a later call
	armed    bool      // between arm and disarm
	watched  bool      // its alarm is set for this arm
	from     bool      // deadline holds ArmAt's reading, not the deadline yet
	// running counts the AfterFunc callbacks of an expiry still running:
	// one cancels a derived context and asks Err and Value of the arm that
	// expired (context.Cause), so the next arm waits for them before it
	// starts afresh. They run at once and briefly, and an arm finds one
	// running only when the store call ended on the expiry before they
	// did, so it yields to them rather than keeping a channel in every
	// Ctx.
	running int32
	alarm   Alarm
	done    chan struct{}
	err     error
	funcs   []*afterFunc  // usually one: a network store's watcher
	funcs1  [1]*afterFunc // funcs' first backing array
}

type afterFunc struct {
	f func()
	c *Ctx
}

// Arm starts a call: the context expires d from now on the clock of
// alarms. A context that expired during an earlier call starts afresh.
func (c *Ctx) Arm(alarms *Alarms, values context.Context, d time.Duration) context.Context {
	return c.arm(alarms, values, d, time.Time{})
}

// ArmAt is Arm for a caller that has just read the clock of alarms: the
// context expires d after now, and its first look reads no clock.
func (c *Ctx) ArmAt(alarms *Alarms, values context.Context, d time.Duration, now time.Time) context.Context {
	return c.arm(alarms, values, d, now)
}

// arm is Arm, counted from now when now is not zero.
func (c *Ctx) arm(alarms *Alarms, values context.Context, d time.Duration, now time.Time) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.running > 0 {
		c.mu.Unlock()
		runtime.Gosched()
		c.mu.Lock()
	}
	c.Context = values
	if c.watched { // armed again without disarm
		c.alarms.Cancel(&c.alarm)
	}
	c.alarms = alarms
	if c.err != nil {
		c.done, c.err, c.funcs = nil, nil, nil
	}
	c.timeout, c.deadline, c.from = d, now, !now.IsZero()
	c.armed, c.watched = true, false
	c.gen++
	return c
}

// start sets the deadline of this arm on its first use: a store call
// starts at once after arm, and a call that never looks costs no clock
// read. It returns the deadline. c.mu is held.
func (c *Ctx) start() time.Time {
	switch {
	case c.from:
		c.deadline, c.from = c.deadline.Add(c.timeout), false
	case c.deadline.IsZero():
		c.deadline = c.alarms.clock.Now().Add(c.timeout)
	}
	return c.deadline
}

// started reports whether start has set the deadline of this arm. c.mu
// is held.
func (c *Ctx) started() bool { return !c.deadline.IsZero() && !c.from }

// Disarm ends a call: the context does not expire until the next arm.
func (c *Ctx) Disarm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = false
	if c.watched {
		c.alarms.Cancel(&c.alarm)
		c.watched = false
	}
}

// tick sets the alarm of this arm. c.mu is held.
func (c *Ctx) tick() {
	if !c.armed || c.watched || c.err != nil {
		return
	}
	c.watched = true
	c.alarms.Set(&c.alarm, c, c.start(), c.gen)
}

// Alarmed expires the context if it is still on arm gen.
func (c *Ctx) Alarmed(gen uint64) {
	c.mu.Lock()
	if !c.armed || c.gen != gen || c.err != nil {
		c.mu.Unlock()
		return
	}
	c.watched = false // the alarm has fired
	funcs := c.expireLocked(context.DeadlineExceeded)
	c.mu.Unlock()
	for _, af := range funcs {
		go c.run(af.f)
	}
}

// expireLocked ends the context with err and returns the AfterFunc
// callbacks to run. c.mu is held.
func (c *Ctx) expireLocked(err error) []*afterFunc {
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	funcs := c.funcs
	c.funcs = nil
	c.running += int32(len(funcs))
	return funcs
}

// run runs an AfterFunc callback of an expiry, counted in running.
func (c *Ctx) run(f func()) {
	f()
	c.mu.Lock()
	c.running--
	c.mu.Unlock()
}

// Value implements context.Context with the values of the current arm,
// read under the lock: Arm replaces them.
func (c *Ctx) Value(key any) any {
	c.mu.Lock()
	values := c.Context
	c.mu.Unlock()
	return values.Value(key)
}

// Cancel ends the current arm at once with context.Canceled, as its expiry
// would end it with context.DeadlineExceeded. It does nothing when the
// context is not armed or has ended already.
func (c *Ctx) Cancel() {
	c.mu.Lock()
	if !c.armed || c.err != nil {
		c.mu.Unlock()
		return
	}
	funcs := c.expireLocked(context.Canceled)
	c.mu.Unlock()
	for _, af := range funcs {
		go c.run(af.f)
	}
}

// Deadline implements context.Context.
func (c *Ctx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start(), true
}

// Done implements context.Context.
func (c *Ctx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	c.tick()
	return c.done
}

// Err implements context.Context.
func (c *Ctx) Err() error {
	c.mu.Lock()
	if c.err == nil && c.armed && !c.started() {
		c.start() // the first look: the deadline is ahead
	} else if c.err == nil && c.armed && !c.alarms.clock.Now().Before(c.deadline) {
		funcs := c.expireLocked(context.DeadlineExceeded)
		c.mu.Unlock()
		for _, af := range funcs {
			go c.run(af.f)
		}
		return context.DeadlineExceeded
	}
	defer c.mu.Unlock()
	return c.err
}

// AfterFunc arranges for f to run in its own goroutine once the context
// expires, as context.AfterFunc does; the context package uses it to cancel
// derived contexts without a goroutine each.
func (c *Ctx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		c.running++
		go c.run(f)
		return func() bool { return false }
	}
	af := &afterFunc{f: f, c: c}
	if c.funcs == nil {
		c.funcs = c.funcs1[:0]
	}
	c.funcs = append(c.funcs, af)
	c.tick()
	return af.stop
}

// stop unregisters af, reporting whether it was still registered.
func (af *afterFunc) stop() bool {
	c := af.c
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.funcs, af)
	if i < 0 {
		return false
	}
	c.funcs = slices.Delete(c.funcs, i, i+1)
	return true
}

// WithTimeout returns a context with the values of parent but not its
// cancellation, which expires d from now on the clock of alarms, and the
// function that releases it. It is Ctx for a call that is not on the hot
// path: one allocation, no runtime timer.
func WithTimeout(alarms *Alarms, parent context.Context, d time.Duration) (context.Context, func()) {
	c := new(Ctx)
	return c.Arm(alarms, parent, d), c.Disarm
}
