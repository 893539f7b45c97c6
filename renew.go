package idem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/deadline"
)

// renewer heartbeats the lease every Lease/3 while the handler runs, on an
// alarm of the core's list rather than a goroutine or a runtime timer
// per request.
//
// It also watches the lease's end. The end is counted on the core's clock
// from the moment the last reservation or renewal that succeeded was sent
// (the store counts it from when it got the call, which is no earlier), so
// this process never believes it holds a lease the store already let go.
// Config.LeaseMargin before that end, unless a renewal has moved it, the
// attempt gives up its lease: the handler's context is cancelled with cause
// ErrLeaseLost, and CheckLease fails from then on. A renewal that finds
// another attempt holding the key gives it up at once. A process that was
// paused past the end (its alarms late) finds it out from the clock, in
// CheckLease, before its alarm fires.
type renewer struct {
	a       *attempt
	mu      sync.Mutex
	stopped bool
	due     time.Time // of the next renewal
	alarm   deadline.Alarm

	// until is when the attempt gives up its lease: the lease's end less
	// Config.LeaseMargin. expiry is its alarm.
	until  time.Time
	expiry deadline.Alarm
	// lost reports that the attempt gave up its lease; it never holds it
	// again.
	lost bool
	// cancel cancels the handler's context.
	cancel context.CancelCauseFunc
	// onLost are the functions AfterLeaseLost registered; onLost1 is
	// their first backing array.
	onLost  []func()
	onLost1 [1]func()
}

// The generations of the renewer's two alarms: Alarmed tells them apart.
const (
	alarmRenew uint64 = iota
	alarmExpiry
)

// start starts the heartbeat of the attempt a, whose reservation was sent
// at reserved, and the watch of its lease, which cancel ends.
func (rn *renewer) start(a *attempt, reserved time.Time, cancel context.CancelCauseFunc) {
	rn.mu.Lock()
	rn.a, rn.cancel = a, cancel
	c := a.c
	if offHeartbeat { // a benchmark build measuring what the heartbeat costs
		rn.until = reserved.Add(24 * time.Hour) // never given up in a run
		rn.mu.Unlock()
		return
	}
	rn.until = reserved.Add(c.cfg.Lease - c.cfg.LeaseMargin)
	if !c.clock.Now().Before(rn.until) {
		// The reservation took the whole lease (a pause, a slow store):
		// the handler starts with its context cancelled.
		rn.mu.Unlock()
		rn.giveUp("idem: the lease ran out before the handler started")
		return
	}
	rn.due = c.clock.Now().Add(c.cfg.Lease / 3)
	c.alarms.Set(&rn.alarm, rn, rn.due, alarmRenew)
	c.alarms.Set(&rn.expiry, rn, rn.until, alarmExpiry)
	rn.mu.Unlock()
}

// Alarmed renews the lease in a goroutine of its own (the list calls its
// alarms back one after the other), or gives the lease up when it was not
// renewed in time.
func (rn *renewer) Alarmed(gen uint64) {
	if gen == alarmExpiry {
		rn.expire()
		return
	}
	go rn.renew()
}

// msgNotRenewed is logged when the lease's end comes before a renewal
// moved it, found by the expiry alarm or by CheckLease.
const msgNotRenewed = "idem: the lease could not be renewed in time; the handler's context is cancelled"

// expire gives the lease up when the clock has reached until: the alarm
// may come late, after a renewal moved until on.
func (rn *renewer) expire() {
	rn.mu.Lock()
	due := !rn.stopped && !rn.lost && !rn.a.c.clock.Now().Before(rn.until)
	rn.mu.Unlock()
	if due {
		rn.giveUp(msgNotRenewed)
	}
}

