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
type renewer struct {
	a       *attempt
	mu      sync.Mutex
	stopped bool
	due     time.Time // of the next renewal
	alarm   deadline.Alarm
}

func (rn *renewer) start(a *attempt) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.a = a
	rn.due = a.c.clock.Now().Add(a.c.cfg.Lease / 3)
	a.c.alarms.Set(&rn.alarm, rn, rn.due, 0)
}

// Alarmed renews the lease in a goroutine of its own: the list calls its
// alarms back one after the other.
func (rn *renewer) Alarmed(uint64) {
	go rn.renew()
}

func (rn *renewer) renew() {
	a, c := rn.a, rn.a.c
	rn.mu.Lock()
	stopped := rn.stopped
	rn.mu.Unlock()
	if stopped {
		return
	}
	ctx, cancel := deadline.WithTimeout(c.alarms, context.Background(), c.cfg.StoreTimeout)
	start := c.clockStart()
	err := c.store.KeyRenew(ctx, &idemstore.RenewParams{Identity: a.id, Token: a.token, Lease: c.cfg.Lease})
	c.storeCall("renew", start, err)
	cancel()
	if errors.Is(err, idemstore.ErrLeaseLost) {
		c.log.Warn("idem: lease lost while the handler runs", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint)
		return
	}
	if err != nil {
		c.log.Error("idem: renewing the lease failed", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "error", err)
	}
	rn.mu.Lock()
	running := !rn.stopped
	if running {
		// Lease/3 after the last one was due, not after it returned, so
		// that the pace does not drift with the store's latency, and at
		// once when that is past already (the clock moved on meanwhile).
		rn.due = rn.due.Add(c.cfg.Lease / 3)
		if now := c.clock.Now(); rn.due.Before(now) {
			rn.due = now
		}
		c.alarms.Set(&rn.alarm, rn, rn.due, 0)
	}
	rn.mu.Unlock()
	if running && err == nil && a.heartbeat != nil {
		a.heartbeat()
	}
}

// stop ends the heartbeat; it is safe to call more than once.
func (rn *renewer) stop() {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.stopped || rn.a == nil {
		return
	}
	rn.stopped = true
	rn.a.c.alarms.Cancel(&rn.alarm)
}
