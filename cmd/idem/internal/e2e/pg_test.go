package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// shot is one request of a burst: where it goes and with which key.
type shot struct {
	url, key string
}

// burst sends every shot at once (all goroutines released together) and
// returns the answers in the order of shots.
func burst(t *testing.T, shots []shot, body string) []answer {
	t.Helper()
	answers := make([]answer, len(shots))
	ready := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range shots {
		wg.Go(func() {
			<-ready
			answers[i] = post(t.Context(), s.url, s.key, body)
		})
	}
	close(ready)
	wg.Wait()
	return answers
}

// checkOneExecution checks the answers to requests with one key: exactly
// one executed (201, not replayed), and every other one is 409 key-in-use
// with Retry-After or a byte-identical replay. It returns the executed
// answer and the counts of in-use answers and replays.
func checkOneExecution(t *testing.T, key string, answers []answer) (orig answer, inUse, replays int) {
	t.Helper()
	var executed []answer
	for _, a := range answers {
		if a.err == nil && a.status == http.StatusCreated && a.replayed == "" {
			executed = append(executed, a)
		}
	}
	if len(executed) != 1 {
		t.Fatalf("key %s: %d answers came from an execution, want 1: %v", key, len(executed), executed)
	}
	orig = executed[0]
	for _, a := range answers {
		switch {
		case a.err != nil:
			t.Fatalf("key %s: %v", key, a)
		case a.status == http.StatusCreated && a.replayed == "":
			// the execution
		case a.status == http.StatusCreated && a.replayed == "true":
			if !bytes.Equal(a.body, orig.body) {
				t.Fatalf("key %s: replay %q differs from the original %q", key, a.body, orig.body)
			}
			replays++
		case a.status == http.StatusConflict && a.code == idem.CodeKeyInUse && a.retryAfter != "":
			inUse++
		default:
			t.Fatalf("key %s: unexpected answer %v", key, a)
		}
	}
	return orig, inUse, replays
}

// TestOneExecutionAcrossThreeProxies runs three `idem proxy` processes on
// one PostgreSQL schema in front of one upstream. 500 concurrent requests
// with one key, spread over the three, execute the upstream once; every
// other answer is 409 key-in-use or the byte-identical replay. Then 50 keys
// with 10 concurrent requests each execute once per key.
//
// It is not parallel: 500 concurrent requests through three processes use
// the whole machine.
func TestOneExecutionAcrossThreeProxies(t *testing.T) {
	e := newEnv(t)
	up := newUpstream(t, 100*time.Millisecond, nil)
	var proxies []*proc
	for i := range 3 {
		proxies = append(proxies, e.startProxy(fmt.Sprintf("proxy-%d", i), up.URL, 6, "--lease", "10s"))
	}
	const body = `{"amount":1000,"currency":"EUR"}`

	const n = 500
	shots := make([]shot, n)
	for i := range shots {
		shots[i] = shot{proxies[i%3].URL + "/v1/payments", "one-key"}
	}
	start := time.Now()
	orig, inUse, replays := checkOneExecution(t, "one-key", burst(t, shots, body))
	t.Logf("one key, %d concurrent requests on 3 proxies in %v: 1 execution, %d key-in-use, %d replays",
		n, time.Since(start).Round(time.Millisecond), inUse, replays)
	if got := up.executions("one-key"); got != 1 {
		t.Fatalf("the upstream executed one-key %d times, want 1", got)
	}
	// Once it is done, every proxy replays it.
	for _, p := range proxies {
		a := post(t.Context(), p.URL+"/v1/payments", "one-key", body)
		if a.err != nil || a.status != http.StatusCreated || a.replayed != "true" || !bytes.Equal(a.body, orig.body) {
			t.Fatalf("%s after the burst: %v, want the replay of %q", p.name, a, orig.body)
		}
	}

	const keys, perKey = 50, 10
	shots = shots[:0]
	for i := range keys * perKey {
		// Request i carries key i%50; the 10 requests of a key go round
		// the three proxies.
		shots = append(shots, shot{proxies[(i/keys)%3].URL + "/v1/payments", fmt.Sprintf("key-%02d", i%keys)})
	}
	start = time.Now()
	answers := burst(t, shots, body)
	elapsed := time.Since(start)
	byKey := make(map[string][]answer)
	for i, s := range shots {
		byKey[s.key] = append(byKey[s.key], answers[i])
	}
	inUse, replays = 0, 0
	for key, as := range byKey {
		_, u, r := checkOneExecution(t, key, as)
		inUse, replays = inUse+u, replays+r
		if got := up.executions(key); got != 1 {
			t.Fatalf("the upstream executed %s %d times, want 1", key, got)
		}
	}
	t.Logf("%d keys × %d concurrent requests on 3 proxies in %v: %d executions, %d key-in-use, %d replays",
		keys, perKey, elapsed.Round(time.Millisecond), keys, inUse, replays)
	if got := up.total(); got != 1+keys {
		t.Fatalf("the upstream executed %d times in all, want %d", got, 1+keys)
	}
	recs, err := e.store.KeyList(t.Context(), &idemstore.ListParams{State: idemstore.StateCompleted, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1+keys {
		t.Fatalf("%d completed records, want %d", len(recs), 1+keys)
	}
}
