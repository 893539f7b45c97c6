package idem_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// A client that goes away is not an outcome: whatever the client does, the
// handler finishing decides what the record says (SPEC sections 3 and 8).
// These tests hang up real TCP connections at every point where a
// client-side failure could turn a known outcome into unknown.

// hangupBundle is a real server with the middleware on a memory store; the
// middleware's log and the server's error log go to logs.
type hangupBundle struct {
	srv    *httptest.Server
	store  idemstore.Store
	calls  atomic.Int64
	logs   *syncBuffer
	closed chan struct{} // one value per connection the server closed
}

func hangupSetup(t *testing.T, cfg *idem.Config, h http.HandlerFunc) *hangupBundle {
	t.Helper()
	return hangupSetupStore(t, idemtest.CheckReserveResults(t, idemmem.New(nil)), cfg, h)
}

func hangupSetupStore(t *testing.T, store idemstore.Store, cfg *idem.Config, h http.HandlerFunc) *hangupBundle {
	t.Helper()
	b := &hangupBundle{store: store, logs: &syncBuffer{}, closed: make(chan struct{}, 100)}
	var c idem.Config
	if cfg != nil {
		c = *cfg
	}
	c.Logger = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b.srv = httptest.NewUnstartedServer(idem.New(b.store, &c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.calls.Add(1)
		h(w, r)
	})))
	b.srv.Config.ErrorLog = log.New(b.logs, "http: ", 0)
	b.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			b.closed <- struct{}{}
		}
	}
	b.srv.Start()
	t.Cleanup(b.srv.Close)
	return b
}

// request is the raw HTTP/1.1 request the hang-up tests send.
func hangupRequest(key, body string) string {
	return fmt.Sprintf("POST /v1/things HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
}

// resetConn aborts conn: SO_LINGER 0 makes Close send a TCP reset, as a
// client killed mid-answer or a load balancer giving up does.
func resetConn(t *testing.T, conn net.Conn) {
	t.Helper()
	if err := conn.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	conn.Close()
}

// hangUpAfter sends raw, reads n bytes of the answer and resets the
// connection.
func (b *hangupBundle) hangUpAfter(t *testing.T, raw string, n int) {
	t.Helper()
	conn, err := net.Dial("tcp", b.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	if n > 0 {
		if _, err := io.ReadFull(conn, make([]byte, n)); err != nil {
			t.Fatalf("reading the first %d bytes of the answer: %v", n, err)
		}
	}
	resetConn(t, conn)
}

// settled waits until the record of key leaves in_progress and returns it
// (nil when there is none).
func (b *hangupBundle) settled(t *testing.T, key string) *idemstore.Record {
	t.Helper()
	id := idemstore.Identity{Endpoint: "POST /v1/things", Key: key}
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := b.store.KeyGet(context.Background(), id)
		if errors.Is(err, idemstore.ErrNotFound) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idemstore.StateInProgress {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("record still in progress after 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// post sends a whole request and reads the whole answer.
func (b *hangupBundle) post(t *testing.T, key, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", b.srv.URL+"/v1/things", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(data)
}

func (b *hangupBundle) requireNotReplayable(t *testing.T, key string) {
	t.Helper()
	resp, body := b.post(t, key, "{}")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, `"code":"not-replayable"`) {
		t.Fatalf("retry: %d %s, want 409 not-replayable", resp.StatusCode, body)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// requireNoPanicLogged fails when the middleware or the server logged a
// panic.
func (b *hangupBundle) requireNoPanicLogged(t *testing.T) {
	t.Helper()
	if logs := b.logs.String(); strings.Contains(logs, "panic") || strings.Contains(logs, "outcome unknown") {
		t.Fatalf("a hang-up was logged as a panic or an unknown outcome:\n%s", logs)
	}
}

// writeUntilError writes the answer in 64 KiB pieces until a write fails,
// at most 256 MiB; it reports the error.
func writeUntilError(w io.Writer) error {
	piece := []byte(strings.Repeat("x", 64<<10))
	for range 256 << 20 / len(piece) {
		if _, err := w.Write(piece); err != nil {
			return err
		}
	}
	return nil
}

func TestHangUpDuringOversizeAnswer(t *testing.T) {
	t.Parallel()
	// How the handler reacts to the failed write: it returns, or it aborts
	// with http.ErrAbortHandler as httputil.ReverseProxy does.
	for _, abort := range []bool{false, true} {
		t.Run(fmt.Sprintf("abort=%v", abort), func(t *testing.T) {
			t.Parallel()
			writeErr := make(chan error, 1)
			b := hangupSetup(t, &idem.Config{GuardConfig: idem.GuardConfig{MaxResponse: 2048}}, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				err := writeUntilError(w)
				writeErr <- err
				if err != nil && abort {
					panic(http.ErrAbortHandler)
				}
			})
			b.hangUpAfter(t, hangupRequest("k", "{}"), 16)
			if err := <-writeErr; err == nil {
				t.Fatal("256 MiB went to a client that reset the connection")
			}
			rec := b.settled(t, "k")
			if rec == nil || rec.State != idemstore.StateCompleted || !rec.NotReplayable {
				t.Fatalf("record = %+v, want completed and not replayable", rec)
			}
			b.requireNotReplayable(t, "k")
			b.requireNoPanicLogged(t)
			if abort && !strings.Contains(b.logs.String(), "client went away") {
				t.Errorf("the hang-up was not logged:\n%s", b.logs)
			}
		})
	}
}

func TestHangUpDuringFlushedAnswer(t *testing.T) {
	t.Parallel()
	reset := make(chan struct{})
	b := hangupSetup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "first event\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Error(err)
		}
		<-reset
		if writeUntilError(w) == nil {
			t.Error("writes to a reset connection kept succeeding")
		}
		panic(http.ErrAbortHandler)
	})
	b.hangUpAfter(t, hangupRequest("k", "{}"), 12)
	close(reset)
	rec := b.settled(t, "k")
	if rec == nil || rec.State != idemstore.StateCompleted || !rec.NotReplayable {
		t.Fatalf("record = %+v, want completed and not replayable", rec)
	}
	b.requireNotReplayable(t, "k")
	b.requireNoPanicLogged(t)
}

func TestHangUpAfterHijack(t *testing.T) {
	t.Parallel()
	reset := make(chan struct{})
	b := hangupSetup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		conn, bufrw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		bufrw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n")
		bufrw.Flush()
		<-reset
		if writeUntilError(conn) == nil {
			t.Error("writes to a reset connection kept succeeding")
		}
	})
	b.hangUpAfter(t, hangupRequest("k", "{}"), 12)
	close(reset)
	rec := b.settled(t, "k")
	if rec == nil || rec.State != idemstore.StateCompleted || !rec.NotReplayable {
		t.Fatalf("record = %+v, want completed and not replayable", rec)
	}
	b.requireNotReplayable(t, "k")
	b.requireNoPanicLogged(t)
}

