// Package deadline runs the middleware's deadlines: a sharded list of alarms
// with one runtime timer per shard (store-call deadlines and lease
// heartbeats), and the context of a request's store calls, which expires on
// it.
package deadline

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the time the alarms are due on: its readings and its timers.
type Clock interface {
	// Now returns the clock's current time.
	Now() time.Time
	// AfterFunc calls f once d has passed on the clock, unless stop is
	// called first; stop reports whether it prevented the call. It never
	// calls f before it returns. f must not block: the wall clock calls it
	// in a goroutine of its own, a test clock may call it from the goroutine
	// that moves the clock.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// WallClock is the wall clock: time.Now and time.AfterFunc.
var WallClock Clock = wallClock{}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// Wall is the process's alarm list on the wall clock, shared by every
// middleware that was given no clock of its own.
var Wall = NewAlarms(WallClock)

// Alarms calls its alarms back at their due time, with one timer of its
// clock set to the earliest of them. Every store call that waits (its
// deadline) and every running handler (its lease heartbeat) needs a timer;
// starting and stopping a runtime timer for each costs a network store
// several per cent of its throughput on two cores, while adding an alarm to
// the list and removing it is a few pointer writes under a mutex. The timer
// is reset only when an alarm is due before the time it is set to, which
// under steady load (alarms due in the order they were set) is when the list
// was empty. When it fires it takes every alarm that is due off the list and
// calls them back, then sets itself to the earliest one left.
//
// The list is sharded: an alarm goes to one of alarmShardCount lists, each
// with its own lock and timer, so that the requests of a busy process (three
// alarms set and cancelled each) do not queue on one lock.
type Alarms struct {
	clock  Clock
	next   atomic.Uint32 // the list the next alarm goes to, round robin
	shards [alarmShardCount]alarmList
}

// alarmShardCount is the number of lists; a power of two.
const alarmShardCount = 16

// NewAlarms returns an empty alarm list on clock c.
func NewAlarms(c Clock) *Alarms {
	s := &Alarms{clock: c}
	for i := range s.shards {
		s.shards[i].clock = c
	}
	return s
}

// Clock returns the list's clock.
func (s *Alarms) Clock() Clock { return s.clock }

// Set lists a, which must not be listed, on one of the lists, to call
// owner.Alarmed(gen) once the list's clock reads due.
func (s *Alarms) Set(a *Alarm, owner Owner, due time.Time, gen uint64) {
	l := &s.shards[s.next.Add(1)%alarmShardCount]
	a.list = l
	l.set(a, owner, due, gen)
}

// Cancel takes a off its list and reports whether it was still listed
// (false: it was never set, was cancelled, or has fired).
func (s *Alarms) Cancel(a *Alarm) bool {
	if a.list == nil {
		return false // never set
	}
	return a.list.cancel(a)
}

// listed calls f with each listed alarm, each list locked in turn.
func (s *Alarms) listed(f func(*Alarm)) {
	for i := range s.shards {
		l := &s.shards[i]
		l.mu.Lock()
		for a := l.head; a != nil; a = a.next {
			f(a)
		}
		l.mu.Unlock()
	}
}

// Alarm is an entry of the list, embedded in its owner.
type Alarm struct {
	owner Owner
	due   time.Time
	gen   uint64 // the owner's generation when set, passed back to it
	// list is the list it was last set on; set and cancel of one alarm
	// are never concurrent (its owner serialises them).
	list *alarmList
	// prev and next link the alarm while it is listed; they and listed
	// belong to alarmList.mu.
	prev, next *Alarm
	listed     bool
}

// Owner is called back, without the list's lock, when an alarm it set
// for generation gen is due. It must not block: it starts a goroutine for
// slow work.
type Owner interface {
	Alarmed(gen uint64)
}

type alarmList struct {
	clock Clock
	mu    sync.Mutex
	head  *Alarm
	stop  func() bool // stops the timer; nil before the first
	next  time.Time   // what the timer is set to; zero when stopped
}

// set lists a, which must not be listed, to call owner.Alarmed(gen) at due.
func (l *alarmList) set(a *Alarm, owner Owner, due time.Time, gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a.owner, a.due, a.gen = owner, due, gen
	a.prev, a.next, a.listed = nil, l.head, true
	if l.head != nil {
		l.head.prev = a
	}
	l.head = a
	if l.next.IsZero() || due.Before(l.next) {
		l.reset(due)
	}
}

// cancel takes a off the list and reports whether it was still listed
// (false: it was never set, was cancelled, or has fired).
func (l *alarmList) cancel(a *Alarm) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !a.listed {
		return false
	}
	l.unlink(a)
	return true
}

// unlink takes a listed alarm off the list. l.mu is held.
func (l *alarmList) unlink(a *Alarm) {
	if a.prev != nil {
		a.prev.next = a.next
	} else {
		l.head = a.next
	}
	if a.next != nil {
		a.next.prev = a.prev
	}
	a.prev, a.next, a.listed = nil, nil, false
}

// reset points the timer at t. l.mu is held.
//
// The timer is armed for a duration read off the clock. A clock other than
// the wall clock (a test's) can jump, from another goroutine, between that
// reading and the arming: the timer would then be set the jump's length
// late, and an alarm due when the clock has moved would wait for its next
// move. So on such a clock the timer is armed again, for what is left,
// while the clock moved more than real time passed meanwhile. On the wall
// clock the gap is the microseconds between two readings: the timer fires
// that much late, which no deadline or heartbeat notices.
func (l *alarmList) reset(t time.Time) {
	l.next = t
	if l.stop != nil {
		l.stop()
	}
	if l.clock == WallClock {
		l.stop = l.clock.AfterFunc(t.Sub(l.clock.Now()), l.fire)
		return
	}
	for {
		began := time.Now()
		now := l.clock.Now()
		l.stop = l.clock.AfterFunc(t.Sub(now), l.fire)
		if l.clock.Now().Sub(now) <= time.Since(began) {
			return
		}
		l.stop() // false when the jump ran it: fire then waits for l.mu
	}
}

// fire calls back the alarms that are due.
func (l *alarmList) fire() {
	type due struct {
		owner Owner
		gen   uint64
	}
	var calls []due
	l.mu.Lock()
	now := l.clock.Now()
	var earliest time.Time
	for a := l.head; a != nil; {
		next := a.next
		if !now.Before(a.due) {
			l.unlink(a)
			calls = append(calls, due{a.owner, a.gen})
		} else if earliest.IsZero() || a.due.Before(earliest) {
			earliest = a.due
		}
		a = next
	}
	l.next = time.Time{}
	if !earliest.IsZero() {
		l.reset(earliest)
	}
	l.mu.Unlock()
	for _, c := range calls {
		c.owner.Alarmed(c.gen)
	}
}
