package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// trafficShot is one request of the traffic of TestRedisKilledMidTraffic.
type trafficShot struct {
	key          string
	sent, answer time.Time
	a            answer
}

// TestRedisKilledMidTraffic kills the redis-server under an `idem proxy`
// that is serving traffic, then starts it again on the same port. Every
// request sent after the kill gets 503 store-unavailable (problem+json,
// Retry-After) and never reaches the upstream: the proxy fails closed.
// Once Redis is back the same proxy process serves new keys again by
// itself.
//
// The Redis of the test has no persistence, so the records written before
// the kill are lost with it: a retry of such a key after the restart would
// execute again. That is the documented limit of the Redis store (durable
// only as far as Redis persistence is configured), not tested here.
func TestRedisKilledMidTraffic(t *testing.T) {
	t.Parallel()
	r := startRedisServer(t)
	up := newUpstream(t, 0, nil)
	p := startRedisProxy(t, "proxy", up.URL, r, "--lease", "5s")
	url := p.URL + "/v1/payments"
	const body = `{"amount":1000,"currency":"EUR"}`

	// Traffic: a few clients, each sending new keys back to back.
	var (
		mu    sync.Mutex
		shots []trafficShot
		seq   int
	)
	ctx, stopTraffic := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				seq++
				key := fmt.Sprintf("traffic-%05d", seq)
				mu.Unlock()
				s := trafficShot{key: key, sent: time.Now()}
				s.a = post(ctx, url, key, body)
				s.answer = time.Now()
				if ctx.Err() != nil && s.a.err != nil {
					return // canceled by the test, not answered
				}
				mu.Lock()
				shots = append(shots, s)
				mu.Unlock()
			}
		})
	}
	defer func() { stopTraffic(); wg.Wait() }()
	// countWhere counts the shots that satisfy f.
	countWhere := func(f func(s trafficShot) bool) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range shots {
			if f(s) {
				n++
			}
		}
		return n
	}
	waitFor := func(what string, f func(s trafficShot) bool, n int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for countWhere(f) < n {
			if time.Now().After(deadline) {
				t.Fatalf("waited 60s for %d answers %s; output of the proxy:\n%s", n, what, p.output())
			}
			time.Sleep(10 * time.Millisecond) // the traffic runs on real time
		}
	}
	executed := func(s trafficShot) bool {
		return s.a.err == nil && s.a.status == http.StatusCreated && s.a.replayed == ""
	}
	waitFor("executed before the kill", executed, 50)

	r.Kill()
	killed := time.Now()
	totalAtKill := up.total()
	sentAfterKill := func(s trafficShot) bool { return s.sent.After(killed) }
	waitFor("to requests sent after the kill", sentAfterKill, 40)
	stopTraffic()
	wg.Wait()

	// Every request sent after the kill was refused, fast, and its key never
	// reached the upstream.
	unavailable := func(a answer) bool {
		return a.err == nil && a.status == http.StatusServiceUnavailable && a.code == idem.CodeStoreUnavailable && a.retryAfter != ""
	}
	var after, before, inFlight int
	for _, s := range shots {
		switch {
		case s.sent.After(killed):
			after++
			if !unavailable(s.a) {
				t.Errorf("%s, sent after the kill: %v; want 503 store-unavailable problem+json with Retry-After", s.key, s.a)
			}
			if n := up.executions(s.key); n != 0 {
				t.Errorf("%s, sent after the kill, ran the upstream %d times: an unprotected execution", s.key, n)
			}
			if d := s.answer.Sub(s.sent); d > 5*time.Second {
				t.Errorf("%s, sent after the kill, took %v to be refused", s.key, d)
			}
		case s.answer.Before(killed):
			before++
			if !executed(s) || up.executions(s.key) != 1 {
				t.Errorf("%s, answered before the kill: %v, %d executions; want one 201", s.key, s.a, up.executions(s.key))
			}
		default:
			// In flight at the kill: reserved or refused, either is fine.
			inFlight++
		}
	}
	t.Logf("%d requests answered before the kill, %d in flight at it, %d sent after it, all refused", before, inFlight, after)
	// Only the requests in flight at the kill, reserved before it, may have
	// reached the upstream since.
	if grown := up.total() - totalAtKill; grown > inFlight {
		t.Errorf("the upstream ran %d times after the kill, with only %d requests in flight at it", grown, inFlight)
	}

	// A replay of a key stored before the kill is refused too: the proxy
	// cannot tell a replay from a new key without its store.
	total := up.total()
	if a := post(t.Context(), url, "traffic-00001", body); !unavailable(a) {
		t.Errorf("a replay during the outage: %v, want 503 store-unavailable", a)
	}
	if n := up.total(); n != total {
		t.Errorf("the upstream ran %d times during the outage", n-total)
	}

	// Redis comes back on the same port, empty; the proxy, not restarted,
	// reconnects by itself.
	r.Restart()
	deadline := time.Now().Add(30 * time.Second)
	var recovered answer
	for failures := 0; ; failures++ {
		recovered = post(t.Context(), url, "after-restart", body)
		if !unavailable(recovered) {
			t.Logf("%d answers store-unavailable after the restart", failures)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still unavailable 30s after the restart: %v", recovered)
		}
		time.Sleep(50 * time.Millisecond) // the proxy's connections recover on real time
	}
	if recovered.err != nil || recovered.status != http.StatusCreated || recovered.replayed != "" {
		t.Fatalf("a new key after the restart: %v, want 201 from an execution", recovered)
	}
	for i := range 5 {
		key := fmt.Sprintf("after-restart-%d", i)
		if a := post(t.Context(), url, key, body); a.err != nil || a.status != http.StatusCreated || a.replayed != "" {
			t.Errorf("%s: %v, want 201 from an execution", key, a)
		}
	}
	if a := post(t.Context(), url, "after-restart", body); a.status != http.StatusCreated || a.replayed != "true" || !bytes.Equal(a.body, recovered.body) {
		t.Errorf("a retry after the restart: %v, want the replay of %q", a, recovered.body)
	}
	if n := up.executions("after-restart"); n != 1 {
		t.Errorf("after-restart ran %d times, want once", n)
	}
	select {
	case <-p.done:
		t.Fatalf("the proxy exited: %s", p.output())
	default:
	}
}

