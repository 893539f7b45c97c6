package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/idemmaint"
	"github.com/idem-dev/idem/idemstore"
)

// lookupCall is one lookup the watched upstream served: which reconciler
// asked (its X-Proxy header) and when the lookup started and ended.
type lookupCall struct {
	proxy      string
	start, end time.Time
}

func (c lookupCall) String() string {
	return fmt.Sprintf("%s@%s+%v", c.proxy, c.start.Format("15:04:05.000"), c.end.Sub(c.start).Round(time.Millisecond))
}

// watchedLookup is a lookup by key, GET /lookup/{key}, that takes its time
// (so that the other reconciler's passes run while it is in flight), answers
// one status for every key, records every call and counts the lookups of a
// key that ran at the same time as another lookup of that key.
type watchedLookup struct {
	delay  time.Duration
	status atomic.Int32

	mu       sync.Mutex
	calls    map[string][]lookupCall // key -> its lookups, finished ones only
	inFlight map[string]int
	overlaps []string // one line per lookup that started while another of its key was in flight
}

func (l *watchedLookup) serve(w http.ResponseWriter, r *http.Request) {
	key, c := r.PathValue("key"), lookupCall{proxy: r.Header.Get("X-Proxy"), start: time.Now()}
	l.mu.Lock()
	l.inFlight[key]++
	if n := l.inFlight[key]; n > 1 {
		l.overlaps = append(l.overlaps, fmt.Sprintf("%s asked about %q while %d other lookups of it ran", c.proxy, key, n-1))
	}
	l.mu.Unlock()
	select {
	case <-time.After(l.delay):
	case <-r.Context().Done():
	}
	status := int(l.status.Load())
	if status/100 == 2 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, lookupBody)
	} else {
		w.WriteHeader(status)
	}
	c.end = time.Now()
	l.mu.Lock()
	l.inFlight[key]--
	l.calls[key] = append(l.calls[key], c)
	l.mu.Unlock()
}

// snapshot returns the finished lookups of every key and the overlaps.
func (l *watchedLookup) snapshot() (map[string][]lookupCall, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	calls := make(map[string][]lookupCall, len(l.calls))
	for k, cs := range l.calls {
		calls[k] = append([]lookupCall(nil), cs...)
	}
	return calls, append([]string(nil), l.overlaps...)
}

