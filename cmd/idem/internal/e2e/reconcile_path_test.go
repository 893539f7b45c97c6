package e2e

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// TestProxyReconcileKeyCannotChangeThePath makes the keys ".", ".." and "/"
// unknown by killing a proxy while the upstream works on them, then starts
// `idem proxy --maintain --reconcile-url …/lookup/{key}` in front of the
// upstream's Go http.ServeMux, which cleans paths (/lookup/.. is /) and
// reads a lone %2F as a trailing slash: /lookup/%2F reached the upstream's
// catch-all, which executes requests and answers 201, and the key was
// settled with that answer. No such key is looked up: each stays unknown,
// with the reason logged and kept on the record, and no request reaches the
// upstream.
func TestProxyReconcileKeyCannotChangeThePath(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	block := make(chan struct{})
	up := newLookupUpstream(t, block)
	const (
		body     = `{"amount":1000}`
		endpoint = "POST /v1/payments"
	)
	keys := []string{".", "..", "/"}
	up.mu.Lock()
	for _, k := range keys {
		up.answers[k] = http.StatusCreated // were they asked, the lookup would say applied
	}
	up.mu.Unlock()

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
	close(block)
	executed := up.total()

	c := e.startProxy("proxy-c", up.srv.URL, 3, "--lease", "1s", "--maintain",
		"--reconcile-url", up.srv.URL+"/lookup/{key}", "--reconcile-interval", "200ms",
		"--reconcile-grace", "1s") // nothing is in flight: a short grace keeps the test short
	reason := "{key} would make a path segment of only dots or slashes, or an empty one"
	for _, k := range keys {
		id := idemstore.Identity{Endpoint: endpoint, Key: k}
		// The first pass about the key, whatever it decided.
		re := regexp.MustCompile(`msg="idemmaint: (unknown outcome reconciled|reconciler failed; unknown outcome unresolved)" key_hash=` + id.LogHash())
		if c.waitLine(re, 60*time.Second) == nil {
			t.Fatalf("key %q was never reconciled:\n%s", k, c.output())
		}
		rec, err := e.store.KeyGet(t.Context(), id)
		if err != nil || rec.State != idemstore.StateUnknown || !strings.HasPrefix(rec.ReconcileError, reason) {
			t.Errorf("key %q: %v (%v, reconcile error %q); want unknown with the reason", k, err, recState(rec), recError(rec))
			continue
		}
		if got := post(t.Context(), c.URL+"/v1/payments", k, body); got.status != http.StatusConflict || got.code != idem.CodeOutcomeUnknown {
			t.Fatalf("retry of %q: %v, want 409 outcome-unknown", k, got)
		}
		if asked := up.asked(k); len(asked) != 0 {
			t.Errorf("key %q was looked up %d times", k, len(asked))
		}
	}
	if n := up.total(); n != executed {
		t.Errorf("the upstream executed %d requests after the kill, want none (a lookup reached its catch-all)", n-executed)
	}
}

func recState(r *idemstore.Record) idemstore.State {
	if r == nil {
		return ""
	}
	return r.State
}

func recError(r *idemstore.Record) string {
	if r == nil {
		return ""
	}
	return r.ReconcileError
}