// A client that hangs up before the answer (while the handler runs) gets
// nothing, and the buffered answer is stored and replayed.
func TestHangUpWhileHandlerRuns(t *testing.T) {
	t.Parallel()
	arrived, reset := make(chan struct{}), make(chan struct{})
	var n atomic.Int64
	b := hangupSetup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			close(arrived)
			<-reset
			<-r.Context().Done() // the server saw the reset
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	})
	conn, err := net.Dial("tcp", b.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, hangupRequest("k", "{}"))
	<-arrived
	resetConn(t, conn)
	close(reset)
	if rec := b.settled(t, "k"); rec == nil || rec.State != idemstore.StateCompleted || rec.NotReplayable {
		t.Fatalf("record = %+v, want completed and replayable", rec)
	}
	resp, body := b.post(t, "k", "{}")
	if resp.StatusCode != http.StatusCreated || body != "charged" || resp.Header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %q replayed=%q", resp.StatusCode, body, resp.Header.Get(idem.HeaderReplayed))
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	b.requireNoPanicLogged(t)
}

// A client that resets while a stored answer is replayed to it changes
// nothing: the next retry is replayed in full.
func TestHangUpDuringReplay(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("r", 8<<20)
	b := hangupSetup(t, &idem.Config{GuardConfig: idem.GuardConfig{MaxResponse: 16 << 20}}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, big)
	})
	if resp, body := b.post(t, "k", "{}"); resp.StatusCode != http.StatusCreated || body != big {
		t.Fatalf("first answer: %d, %d bytes", resp.StatusCode, len(body))
	}
	for range 3 {
		b.hangUpAfter(t, hangupRequest("k", "{}"), 16)
	}
	resp, body := b.post(t, "k", "{}")
	if resp.StatusCode != http.StatusCreated || body != big || resp.Header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d, %d bytes, replayed=%q", resp.StatusCode, len(body), resp.Header.Get(idem.HeaderReplayed))
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	b.requireNoPanicLogged(t)
}

// A duplicate that waits (wait mode) and hangs up leaves the running
// attempt alone.
func TestHangUpWhileWaiting(t *testing.T) {
	t.Parallel()
	arrived, proceed := make(chan struct{}), make(chan struct{})
	b := hangupSetup(t, &idem.Config{GuardConfig: idem.GuardConfig{Wait: 30 * time.Second}}, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-proceed
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	})
	first := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("POST", b.srv.URL+"/v1/things", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k")
		resp, err := b.srv.Client().Do(req)
		if err != nil {
			first <- err.Error()
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		first <- fmt.Sprint(resp.StatusCode, " ", string(body))
	}()
	<-arrived
	for range 3 {
		conn, err := net.Dial("tcp", b.srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, hangupRequest("k", "{}"))
		// The duplicate waits for the first; nothing answers it yet.
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		var ne net.Error
		if _, err := bufio.NewReader(conn).ReadByte(); !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("a waiting duplicate was answered: %v", err)
		}
		resetConn(t, conn)
	}
	close(proceed)
	if got := <-first; got != "201 charged" {
		t.Fatalf("first answer %q", got)
	}
	resp, body := b.post(t, "k", "{}")
	if resp.StatusCode != http.StatusCreated || body != "charged" || resp.Header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %q", resp.StatusCode, body)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	b.requireNoPanicLogged(t)
}