// TestTwoProxiesAskOncePerPass runs two `idem proxy --maintain
// --reconcile-url` processes on one PostgreSQL schema with eight unknown
// keys, in front of a lookup that is slower than their reconcile interval.
// While the lookup answers 500, every round of attempts asks about each key
// exactly once, never two lookups of one key at a time, and between rounds
// the backoff the store recorded keeps both proxies from asking again. Then
// the lookup answers 201: each key settles once, in one of the two
// processes, and its retries replay the lookup's answer without a second
// execution.
//
// The backoff after a failed lookup is 15 seconds or more (idemmaint's
// default, which the command line does not change); instead of waiting it
// out, the test starts each next round by making the keys due again in the
// store, one after another, so that the two reconcilers' passes interleave
// and each claims some of them.
func TestTwoProxiesAskOncePerPass(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const (
		nKeys    = 8
		body     = `{"amount":1000}`
		endpoint = "POST /v1/payments"
		interval = 200 * time.Millisecond // --reconcile-interval
		// The lookup outlasts an interval: the other proxy's passes run
		// while a key is being asked about, and only the claim's hold keeps
		// them off it.
		lookupDelay = 300 * time.Millisecond
		// Each round makes the keys due this far apart.
		stagger = 80 * time.Millisecond
		// A quiet spell after each round: many passes of both proxies.
		quiet     = 10 * interval
		minRounds = 3
		maxRounds = 8
		// Generous bounds for a loaded machine.
		roundTimeout = 45 * time.Second
	)
	// The backoff after n failed attempts is between half and all of
	// Base·2^(n-1) (idemmaint's defaults: the command line does not change
	// them; Max, an hour, is not reached here).
	maxBackoff := func(n int) time.Duration { return idemmaint.DefaultBackoffBase << (n - 1) }
	minBackoff := func(n int) time.Duration { return maxBackoff(n) / 2 }

	block := make(chan struct{})
	up := &upstream{block: block, entered: make(chan string, 1024), runs: make(map[string]int)}
	look := &watchedLookup{delay: lookupDelay, calls: make(map[string][]lookupCall), inFlight: make(map[string]int)}
	look.status.Store(http.StatusInternalServerError)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /lookup/{key}", look.serve)
	mux.HandleFunc("/", up.serve)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	up.Server = srv

	// The two reconcilers, on the same schema, told apart by a header.
	idembin.Path(t) // built once per run: not part of the test's timing
	begin := time.Now()
	reconcilers := make(map[string]*proc)
	for _, name := range []string{"proxy-m1", "proxy-m2"} {
		reconcilers[name] = e.startProxy(name, srv.URL, 3, "--lease", "1s", "--maintain",
			"--reconcile-url", srv.URL+"/lookup/{key}",
			"--reconcile-header", "X-Proxy: "+name,
			"--reconcile-interval", interval.String(),
			"--reconcile-grace", "1s") // keeps the test short: the killed proxy's requests wait on the upstream
	}

	// Eight keys turn unknown: a third proxy dies while the upstream works
	// on them, and once the lease has run out the reconcilers' sweep turns
	// them unknown and the first round of lookups starts by itself.
	keys := make([]string, nKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("two-proxies-%02d", i)
	}
	a := e.startProxy("proxy-a", srv.URL, 3, "--lease", "1s")
	answers := make(chan answer, nKeys)
	for _, k := range keys {
		go func() { answers <- post(t.Context(), a.URL+"/v1/payments", k, body) }()
	}
	for range keys {
		select {
		case <-up.entered:
		case <-time.After(30 * time.Second):
			t.Fatal("the requests never reached the upstream")
		}
	}
	killNow(t, a)
	for range keys {
		if got := <-answers; got.err == nil {
			t.Fatalf("the killed proxy answered: %v", got)
		}
	}
	close(block)

	identity := func(k string) idemstore.Identity { return idemstore.Identity{Endpoint: endpoint, Key: k} }
	// makeDue ends the backoff of every unknown key, one key after the
	// other, stagger apart, from now on.
	makeDue := func() {
		tag, err := e.pool.Exec(t.Context(), `WITH o AS (
			SELECT scope, endpoint, key, row_number() OVER (ORDER BY key) - 1 AS n
			FROM `+e.table("idem_keys")+` WHERE state = 'unknown')
		UPDATE `+e.table("idem_keys")+` AS k SET reconcile_after = now() + o.n * $1::interval
		FROM o WHERE k.scope = o.scope AND k.endpoint = o.endpoint AND k.key = o.key`,
			fmt.Sprintf("%d milliseconds", stagger.Milliseconds()))
		if err != nil {
			t.Fatalf("making the keys due: %v", err)
		}
		if n := tag.RowsAffected(); n != nKeys {
			t.Fatalf("made %d keys due, want %d", n, nKeys)
		}
	}
	// checkCalls checks that every key was asked about exactly want times,
	// never twice at once, each time by one of the reconcilers.
	checkCalls := func(when string, want int) map[string][]lookupCall {
		t.Helper()
		calls, overlaps := look.snapshot()
		for _, o := range overlaps {
			t.Errorf("%s: %s", when, o)
		}
		for _, k := range keys {
			if n := len(calls[k]); n != want {
				t.Errorf("%s: %q was looked up %d times, want %d: %v", when, k, n, want, calls[k])
			}
			for _, c := range calls[k] {
				if reconcilers[c.proxy] == nil {
					t.Errorf("%s: a lookup of %q came from %q, not a reconciler", when, k, c.proxy)
				}
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		return calls
	}
	// awaitRound waits until every key has been looked up round times and
	// the store holds each record's failed attempt. (Before the first round
	// a record may still be in_progress: its lease runs out after a second.)
	awaitRound := func(round int) {
		t.Helper()
		deadline := time.Now().Add(roundTimeout)
		for _, k := range keys {
			for {
				calls, _ := look.snapshot()
				rec, err := e.store.KeyGet(t.Context(), identity(k))
				if err != nil {
					t.Fatalf("reading %q: %v", k, err)
				}
				if rec.State != idemstore.StateUnknown && (round > 1 || rec.State != idemstore.StateInProgress) {
					t.Fatalf("round %d: %q is %s, want unknown while the lookup answers 500", round, k, rec.State)
				}
				if len(calls[k]) >= round && rec.ReconcileAttempts >= round {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("round %d: after %v %q has %d lookups and %d attempts stored, want %d",
						round, roundTimeout, k, len(calls[k]), rec.ReconcileAttempts, round)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}

	by := make(map[string]int) // lookups per reconciler, over the rounds
	rounds := 0
	for rounds < minRounds || len(by) < len(reconcilers) {
		if rounds == maxRounds {
			t.Fatalf("after %d rounds only %v asked: the second reconciler never took a key", rounds, by)
		}
		rounds++
		if rounds > 1 {
			makeDue()
		}
		awaitRound(rounds)
		settled := time.Now()
		calls := checkCalls(fmt.Sprintf("round %d", rounds), rounds)
		// The store holds each key for the backoff of its rounds-th failed
		// attempt (the test moved the due time back, not the counter),
		// counted from the failed lookup: at least 15 seconds.
		for _, k := range keys {
			rec, err := e.store.KeyGet(t.Context(), identity(k))
			if err != nil {
				t.Fatal(err)
			}
			last := calls[k][rounds-1]
			by[last.proxy]++
			if rec.ReconcileAttempts != rounds || rec.ReconcileError != "the lookup answered 500 Internal Server Error" {
				t.Fatalf("round %d: %q has %d attempts, last error %q", rounds, k, rec.ReconcileAttempts, rec.ReconcileError)
			}
			lo, hi := last.start.Add(minBackoff(rounds)), settled.Add(maxBackoff(rounds))
			if rec.ReconcileAfter.Before(lo) || rec.ReconcileAfter.After(hi) {
				t.Fatalf("round %d: %q is due again at %v, want between %v and %v (the backoff after lookup at %v)",
					rounds, k, rec.ReconcileAfter, lo, hi, last.start)
			}
		}
		// Both proxies keep passing every interval; while the backoff
		// lasts, neither asks again.
		time.Sleep(quiet)
		checkCalls(fmt.Sprintf("%v after round %d", quiet, rounds), rounds)
	}
	t.Logf("%d rounds of lookups answered 500, %d keys each, in %v since the proxies started: lookups by reconciler %v",
		rounds, nKeys, time.Since(begin).Round(time.Millisecond), by)

	// The lookup knows the answer now: every key settles once.
	look.status.Store(http.StatusCreated)
	makeDue()
	deadline := time.Now().Add(roundTimeout)
	for _, k := range keys {
		for {
			rec, err := e.store.KeyGet(t.Context(), identity(k))
			if err != nil {
				t.Fatalf("reading %q: %v", k, err)
			}
			if rec.State == idemstore.StateCompleted {
				break
			}
			if rec.State != idemstore.StateUnknown || time.Now().After(deadline) {
				t.Fatalf("%q is %s with %d attempts, want completed within %v", k, rec.State, rec.ReconcileAttempts, roundTimeout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(quiet)
	checkCalls("after the keys settled", rounds+1)

	// Each key was reconciled by one process, once; no resolution lost a
	// race to the other's.
	hashes := make(map[string]string, nKeys)
	for _, k := range keys {
		hashes[identity(k).LogHash()] = k
	}
	reconciledRE := regexp.MustCompile(`msg="idemmaint: unknown outcome reconciled" key_hash=(\S+)`)
	settledBy := make(map[string][]string)
	deadline = time.Now().Add(roundTimeout)
	for {
		clear(settledBy)
		for name, p := range reconcilers {
			out := p.output()
			if strings.Contains(out, "settled elsewhere") {
				t.Errorf("%s lost a resolution to the other reconciler:\n%s", name, out)
			}
			for _, m := range reconciledRE.FindAllStringSubmatch(out, -1) {
				if k, ok := hashes[m[1]]; ok {
					settledBy[k] = append(settledBy[k], name)
				}
			}
		}
		if len(settledBy) == nKeys || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the log line follows the store's write
	}
	for _, k := range keys {
		if len(settledBy[k]) != 1 {
			t.Errorf("%q was reported reconciled by %v, want one reconciler once", k, settledBy[k])
		}
	}

	t.Logf("every key settled once, %v since the proxies started", time.Since(begin).Round(time.Millisecond))

	// Retries through either proxy replay the lookup's answer; nothing ran
	// twice.
	for _, k := range keys {
		for name, p := range reconcilers {
			got := post(t.Context(), p.URL+"/v1/payments", k, body)
			if got.status != http.StatusCreated || got.replayed != "true" || string(got.body) != lookupBody {
				t.Errorf("retry of %q through %s: %v, want 201 replaying the lookup's answer", k, name, got)
			}
		}
		if n := up.executions(k); n != 1 {
			t.Errorf("%q ran %d times upstream, want 1", k, n)
		}
	}
}
