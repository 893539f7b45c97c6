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

// Proc calls its alarms back at their due time, with one runtime timer
// for the whole process set to the earliest of them. Every store call that
// waits (its deadline) and every running handler (its lease heartbeat)
// needs a timer; starting and stopping a runtime timer for each costs a
// network store several per cent of its throughput on two cores, while
// adding an alarm to the list and removing it is a few pointer writes under
// a mutex. The timer is reset only when an alarm is due before the time it
// is set to, which under steady load (alarms due in the order they were
// set) is when the list was empty. When it fires it takes every alarm that
// is due off the list and calls them back, then sets itself to the earliest
// one left.
//
// The list is sharded: an alarm goes to one of alarmShardCount lists, each with
// its own lock and timer, so that the requests of a busy process (three
// alarms set and cancelled each) do not queue on one lock.
var Proc Alarms

// alarmShardCount is the number of lists; a power of two.
const alarmShardCount = 16

type Alarms struct {
	next   atomic.Uint32 // the list the next alarm goes to, round robin
	shards [alarmShardCount]alarmList
}

// Set lists a, which must not be listed, on one of the lists (see
// alarmList.set).
func (s *Alarms) Set(a *Alarm, owner Owner, due time.Time, gen uint64) {
	l := &s.shards[s.next.Add(1)%alarmShardCount]
	a.list = l
	l.set(a, owner, due, gen)
}

// Cancel takes a off its list (see alarmList.cancel).
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
	mu    sync.Mutex
	head  *Alarm
	timer *time.Timer
	next  time.Time // what the timer is set to; zero when stopped
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
func (l *alarmList) reset(t time.Time) {
	l.next = t
	if l.timer == nil {
		l.timer = time.AfterFunc(time.Until(t), l.fire)
		return
	}
	l.timer.Reset(time.Until(t))
}

// fire calls back the alarms that are due.
func (l *alarmList) fire() {
	type due struct {
		owner Owner
		gen   uint64
	}
	var calls []due
	l.mu.Lock()
	now := time.Now()
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
