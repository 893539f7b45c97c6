package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// lockedBuffer collects the log lines of the proxy, the middleware and the
// server.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// front is `idem proxy` in a test: the middleware on a memory store (at
// --max-response 2048) in front of the proxy, on a real TCP server whose
// error log, like the middleware's and the proxy's, goes to logs.
type front struct {
	srv   *httptest.Server
	store idemstore.Store
	logs  *lockedBuffer
}

func newFront(t *testing.T, upstream string) *front {
	t.Helper()
	f := &front{store: idemmem.New(nil), logs: &lockedBuffer{}}
	logger := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := New(mustURL(t, upstream), &Config{Logger: logger})
	t.Cleanup(p.CloseIdleConnections)
	h := idem.New(f.store, &idem.Config{GuardConfig: idem.GuardConfig{MaxResponse: 2048, Logger: logger}})(p)
	f.srv = httptest.NewUnstartedServer(h)
	f.srv.Config.ErrorLog = log.New(f.logs, "http: ", 0)
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

// settled waits until the record of key leaves in_progress.
func (f *front) settled(t *testing.T, key string) *idemstore.Record {
	t.Helper()
	id := idemstore.Identity{Endpoint: "POST /v1/payments", Key: key}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := f.store.KeyGet(context.Background(), id)
		if err != nil {
			t.Fatalf("reading the record: %v", err)
		}
		if rec.State != idemstore.StateInProgress {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatal("record still in progress after 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// retry posts the key again and returns the answer's status and problem
// code.
func (f *front) retry(t *testing.T, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/payments", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Idempotency-Key", key)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	code := ""
	if i := strings.Index(string(body), `"code":"`); i >= 0 {
		code, _, _ = strings.Cut(string(body[i+8:]), `"`)
	}
	return resp.StatusCode, code
}

// bigUpstream answers 201 with a body of size bytes and a Content-Length,
// far more than the kernel's socket buffers hold.
func bigUpstream(t *testing.T, size int, calls *atomic.Int32) *httptest.Server {
	t.Helper()
	piece := bytes.Repeat([]byte("x"), 64<<10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.WriteHeader(http.StatusCreated)
		for n := 0; n < size; n += len(piece) {
			if _, err := w.Write(piece[:min(len(piece), size-n)]); err != nil {
				return // the proxy stopped reading
			}
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// A client that reads a few bytes of a streamed oversize answer and resets
// the connection leaves the key completed and not replayable: the upstream
// answered. Nothing logs a panic or an unknown outcome (issue 12).
func TestClientResetDuringOversizeAnswerIsNotReplayable(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := bigUpstream(t, 16<<20, &calls)
	f := newFront(t, up.URL)

	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"amount":1}`
	fmt.Fprintf(conn, "POST /v1/payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	head := make([]byte, 64)
	if _, err := io.ReadFull(conn, head); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 201 ")) {
		t.Fatalf("answer starts %q, want a 201", head)
	}
	if err := conn.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	conn.Close() // a TCP reset

	rec := f.settled(t, "k")
	if rec.State != idemstore.StateCompleted || !rec.NotReplayable {
		t.Fatalf("record: state %s, not replayable %v; want completed and not replayable", rec.State, rec.NotReplayable)
	}
	if status, code := f.retry(t, "k"); status != http.StatusConflict || code != idem.CodeNotReplayable {
		t.Fatalf("retry: %d %q, want 409 %s", status, code, idem.CodeNotReplayable)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
	logs := f.logs.String()
	if strings.Contains(logs, "panic") || strings.Contains(logs, "outcome unknown") {
		t.Fatalf("the hang-up was logged as a panic or an unknown outcome:\n%s", logs)
	}
	// The reset reached the proxy mid-copy (16 MiB cannot all sit in the
	// socket buffers), and was told as what it is.
	if !strings.Contains(logs, "client went away") {
		t.Fatalf("the hang-up was not logged:\n%s", logs)
	}
}

// An upstream that breaks off its answer mid-body may not have finished:
// the key is unknown (never run again), and the abort is not logged as a
// panic.
func TestUpstreamCutOffMidBodyIsUnknown(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", strconv.Itoa(1<<20))
		w.WriteHeader(http.StatusCreated)
		w.Write(bytes.Repeat([]byte("x"), 4096))
		http.NewResponseController(w).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Close()
	}))
	t.Cleanup(up.Close)
	f := newFront(t, up.URL)

	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/payments", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Idempotency-Key", "k")
	resp, err := f.srv.Client().Do(req)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("the client got a whole answer although the upstream broke off")
	}
	if rec := f.settled(t, "k"); rec.State != idemstore.StateUnknown {
		t.Fatalf("record: state %s, want unknown", rec.State)
	}
	if status, code := f.retry(t, "k"); status != http.StatusConflict || code != idem.CodeOutcomeUnknown {
		t.Fatalf("retry: %d %q, want 409 %s", status, code, idem.CodeOutcomeUnknown)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
	if logs := f.logs.String(); strings.Contains(logs, "panic") || !strings.Contains(logs, "aborted its answer") {
		t.Fatalf("log:\n%s", logs)
	}
}

// resetAfterHead sends a protected POST with key through f, reads n bytes
// of the answer and resets the connection.
func (f *front) resetAfterHead(t *testing.T, key string, n int) []byte {
	t.Helper()
	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"amount":1}`
	fmt.Fprintf(conn, "POST /v1/payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	head := make([]byte, n)
	if _, err := io.ReadFull(conn, head); err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	return head
}

// An event stream (flushed as it comes) whose client resets: completed,
// not replayable, no panic logged.
func TestClientResetDuringEventStreamIsNotReplayable(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	stopped := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(stopped)
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		event := []byte("data: " + strings.Repeat("e", 1000) + "\n\n")
		for range 1 << 16 { // 64 MiB at most
			if _, err := w.Write(event); err != nil {
				return
			}
			if err := http.NewResponseController(w).Flush(); err != nil {
				return
			}
		}
		t.Error("the event stream never broke off")
	}))
	t.Cleanup(up.Close)
	f := newFront(t, up.URL)
	if head := f.resetAfterHead(t, "k", 64); !bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")) {
		t.Fatalf("answer starts %q", head)
	}
	rec := f.settled(t, "k")
	if rec.State != idemstore.StateCompleted || !rec.NotReplayable {
		t.Fatalf("record: state %s, not replayable %v; want completed and not replayable", rec.State, rec.NotReplayable)
	}
	if status, code := f.retry(t, "k"); status != http.StatusConflict || code != idem.CodeNotReplayable {
		t.Fatalf("retry: %d %q, want 409 %s", status, code, idem.CodeNotReplayable)
	}
	<-stopped
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
	if logs := f.logs.String(); strings.Contains(logs, "panic") || strings.Contains(logs, "outcome unknown") {
		t.Fatalf("the hang-up was logged as a panic or an unknown outcome:\n%s", logs)
	}
}

// A client that resets while the upstream works does not cancel it: the
// upstream's (small) answer is stored and replayed to the retry.
func TestClientResetWhileUpstreamWorksIsReplayed(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	arrived, proceed := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if calls.Add(1) == 1 {
			close(arrived)
			<-proceed
		}
		if err := r.Context().Err(); err != nil {
			t.Errorf("the upstream request was cancelled: %v", err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charged":true}`)
	}))
	t.Cleanup(up.Close)
	f := newFront(t, up.URL)

	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"amount":1}`
	fmt.Fprintf(conn, "POST /v1/payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	<-arrived
	if err := conn.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	close(proceed)

	rec := f.settled(t, "k")
	if rec.State != idemstore.StateCompleted || rec.NotReplayable {
		t.Fatalf("record: state %s, not replayable %v; want completed and replayable", rec.State, rec.NotReplayable)
	}
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/payments", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", "k")
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(got) != `{"charged":true}` || resp.Header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %s replayed=%q", resp.StatusCode, got, resp.Header.Get(idem.HeaderReplayed))
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream called %d times, want 1", n)
	}
	if logs := f.logs.String(); strings.Contains(logs, "panic") || strings.Contains(logs, "outcome unknown") {
		t.Fatalf("log:\n%s", logs)
	}
}
