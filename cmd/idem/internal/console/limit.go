package console

import (
	"net"
	"sync"
	"time"
)

// maxTrackedAddrs bounds the client addresses whose failures are counted
// one by one; beyond it, the failures of new addresses share one count, so
// an attacker with many addresses cannot grow the map without bound.
const maxTrackedAddrs = 10000

// overflowAddr is the count new addresses share once maxTrackedAddrs is reached.
const overflowAddr = "(overflow)"

// failureLimiter counts failed authentications (form logins and wrong
// bearer tokens) per client address and per minute. An address over the
// limit waits for its minute to end; other addresses are not affected, so a
// guesser cannot lock the operators out.
type failureLimiter struct {
	max int

	mu    sync.Mutex
	addrs map[string]*failureWindow
}

type failureWindow struct {
	start    time.Time
	failures int
}

// clientAddr is the address failures are counted under: the host of the
// connection's remote address, without the port.
func clientAddr(remoteAddr string) string {
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil {
		return host
	}
	return remoteAddr
}

// window returns addr's window at now, started afresh when the last one is
// over. Called with l.mu held.
func (l *failureLimiter) window(addr string, now time.Time) *failureWindow {
	if l.addrs == nil {
		l.addrs = make(map[string]*failureWindow)
	}
	w := l.addrs[addr]
	if w == nil {
		if len(l.addrs) >= maxTrackedAddrs {
			l.prune(now)
			if len(l.addrs) >= maxTrackedAddrs {
				addr = overflowAddr
				if w = l.addrs[addr]; w != nil {
					renew(w, now)
					return w
				}
			}
		}
		w = &failureWindow{start: now}
		l.addrs[addr] = w
	}
	renew(w, now)
	return w
}

// renew starts a new window when w's minute is over (or the clock went
// back).
func renew(w *failureWindow, now time.Time) {
	if now.Sub(w.start) >= time.Minute || now.Before(w.start) {
		w.start, w.failures = now, 0
	}
}

// prune drops the windows whose minute is over.
func (l *failureLimiter) prune(now time.Time) {
	for a, w := range l.addrs {
		if now.Sub(w.start) >= time.Minute || now.Before(w.start) {
			delete(l.addrs, a)
		}
	}
}

// allowed reports whether addr's failures of the current minute are under
// the limit, and otherwise the seconds until its minute ends.
func (l *failureLimiter) allowed(addr string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.window(addr, now)
	if w.failures < l.max {
		return true, 0
	}
	return false, max(int((time.Minute-now.Sub(w.start)+time.Second-1)/time.Second), 1)
}

// failed counts a failure of addr and returns the failures of its minute.
func (l *failureLimiter) failed(addr string, now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.window(addr, now)
	w.failures++
	return w.failures
}
