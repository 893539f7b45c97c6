package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// lookupUpstream is an API with a lookup by key, GET /lookup/{key}, next to
// the upstream of the other tests (every other request). The lookup answers
// what the test set for the key, and records every lookup.
type lookupUpstream struct {
	*upstream
	srv *httptest.Server

	mu      sync.Mutex
	answers map[string]int // key -> status of the lookup
	lookups map[string][]*http.Request
}

// lookupBody is what the lookup answers for an applied operation: the
// retries must replay it.
const lookupBody = `{"payment":"pay_from_lookup","status":"succeeded"}`

func newLookupUpstream(t *testing.T, block chan struct{}) *lookupUpstream {
	t.Helper()
	u := &lookupUpstream{
		upstream: &upstream{block: block, entered: make(chan string, 1024), runs: make(map[string]int)},
		answers:  make(map[string]int),
		lookups:  make(map[string][]*http.Request),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /lookup/{key}", u.lookup)
	mux.HandleFunc("/", u.serve)
	u.srv = httptest.NewServer(mux)
	u.upstream.Server = u.srv
	t.Cleanup(u.srv.Close)
	return u
}

func (u *lookupUpstream) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	u.mu.Lock()
	u.lookups[key] = append(u.lookups[key], r)
	status, ok := u.answers[key]
	u.mu.Unlock()
	if !ok {
		status = http.StatusNotFound
	}
	if status/100 == 2 {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/payments/pay_from_lookup")
		w.Header().Set("X-Trace", "not-stored")
		w.WriteHeader(status)
		io.WriteString(w, lookupBody)
		return
	}
	w.WriteHeader(status)
}

// asked returns the lookups of key so far.
func (u *lookupUpstream) asked(key string) []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.lookups[key]...)
}

