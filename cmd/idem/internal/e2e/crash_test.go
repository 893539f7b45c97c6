package e2e

import (
	"bytes"
	"net/http"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// killNow sends SIGKILL to p and checks that it died of it.
func killNow(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s: %v", p.name, err)
	}
	p.wait(t, 30*time.Second)
	if !p.killedBySIGKILL() {
		t.Fatalf("%s ended with %v, not by SIGKILL", p.name, p.cmd.ProcessState)
	}
}

// TestKilledProxyLeavesKeyUnknown kills a proxy while its upstream call
// runs. Nothing can tell whether the upstream acted, so once the lease has
// run out the key is unknown: a retry through another proxy gets 409
// outcome-unknown, never a second execution.
func TestKilledProxyLeavesKeyUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	block := make(chan struct{})
	up := newUpstream(t, 0, block)
	defer close(block)
	a := e.startProxy("proxy-a", up.URL, 3, "--lease", "1s")
	b := e.startProxy("proxy-b", up.URL, 3, "--lease", "1s")
	const key, body = "crash-key", `{"amount":1000}`

	first := make(chan answer, 1)
	go func() { first <- post(t.Context(), a.URL+"/v1/payments", key, body) }()
	select {
	case <-up.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the request never reached the upstream")
	}
	killNow(t, a)
	if got := <-first; got.err == nil {
		t.Fatalf("the killed proxy answered: %v", got)
	}

	// Until the lease (1 s, no longer renewed) runs out, the key is in use;
	// then it is unknown.
	got := retryWhileInUse(t, b.URL+"/v1/payments", key, body, 20*time.Second)
	if got.err != nil || got.status != http.StatusConflict || got.code != idem.CodeOutcomeUnknown || got.retryAfter == "" {
		t.Fatalf("retry after the lease: %v, want 409 outcome-unknown with Retry-After", got)
	}
	if rec := e.record(); rec.State != idemstore.StateUnknown || rec.Attempts != 1 {
		t.Fatalf("record after the lease: state %s, %d attempts; want unknown after 1", rec.State, rec.Attempts)
	}
	for range 3 {
		if got := post(t.Context(), b.URL+"/v1/payments", key, body); got.status != http.StatusConflict || got.code != idem.CodeOutcomeUnknown {
			t.Fatalf("another retry: %v, want 409 outcome-unknown", got)
		}
	}
	if n := up.executions(key); n != 1 {
		t.Fatalf("the upstream executed %d times, want 1", n)
	}
}

var blockedRE = regexp.MustCompile(`\bmsg=blocked\b`)

// TestKilledTransactionalServerCommitsNothing kills a server in
// transactional mode after its handler inserted a business row and before
// it answered. The row never commits, and once the lease has run out a
// retry on a second server executes once and commits exactly one row.
func TestKilledTransactionalServerCommitsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rows := e.table("business_rows")
	e.exec("CREATE TABLE " + rows + " (id bigserial PRIMARY KEY, op_key text NOT NULL, pid integer NOT NULL)")
	blocking := e.startChild("tx-server-blocking", "tx", map[string]string{childBlock: "1"})
	second := e.startChild("tx-server", "tx", nil)
	const key, body = "order-tx-crash", `{"amount":1000}`

	first := make(chan answer, 1)
	go func() { first <- post(t.Context(), blocking.URL+"/v1/orders", key, body) }()
	if blocking.waitLine(blockedRE, 30*time.Second) == nil {
		t.Fatal("the handler never reached its block")
	}
	killNow(t, blocking)
	if got := <-first; got.err == nil {
		t.Fatalf("the killed server answered: %v", got)
	}
	if n := e.count("SELECT count(*) FROM " + rows); n != 0 {
		t.Fatalf("%d business rows after the kill, want 0", n)
	}

	got := retryWhileInUse(t, second.URL+"/v1/orders", key, body, 20*time.Second)
	if got.err != nil || got.status != http.StatusCreated || got.replayed != "" {
		t.Fatalf("retry after the lease: %v, want 201 from an execution", got)
	}
	replay := post(t.Context(), second.URL+"/v1/orders", key, body)
	if replay.status != http.StatusCreated || replay.replayed != "true" || !bytes.Equal(replay.body, got.body) {
		t.Fatalf("replay: %v, want the replay of %q", replay, got.body)
	}
	if n := e.count("SELECT count(*) FROM "+rows+" WHERE op_key = $1 AND pid = $2", key, second.cmd.Process.Pid); n != 1 {
		t.Fatalf("%d business rows from the retry, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM " + rows); n != 1 {
		t.Fatalf("%d business rows in all, want 1", n)
	}
	if rec := e.record(); rec.State != idemstore.StateCompleted || rec.Attempts != 2 {
		t.Fatalf("record: state %s, %d attempts; want completed after 2", rec.State, rec.Attempts)
	}
}