// TestRedisOneExecutionAcrossThreeProxies runs three `idem proxy` processes
// on one Redis in front of one upstream: 500 concurrent requests with one
// key, spread over the three, execute the upstream once; every other answer
// is 409 key-in-use with Retry-After or the byte-identical replay with
// Idempotent-Replayed: true.
//
// It is not parallel: 500 concurrent requests through three processes use
// the whole machine.
func TestRedisOneExecutionAcrossThreeProxies(t *testing.T) {
	r := startRedisServer(t)
	up := newUpstream(t, 100*time.Millisecond, nil)
	var proxies []*proc
	for i := range 3 {
		proxies = append(proxies, startRedisProxy(t, fmt.Sprintf("proxy-%d", i), up.URL, r, "--lease", "10s"))
	}
	const body = `{"amount":1000,"currency":"EUR"}`

	const n = 500
	shots := make([]shot, n)
	for i := range shots {
		shots[i] = shot{proxies[i%3].URL + "/v1/payments", "one-key"}
	}
	start := time.Now()
	orig, inUse, replays := checkOneExecution(t, "one-key", burst(t, shots, body))
	t.Logf("one key, %d concurrent requests on 3 proxies on Redis in %v: 1 execution, %d key-in-use, %d replays",
		n, time.Since(start).Round(time.Millisecond), inUse, replays)
	if got := up.executions("one-key"); got != 1 {
		t.Fatalf("the upstream executed one-key %d times, want 1", got)
	}
	if up.total() != 1 {
		t.Fatalf("the upstream ran %d times, want once", up.total())
	}
	// Once it is done, every proxy replays it, byte for byte.
	for _, p := range proxies {
		a := post(t.Context(), p.URL+"/v1/payments", "one-key", body)
		if a.err != nil || a.status != http.StatusCreated || a.replayed != "true" || !bytes.Equal(a.body, orig.body) {
			t.Fatalf("%s after the burst: %v, want the replay of %q", p.name, a, orig.body)
		}
	}
	if got := up.executions("one-key"); got != 1 {
		t.Fatalf("the upstream executed one-key %d times after the replays, want 1", got)
	}
}