// TestProxyReconcilesUnknownKeys makes three keys unknown by killing a proxy
// while the upstream works on them, then starts `idem proxy --maintain
// --reconcile-url` against the upstream's lookup by key. The key the lookup
// knows (201) settles to the lookup's answer, which every retry replays; the
// key it does not know (404) is released and its retry runs once; the key
// it cannot answer for (500) stays unknown, and its retry still gets 409
// outcome-unknown without a second execution.
func TestProxyReconcilesUnknownKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	block := make(chan struct{})
	up := newLookupUpstream(t, block)
	const (
		applied  = "applied/1?a&b#c" // every character that means something in a URL
		missing  = "missing/2"
		broken   = "broken/3"
		body     = `{"amount":1000}`
		secret   = "lookup-s3cret"
		endpoint = "POST /v1/payments"
	)
	up.mu.Lock()
	up.answers[applied] = http.StatusCreated
	up.answers[missing] = http.StatusNotFound
	up.answers[broken] = http.StatusInternalServerError
	up.mu.Unlock()
	keys := []string{applied, missing, broken}

	// Kill a proxy while the upstream works on the three keys.
	a := e.startProxy("proxy-a", up.srv.URL, 3, "--lease", "1s")
	answers := make(chan answer, len(keys))
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
	close(block) // later executions run at once

	// Once the lease has run out, every key is unknown.
	b := e.startProxy("proxy-b", up.srv.URL, 3, "--lease", "1s")
	for _, k := range keys {
		got := retryWhileInUse(t, b.URL+"/v1/payments", k, body, 30*time.Second)
		if got.status != http.StatusConflict || got.code != idem.CodeOutcomeUnknown {
			t.Fatalf("retry of %q after the kill: %v, want 409 outcome-unknown", k, got)
		}
	}
	b.kill()

	// A proxy that reconciles through the lookup.
	c := e.startProxy("proxy-c", up.srv.URL, 3, "--lease", "1s", "--maintain",
		"--reconcile-url", up.srv.URL+"/lookup/{key}?method={method}&path={path}&scope={scope}",
		"--reconcile-header", "Authorization: Bearer "+secret, "--reconcile-interval", "200ms",
		"--reconcile-grace", "1s") // the upstream answered long ago: a short grace keeps the test short
	hash := func(k string) string {
		return idemstore.Identity{Endpoint: endpoint, Key: k}.LogHash()
	}
	for _, k := range []string{applied, missing} {
		re := regexp.MustCompile(`msg="idemmaint: unknown outcome reconciled" key_hash=` + hash(k))
		if c.waitLine(re, 60*time.Second) == nil {
			t.Fatalf("%q was not reconciled:\n%s", k, c.output())
		}
	}
	re := regexp.MustCompile(`msg="idemmaint: reconciler failed; unknown outcome unresolved" key_hash=` + hash(broken) +
		`.* error="the lookup answered 500 Internal Server Error"`)
	if c.waitLine(re, 60*time.Second) == nil {
		t.Fatalf("the lookup's 500 for %q was not reported:\n%s", broken, c.output())
	}

	// The applied key replays the lookup's answer, with the stored headers
	// only, and never runs again.
	for range 2 {
		resp, got := postFull(t, c.URL+"/v1/payments", applied, body)
		if got.status != http.StatusCreated || got.replayed != "true" || string(got.body) != lookupBody {
			t.Fatalf("retry of the applied key: %v, want 201 replaying the lookup's answer", got)
		}
		if resp.Header.Get("Location") != "/v1/payments/pay_from_lookup" || resp.Header.Get("Content-Type") != "application/json" ||
			resp.Header.Get("X-Trace") != "" {
			t.Errorf("replayed headers %v: want Location and Content-Type, not X-Trace", resp.Header)
		}
	}
	if n := up.executions(applied); n != 1 {
		t.Errorf("the applied key ran %d times, want 1", n)
	}

	// The missing key runs once more, then replays that execution.
	first := post(t.Context(), c.URL+"/v1/payments", missing, body)
	if first.status != http.StatusCreated || first.replayed != "" {
		t.Fatalf("retry of the released key: %v, want a fresh 201", first)
	}
	again := post(t.Context(), c.URL+"/v1/payments", missing, body)
	if again.status != http.StatusCreated || again.replayed != "true" || string(again.body) != string(first.body) {
		t.Fatalf("second retry of the released key: %v, want the replay of %v", again, first)
	}
	if n := up.executions(missing); n != 2 {
		t.Errorf("the released key ran %d times, want 2 (the killed attempt and one retry)", n)
	}

	// The broken key stays unknown.
	if got := post(t.Context(), c.URL+"/v1/payments", broken, body); got.status != http.StatusConflict || got.code != idem.CodeOutcomeUnknown {
		t.Fatalf("retry of the key the lookup failed on: %v, want 409 outcome-unknown", got)
	}
	rec, err := e.store.KeyGet(t.Context(), idemstore.Identity{Endpoint: endpoint, Key: broken})
	if err != nil || rec.State != idemstore.StateUnknown {
		t.Fatalf("record of the key the lookup failed on: %+v, %v; want unknown", rec, err)
	}
	if n := up.executions(broken); n != 1 {
		t.Errorf("the key the lookup failed on ran %d times, want 1", n)
	}

	// Every lookup carried the header and named the record exactly.
	for _, k := range keys {
		asked := up.asked(k)
		if len(asked) == 0 {
			t.Fatalf("%q was never looked up", k)
		}
		for _, r := range asked {
			q := r.URL.Query()
			if r.Header.Get("Authorization") != "Bearer "+secret || q.Get("method") != "POST" || q.Get("path") != "/v1/payments" ||
				!q.Has("scope") || q.Get("scope") != "" {
				t.Errorf("lookup of %q: %s %v", k, r.URL, r.Header)
			}
		}
	}
	// Neither the keys nor the credential reach a log.
	for _, p := range []*proc{a, b, c} {
		out := p.output()
		for _, s := range []string{secret, "applied/1", "missing/2", "broken/3"} {
			if strings.Contains(out, s) {
				t.Errorf("%s logged %q:\n%s", p.name, s, out)
			}
		}
	}
}

// postFull is post that also returns the response (its body read).
func postFull(t *testing.T, url, key, body string) (*http.Response, answer) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(idem.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return resp, answer{status: resp.StatusCode, body: b, replayed: resp.Header.Get(idem.HeaderReplayed)}
}
