//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemstore"
)

// The campaign's knobs. In `go test` each store runs a short campaign with
// a fixed seed; by hand, IDEM_CHAOS_DURATION=10m runs a long one and -seed
// (or IDEM_CHAOS_SEED) replays a run whose seed a log printed.
var seedFlag = flag.Uint64("seed", 0, "seed of the fault campaigns (0: each test's fixed seed, or IDEM_CHAOS_SEED)")

const (
	// campaignLease is the proxies' --lease; pauses last longer than it,
	// the grace and a reconcile interval.
	campaignLease = 2 * time.Second
	// reconcileInterval is the maintaining proxy's --reconcile-interval.
	reconcileInterval = 300 * time.Millisecond
	// reconcileGrace is --reconcile-grace, when the binary has the flag:
	// longer than the upstream's slowest execution.
	reconcileGrace = 2 * time.Second
	// pauseLatency is the latency on a proxy's link just before it is
	// stopped.
	pauseLatency = 200 * time.Millisecond
	// defaultDuration is the fault phase of a campaign in `go test`.
	defaultDuration = 20 * time.Second
	// settleTimeout bounds the wait for the reconciler once the faults
	// stopped: a lookup that found an execution still running is asked
	// again after idemmaint's backoff (15 to 30 s).
	settleTimeout = 75 * time.Second
)

// campaignSeed returns the seed to use: -seed, IDEM_CHAOS_SEED, or def.
func campaignSeed(t *testing.T, def uint64) uint64 {
	if *seedFlag != 0 {
		return *seedFlag
	}
	if s := os.Getenv("IDEM_CHAOS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("IDEM_CHAOS_SEED=%q: %v", s, err)
		}
		return n
	}
	return def
}

// campaignDuration returns IDEM_CHAOS_DURATION, or the short default.
func campaignDuration(t *testing.T) time.Duration {
	if s := os.Getenv("IDEM_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("IDEM_CHAOS_DURATION=%q: want a Go duration such as 10m", s)
		}
		return d
	}
	return defaultDuration
}

// storeEnv is the store side of a campaign's topology.
type storeEnv interface {
	// proxyStore is the --store URL of proxy i: through its relay, when
	// the store has links.
	proxyStore(i int) string
	// readStore is the URL the checker reads the final records through.
	readStore() string
	// kinds are the faults of the store and the links it supports.
	kinds() []FaultKind
	// inject starts a store or link fault and returns what ends it.
	inject(t *testing.T, f PlannedFault) (heal func())
	// durable reports whether the store is configured to keep every
	// acknowledged write through its faults.
	durable() bool
}

// linked is a storeEnv whose proxies reach the store through relays.
type linked interface {
	link(i int) *Relay
}

// campaign is one run: a topology, a seed, a duration.
type campaign struct {
	t     *testing.T
	name  string
	seed  uint64
	dur   time.Duration
	store storeEnv
	// proxyArgv returns the program and arguments of proxy i before the
	// campaign's own flags; nil means the idem binary.
	proxyArgv func(i int) []string
	proxyEnv  []string
	// extraKinds are faults beyond those of processes, upstream, clients
	// and the store's.
	extraKinds []FaultKind
	// failoverAt, when set, plans one failover at that time.
	failoverAt time.Duration
	// onlyFailover leaves out every other fault: a run that shows what a
	// failover alone loses.
	onlyFailover bool
	// kinds, when set, are the only faults drawn.
	kinds []FaultKind

	dir     string
	h       *History
	proxies []*proc
}

// result is what a campaign found.
type result struct {
	h         *History
	anomalies []Anomaly
	faults    map[FaultKind]int
	ops       int64
	maxExecs  int
	settled   bool
}