// A client that resets before its body arrived reserves nothing: the
// retry with the whole body runs once.
func TestHangUpDuringRequestBody(t *testing.T) {
	t.Parallel()
	b := hangupSetup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	})
	full := `{"amount":100,"currency":"eur"}`
	raw := hangupRequest("k", full)
	conn, err := net.Dial("tcp", b.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, raw[:len(raw)-10]) // the body's last bytes never come
	resetConn(t, conn)
	// The server reads the cut body until the reset reaches it and closes
	// the connection; nothing may be stored.
	select {
	case <-b.closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the server never closed the reset connection")
	}
	if rec := b.settled(t, "k"); rec != nil {
		t.Fatalf("a request cut off in its body left a record: %+v", rec)
	}
	resp, body := b.post(t, "k", full)
	if resp.StatusCode != http.StatusCreated || body != "charged" || resp.Header.Get(idem.HeaderReplayed) == "true" {
		t.Fatalf("retry: %d %q replayed=%q, want a fresh 201", resp.StatusCode, body, resp.Header.Get(idem.HeaderReplayed))
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	b.requireNoPanicLogged(t)
}

// A handler that aborts its answer with the client still there may have
// acted: unknown, as any panic, but logged as an abort, not a panic; and
// the abort still reaches the server.
func TestAbortWithClientPresentIsUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		panic(http.ErrAbortHandler)
	})
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		b.do(t, "POST", "key-one", "{}")
	}()
	requireProblem(t, b.do(t, "POST", "key-one", "{}"), 409, "outcome-unknown")
	if logs := b.logs.String(); strings.Contains(logs, "panicked") || !strings.Contains(logs, "aborted its answer") {
		t.Fatalf("log:\n%s", logs)
	}
}

// A real panic stays a panic after a client hang-up (SPEC section 3):
// unknown, logged, and re-raised to the server.
func TestPanicAfterHangUpIsUnknown(t *testing.T) {
	t.Parallel()
	panicked := make(chan struct{})
	b := hangupSetup(t, &idem.Config{GuardConfig: idem.GuardConfig{MaxResponse: 2048}}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		if writeUntilError(w) == nil {
			t.Error("writes to a reset connection kept succeeding")
		}
		close(panicked)
		panic("boom")
	})
	b.hangUpAfter(t, hangupRequest("k", "{}"), 16)
	<-panicked
	if rec := b.settled(t, "k"); rec == nil || rec.State != idemstore.StateUnknown {
		t.Fatalf("record = %+v, want unknown", rec)
	}
	resp, body := b.post(t, "k", "{}")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, `"code":"outcome-unknown"`) {
		t.Fatalf("retry: %d %s", resp.StatusCode, body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(b.logs.String(), "http: panic serving") {
		if time.Now().After(deadline) {
			t.Fatalf("the panic never reached the server:\n%s", b.logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(b.logs.String(), "handler panicked, outcome unknown") {
		t.Fatalf("the panic was not logged:\n%s", b.logs)
	}
}

// In transactional mode a hang-up mid-answer commits what the handler
// wrote: the key is completed (not replayable) with the business row,
// never rolled back as an abort with the client present is.
func TestHangUpDuringOversizeAnswerTransactional(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	b := hangupSetupStore(t, store, &idem.Config{GuardConfig: idem.GuardConfig{Transactional: true, MaxResponse: 2048}}, func(w http.ResponseWriter, r *http.Request) {
		tx, err := idemmem.TxFromContext(r.Context())
		if err != nil {
			t.Error(err)
			return
		}
		if err := tx.Put("payment", "1"); err != nil {
			t.Error(err)
			return
		}
		w.WriteHeader(http.StatusCreated)
		if writeUntilError(w) == nil {
			t.Error("writes to a reset connection kept succeeding")
		}
		panic(http.ErrAbortHandler)
	})
	b.hangUpAfter(t, hangupRequest("k", "{}"), 16)
	rec := b.settled(t, "k")
	if rec == nil || rec.State != idemstore.StateCompleted || !rec.NotReplayable {
		t.Fatalf("record = %+v, want completed and not replayable", rec)
	}
	if v := store.Values()["payment"]; v != "1" {
		t.Fatalf("payment = %q, want the handler's write committed", v)
	}
	b.requireNotReplayable(t, "k")
	b.requireNoPanicLogged(t)
}