// giveUp marks the lease lost, stops the heartbeat and cancels the
// handler's context with cause ErrLeaseLost, once, logging msg.
func (rn *renewer) giveUp(msg string) {
	rn.mu.Lock()
	if rn.lost {
		rn.mu.Unlock()
		return
	}
	rn.lost = true
	c := rn.a.c
	c.alarms.Cancel(&rn.alarm)
	c.alarms.Cancel(&rn.expiry)
	stopped, funcs := rn.stopped, rn.onLost
	rn.onLost = nil
	rn.mu.Unlock()
	if !stopped {
		c.log.Warn(msg, "key_hash", rn.a.keyHash(), "endpoint", rn.a.metricsEndpoint())
	}
	rn.cancel(ErrLeaseLost)
	if !stopped {
		for _, f := range funcs {
			go f()
		}
	}
}

// afterLost arranges for f to run in a goroutine of its own when the
// attempt gives its lease up, at once if it has. It reports false, and
// never runs f, once the handler has returned.
func (rn *renewer) afterLost(f func()) bool {
	rn.mu.Lock()
	if rn.stopped {
		rn.mu.Unlock()
		return false
	}
	if rn.lost {
		rn.mu.Unlock()
		go f()
		return true
	}
	if rn.onLost == nil {
		rn.onLost = rn.onLost1[:0]
	}
	rn.onLost = append(rn.onLost, f)
	rn.mu.Unlock()
	return true
}

// check returns ErrLeaseLost when the attempt gave up its lease or the
// clock says it should have: when the process was paused past until, the
// alarm may not have fired yet.
func (rn *renewer) check() error {
	rn.mu.Lock()
	lost, late := rn.lost, !rn.a.c.clock.Now().Before(rn.until)
	rn.mu.Unlock()
	if lost {
		return ErrLeaseLost
	}
	if late {
		rn.giveUp(msgNotRenewed)
		return ErrLeaseLost
	}
	return nil
}

func (rn *renewer) renew() {
	a, c := rn.a, rn.a.c
	rn.mu.Lock()
	done := rn.stopped || rn.lost
	rn.mu.Unlock()
	if done {
		return
	}
	ctx, cancel := deadline.WithTimeout(c.alarms, context.Background(), c.cfg.StoreTimeout)
	sent := c.clock.Now()
	start := c.clockStart()
	err := c.store.KeyRenew(ctx, &idemstore.RenewParams{Identity: a.id(), Token: a.token(), Lease: c.cfg.Lease})
	c.storeCall("renew", start, err)
	cancel()
	if errors.Is(err, idemstore.ErrLeaseLost) {
		rn.giveUp("idem: lease lost while the handler runs; the handler's context is cancelled")
		return
	}
	if err != nil {
		c.log.Error("idem: renewing the lease failed", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "error", err)
	}
	rn.mu.Lock()
	if rn.stopped || rn.lost {
		rn.mu.Unlock()
		return
	}
	if until := sent.Add(c.cfg.Lease - c.cfg.LeaseMargin); err == nil && until.After(rn.until) {
		rn.until = until
		c.alarms.Cancel(&rn.expiry)
		c.alarms.Set(&rn.expiry, rn, rn.until, alarmExpiry)
	}
	// Lease/3 after the last one was due, not after it returned, so
	// that the pace does not drift with the store's latency, and at
	// once when that is past already (the clock moved on meanwhile).
	rn.due = rn.due.Add(c.cfg.Lease / 3)
	if now := c.clock.Now(); rn.due.Before(now) {
		rn.due = now
	}
	c.alarms.Set(&rn.alarm, rn, rn.due, alarmRenew)
	rn.mu.Unlock()
	// Once the lease's end has moved: an adapter's heartbeat (idemnats's
	// InProgress) tells that the attempt is alive only when it is.
	if err == nil && a.heartbeat != nil {
		a.heartbeat()
	}
}

// stop ends the heartbeat and the watch of the lease, and cancels the
// handler's context (the handler has returned); it is safe to call more
// than once.
func (rn *renewer) stop() {
	rn.mu.Lock()
	if rn.stopped || rn.a == nil {
		rn.mu.Unlock()
		return
	}
	rn.stopped = true
	rn.onLost = nil
	rn.a.c.alarms.Cancel(&rn.alarm)
	rn.a.c.alarms.Cancel(&rn.expiry)
	rn.mu.Unlock()
	rn.cancel(nil)
}