// artifactDir returns where a campaign keeps its logs: under
// IDEM_TEST_ARTIFACTS when set, else a temporary directory removed when
// the test passes.
func artifactDir(t *testing.T) string {
	if base := os.Getenv("IDEM_TEST_ARTIFACTS"); base != "" {
		dir := filepath.Join(base, "chaos", fileSafe(t.Name()))
		os.RemoveAll(dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir, err := os.MkdirTemp("", "idem-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the campaign's logs, history and visualizations are kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

func (c *campaign) logf(format string, args ...any) {
	c.t.Helper()
	c.t.Logf("%s %s: %s", time.Now().Format("15:04:05.000"), c.name, fmt.Sprintf(format, args...))
}

// run runs the campaign and checks its history.
func (c *campaign) run() result {
	t := c.t
	c.dir = artifactDir(t)
	c.h = NewHistory()
	bin := idembin.Path(t)
	c.logf("seed %d, %v of faults, store durable: %v; reproduce with -seed %d (logs in %s)", c.seed, c.dur, c.store.durable(), c.seed, c.dir)

	up := NewUpstream(c.h, c.seed)
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)

	grace := []string(nil)
	if proxyHasFlag(t, "reconcile-grace") {
		grace = []string{"--reconcile-grace", reconcileGrace.String()}
	}
	env := append(idembin.Environ(), c.proxyEnv...)
	for i := range 3 {
		argv := []string{bin, "proxy"}
		if c.proxyArgv != nil {
			argv = c.proxyArgv(i)
		}
		argv = append(argv, "--upstream", srv.URL, "--store", c.store.proxyStore(i), "--lease", campaignLease.String())
		if i == 0 {
			argv = append(argv, "--maintain", "--reconcile-url", srv.URL+LookupPath+"{key}",
				"--reconcile-interval", reconcileInterval.String())
			argv = append(argv, grace...)
		}
		p := newProc(t, fmt.Sprintf("proxy-%d", i), filepath.Join(c.dir, fmt.Sprintf("proxy-%d.log", i)), env, argv...)
		// One at a time: the first one migrates the store.
		if err := p.start(60 * time.Second); err != nil {
			t.Fatalf("%v\n%s", err, p.output())
		}
		c.proxies = append(c.proxies, p)
	}
	urls := make([]string, len(c.proxies))
	for i, p := range c.proxies {
		urls[i] = p.URL()
	}

	kinds := []FaultKind{FaultKillProxy, FaultPauseProxy, FaultSlowUpstream, FaultClientLoss}
	kinds = append(append(kinds, c.store.kinds()...), c.extraKinds...)
	if c.kinds != nil {
		kinds = c.kinds
	}
	var schedule []PlannedFault
	if !c.onlyFailover {
		schedule = Schedule(ScheduleConfig{Seed: c.seed, Duration: c.dur, Kinds: kinds, Proxies: len(c.proxies),
			Pause: campaignLease + reconcileGrace + reconcileInterval})
	}
	if c.failoverAt > 0 {
		schedule = append(schedule, PlannedFault{At: c.failoverAt, Kind: FaultFailover, For: time.Second})
		sort.SliceStable(schedule, func(i, j int) bool { return schedule[i].At < schedule[j].At })
	}
	var plan []string
	for _, f := range schedule {
		plan = append(plan, f.String())
	}
	os.WriteFile(filepath.Join(c.dir, "schedule.txt"), []byte(strings.Join(plan, "\n")+"\n"), 0o644)
	c.logf("%d faults planned: %s", len(schedule), strings.Join(plan, ", "))

	// Every goroutine run starts is stopped, and waited for, before run
	// returns on any path: a fault that fails the test with t.Fatal must
	// not leave the clients sending to proxies the test's cleanup is
	// killing, nor the logger logging after the test has ended (which
	// panics).
	//
	// The clients: once the faults are over, stopWork lets each finish
	// its operation; on a path that ends run early, the deferred call
	// cancels their context first, so that they give up at once.
	w := &Workload{History: c.h, Proxies: urls, Seed: c.seed, Prefix: fmt.Sprintf("k%d", c.seed)}
	ctx, cancel := context.WithCancel(t.Context())
	workStop, workDone := make(chan struct{}), make(chan struct{})
	stopWork := sync.OnceFunc(func() { close(workStop); <-workDone })
	defer func() { cancel(); stopWork() }()
	go func() {
		defer close(workDone)
		w.Run(ctx, workStop)
	}()

	// Progress while the faults run.
	progressStop, progressDone := make(chan struct{}), make(chan struct{})
	stopProgress := sync.OnceFunc(func() { close(progressStop); <-progressDone })
	defer stopProgress()
	go func() {
		defer close(progressDone)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-progressStop:
				return
			case <-tick.C:
				ops, done, _ := w.Stats()
				attempts, execs, faults := c.h.Counts()
				c.logf("%d operations (%d answered), %d attempts, %d executions, %d faults injected, %d keys executed twice so far",
					ops, done, attempts, execs, faults, c.h.DoubleExecutions())
			}
		}
	}()

	c.inject(schedule, up, w)
	c.logf("faults over; the clients finish their operations")
	stopWork()
	stopProgress()
	for _, p := range c.proxies {
		if !p.running() {
			t.Errorf("%s is not running after the faults:\n%s", p.name, tail(p.output(), 30))
		}
	}

	settled := c.settle()
	c.readFinals()
	anomalies := Check(c.h, CheckConfig{Settled: true, VisualizeDir: c.dir})

	res := result{h: c.h, anomalies: anomalies, faults: make(map[FaultKind]int), settled: settled}
	res.ops, _, _ = w.Stats()
	for _, f := range c.h.Faults {
		res.faults[FaultKind(f.Kind)]++
	}
	res.maxExecs = c.h.MaxExecutionsPerKey()
	attempts, execs, faults := c.h.Counts()
	c.logf("done: %d operations, %d attempts, %d executions (at most %d for a key), %d faults %v, %d anomalies",
		res.ops, attempts, execs, res.maxExecs, faults, res.faults, len(anomalies))
	c.writeArtifacts(anomalies)
	for _, p := range c.proxies {
		if out := p.output(); strings.Contains(out, "WARNING: DATA RACE") {
			t.Errorf("%s reported a data race (see %s)", p.name, p.log)
		}
	}
	return res
}

// inject runs the schedule, then heals every fault still on and makes sure
// every proxy runs again.
func (c *campaign) inject(schedule []PlannedFault, up *Upstream, w *Workload) {
	t := c.t
	begin := time.Now()
	var heals sync.WaitGroup
	// A fault that fails the test with t.Fatal ends inject early: the
	// heals still under way finish before the test does, since they log.
	defer heals.Wait()
	for _, f := range schedule {
		if d := time.Until(begin.Add(f.At)); d > 0 {
			time.Sleep(d) // the schedule runs on real time
		}
		target := "all"
		if f.Kind.hitsProxy() {
			target = fmt.Sprintf("proxy-%d", f.Proxy)
		}
		rec := c.h.Injected(string(f.Kind), target)
		heal := c.start(f, up, w)
		heals.Go(func() {
			if f.For > 0 {
				time.Sleep(f.For) // how long the fault lasts
			}
			heal()
			c.h.Healed(rec)
		})
	}
	if d := time.Until(begin.Add(c.dur)); d > 0 {
		time.Sleep(d)
	}
	heals.Wait()
	for _, p := range c.proxies {
		if !p.running() {
			if err := p.start(60 * time.Second); err != nil {
				t.Errorf("restarting %s after the faults: %v", p.name, err)
			}
		}
	}
}

// start starts one fault and returns what ends it.
func (c *campaign) start(f PlannedFault, up *Upstream, w *Workload) (heal func()) {
	t := c.t
	switch f.Kind {
	case FaultKillProxy:
		p := c.proxies[f.Proxy]
		p.kill()
		return func() {
			if err := p.start(60 * time.Second); err != nil {
				t.Errorf("restarting %s: %v", p.name, err)
			}
		}
	case FaultPauseProxy:
		p := c.proxies[f.Proxy]
		if l, ok := c.store.(linked); ok {
			// The review's scenario: stopped right after a reservation.
			// A slow link keeps most of the proxy's requests waiting for
			// the store's answer to their reservation when it stops; it
			// reads the answer when it resumes, long after its lease.
			r := l.link(f.Proxy)
			prev := r.SetLatency(pauseLatency)
			time.Sleep(2 * pauseLatency) // the requests pile up behind the latency
			defer r.SetLatency(prev)
		}
		if err := p.signal(syscall.SIGSTOP); errors.Is(err, os.ErrProcessDone) {
			// Down, between a kill and its restart (a restart waits for
			// the store when a crash overlaps it): nothing to pause.
			c.logf("%s is down (a restart under way): nothing to pause", p.name)
		} else if err != nil {
			t.Errorf("stopping %s: %v", p.name, err)
		}
		return func() { p.signal(syscall.SIGCONT) }
	case FaultSlowUpstream:
		up.Slow(f.Amount)
		return func() { up.Slow(0) }
	case FaultClientLoss:
		w.Lose(true)
		return func() { w.Lose(false) }
	default:
		return c.store.inject(t, f)
	}
}

// settle waits until the store holds no record of the campaign's keys that
// is unknown or in progress: the reconciler has done its work. It reports
// whether that happened before settleTimeout.
func (c *campaign) settle() bool {
	t := c.t
	store, closeStore := c.openStore()
	defer closeStore()
	deadline := time.Now().Add(settleTimeout)
	start := time.Now()
	for {
		open := 0
		for _, st := range []idemstore.State{idemstore.StateUnknown, idemstore.StateInProgress} {
			recs, err := store.KeyList(t.Context(), &idemstore.ListParams{State: st, Limit: 1000})
			if err != nil {
				open = -1
				break
			}
			open += len(recs)
		}
		if open == 0 {
			c.logf("every record settled %v after the clients ended", time.Since(start).Round(time.Millisecond))
			return true
		}
		if time.Now().After(deadline) {
			c.logf("%d records still unknown or in progress after %v", open, settleTimeout)
			return false
		}
		time.Sleep(250 * time.Millisecond) // the reconciler runs on real time
	}
}

// openStore opens the store the way the proxies do.
func (c *campaign) openStore() (idemstore.Store, func()) {
	t := c.t
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	store, closeStore, err := storeurl.Open(ctx, c.store.readStore())
	if err != nil {
		t.Fatalf("opening the store to read it: %v", err)
	}
	return store, func() { closeStore() }
}

// readFinals reads every key's record into the history.
func (c *campaign) readFinals() {
	t := c.t
	store, closeStore := c.openStore()
	defer closeStore()
	for _, k := range c.h.Keys() {
		rec, err := store.KeyGet(t.Context(), idemstore.Identity{Endpoint: Endpoint, Key: k})
		switch {
		case errors.Is(err, idemstore.ErrNotFound):
			c.h.SetFinal(k, Final{})
		case err != nil:
			t.Fatalf("reading the record of %s: %v", k, err)
		default:
			f := Final{State: string(rec.State), Fingerprint: rec.Fingerprint}
			if rec.Response != nil {
				var ans answerBody
				if json.Unmarshal(rec.Response.Body, &ans) == nil {
					f.Exec = ans.Execution
				}
			}
			c.h.SetFinal(k, f)
		}
	}
}

// writeArtifacts writes the history and the anomalies next to the logs.
func (c *campaign) writeArtifacts(anomalies []Anomaly) {
	if f, err := os.Create(filepath.Join(c.dir, "history.json")); err == nil {
		c.h.WriteJSON(f)
		f.Close()
	}
	var b strings.Builder
	for _, a := range anomalies {
		fmt.Fprintf(&b, "%s\n%s\n", a, a.History)
	}
	os.WriteFile(filepath.Join(c.dir, "anomalies.txt"), []byte(b.String()), 0o644)
}

// requireNoAnomalies fails the test with every anomaly found.
func requireNoAnomalies(t *testing.T, res result) {
	t.Helper()
	if !res.settled {
		t.Errorf("the reconciler did not settle every record within %v", settleTimeout)
	}
	if len(res.anomalies) == 0 {
		return
	}
	for i, a := range res.anomalies {
		if i == 20 {
			t.Errorf("… and %d more", len(res.anomalies)-i)
			break
		}
		t.Errorf("%s\n%s", a, a.History)
	}
}

// anomalyKinds counts the anomalies by kind.
func anomalyKinds(as []Anomaly) map[string]int {
	out := make(map[string]int)
	for _, a := range as {
		out[a.Kind]++
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// requireKinds fails unless every kind of want was found.
func requireKinds(t *testing.T, res result, want ...string) {
	t.Helper()
	got := anomalyKinds(res.anomalies)
	for _, k := range want {
		if got[k] == 0 {
			var all []string
			for k := range got {
				all = append(all, k)
			}
			slices.Sort(all)
			t.Errorf("the checker found no %s; it found %v", k, all)
		}
	}
}

// requireLosses fails unless the checker found what an asynchronous
// replica loses: an acknowledged answer no record replays, or a key run
// again after its record was lost.
func requireLosses(t *testing.T, res result) {
	t.Helper()
	got := anomalyKinds(res.anomalies)
	t.Logf("the checker found %v", got)
	if got[KindLostAck]+got[KindLostRecord]+got[KindDoubleExecution] == 0 {
		t.Errorf("the checker found no loss after a failover to an asynchronous replica: %v", got)
	}
}
