package idem

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// wait blocks until the record may have changed, waitOver is closed or the
// client leaves. It is woken by a completion in this process, by the store's
// notifications when it has them, and otherwise re-reads with backoff.
func (c *core) wait(ctx context.Context, a *attempt, rec *idemstore.Record, waitOver <-chan struct{}) bool {
	ch := c.hub.subscribe(a.id())
	defer c.hub.unsubscribe(a.id(), ch)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	woke := make(chan struct{}, 1)
	if c.waiter != nil {
		go func() {
			if c.waiter.KeyWait(ctx, a.id()) == nil {
				woke <- struct{}{}
			}
		}()
	}
	// Fallback for completions in other processes without notifications,
	// and for a completion in this one that published before ch was
	// subscribed: re-read at a pace tied to the attempt's progress. The
	// wall clock, not Config.Clock: a re-read decides nothing (the bound is
	// waitOver), and on a test clock that nobody moves a missed wake-up
	// would wait for ever.
	poll := time.NewTimer(min(time.Duration(retryAfter(c.clock.Now(), rec))*time.Second/4, c.cfg.Lease/3, time.Second))
	defer poll.Stop()
	select {
	case <-ch.c:
	case <-woke:
	case <-poll.C:
	case <-waitOver:
		return false
	case <-ctx.Done():
		return false
	}
	return true
}

// after returns a channel that is closed once d has passed on the core's
// clock, and the function that stops it.
func (c *core) after(d time.Duration) (<-chan struct{}, func() bool) {
	ch := make(chan struct{})
	return ch, c.clock.AfterFunc(d, func() { close(ch) })
}

// hub wakes requests waiting on a record in this process when an attempt
// finishes.
type hub struct {
	mu sync.Mutex
	m  map[idemstore.Identity]*waitChan
	// waiting counts the subscriptions, so that publish, which every
	// execution calls, skips the lock and the lookup when nobody waits. A
	// subscription that lands just after publish looked misses this wake-up
	// as it would have under the lock; the waiter's re-read covers it.
	waiting atomic.Int64
}

type waitChan struct {
	c    chan struct{}
	refs int
}

func (h *hub) subscribe(id idemstore.Identity) *waitChan {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[idemstore.Identity]*waitChan)
	}
	wc := h.m[id]
	if wc == nil {
		wc = &waitChan{c: make(chan struct{})}
		h.m[id] = wc
	}
	wc.refs++
	h.waiting.Add(1)
	return wc
}

func (h *hub) unsubscribe(id idemstore.Identity, wc *waitChan) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting.Add(-1)
	wc.refs--
	if wc.refs == 0 && h.m[id] == wc {
		delete(h.m, id)
	}
}

func (h *hub) publish(id idemstore.Identity) {
	if h.waiting.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if wc := h.m[id]; wc != nil {
		close(wc.c)
		delete(h.m, id)
	}
}
