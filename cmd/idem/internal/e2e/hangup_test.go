package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// TestClientResetMidAnswerIsNotReplayable is issue 12's report, run against
// the built command: `idem proxy --max-response 2048` in front of an
// upstream answering 201 with 16 MiB, and a client that reads a few bytes
// and resets the connection. The upstream answered, so the key is
// completed and not replayable: the retry gets 409 not-replayable, the
// upstream ran once, and the proxy logs no panic and no unknown outcome.
func TestClientResetMidAnswerIsNotReplayable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const size = 16 << 20
	var calls atomic.Int32
	piece := bytes.Repeat([]byte("x"), 64<<10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.WriteHeader(http.StatusCreated)
		for n := 0; n < size; n += len(piece) {
			if _, err := w.Write(piece); err != nil {
				return // the proxy stopped reading
			}
		}
	}))
	t.Cleanup(up.Close)
	p := e.startProxy("proxy", up.URL, 3, "--max-response", "2048")

	u, err := url.Parse(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	const key, body = "reset-key", `{"amount":1000}`
	fmt.Fprintf(conn, "POST /v1/payments HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s",
		u.Host, key, len(body), body)
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	head := make([]byte, 64)
	if _, err := io.ReadFull(conn, head); err != nil {
		t.Fatalf("reading the first bytes of the answer: %v", err)
	}
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 201 ")) {
		t.Fatalf("answer starts %q, want a 201", head)
	}
	if err := conn.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	conn.Close() // a TCP reset

	deadline := time.Now().Add(60 * time.Second)
	rec := e.record()
	for rec.State == idemstore.StateInProgress && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // the proxy is recording the outcome
		rec = e.record()
	}
	if rec.State != idemstore.StateCompleted || !rec.NotReplayable {
		t.Fatalf("record: state %s, not replayable %v; want completed and not replayable", rec.State, rec.NotReplayable)
	}
	got := post(t.Context(), p.URL+"/v1/payments", key, body)
	if got.err != nil || got.status != http.StatusConflict || got.code != idem.CodeNotReplayable {
		t.Fatalf("retry: %v, want 409 %s", got, idem.CodeNotReplayable)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
	// The hang-up is logged as such once it reached the proxy mid-copy.
	if p.waitLine(clientWentAwayRE, 30*time.Second) == nil {
		t.Fatalf("the proxy did not log the hang-up:\n%s", p.output())
	}
	if out := p.output(); strings.Contains(out, "panic") || strings.Contains(out, "outcome unknown") {
		t.Fatalf("the proxy logged a panic or an unknown outcome:\n%s", out)
	}
}

var clientWentAwayRE = regexp.MustCompile(`client went away`)
