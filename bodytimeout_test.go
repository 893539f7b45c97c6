package idem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
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
)

// A body sent too slowly over a real connection gets 408 body-timeout, the
// handler never runs, and the key is never reserved, not even while the
// body is still arriving: the same key then works at once.
func TestSlowBodyTimesOutWithoutReserving(t *testing.T) {
	t.Parallel()
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			t.Parallel()
			store := idemmem.New(nil)
			var calls atomic.Int32
			const timeout = 400 * time.Millisecond
			h := idem.New(store, &idem.Config{BodyTimeout: timeout})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			srv := httptest.NewServer(h)
			defer srv.Close()

			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			head := "POST /v1/payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow-key\r\nContent-Type: application/json\r\n"
			if chunked {
				head += "Transfer-Encoding: chunked\r\n\r\n"
			} else {
				head += "Content-Length: 1000\r\n\r\n"
			}
			if _, err := io.WriteString(conn, head); err != nil {
				t.Fatal(err)
			}
			// Trickle the body, a byte at a time, and look at the store
			// while it arrives.
			done := make(chan struct{})
			go func() {
				defer close(done)
				for range 200 {
					b := "{"
					if chunked {
						b = "1\r\n{\r\n"
					}
					if _, err := io.WriteString(conn, b); err != nil {
						return // the server gave up on us
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
			start := time.Now()
			for time.Since(start) < timeout/2 {
				if recs, err := store.KeyList(context.Background(), &idemstore.ListParams{}); err != nil || len(recs) != 0 {
					t.Fatalf("while the body arrives the store holds %d records (%v), want none", len(recs), err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			elapsed := time.Since(start)
			var p idem.Problem
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			conn.Close()
			<-done
			if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("Content-Type") != "application/problem+json" ||
				p.Code != idem.CodeBodyTimeout || p.Status != http.StatusRequestTimeout {
				t.Fatalf("answer %d %s %+v, want 408 problem+json body-timeout", resp.StatusCode, resp.Header.Get("Content-Type"), p)
			}
			if elapsed < timeout/2 || elapsed > 20*timeout {
				t.Errorf("answered after %s, want about %s", elapsed, timeout)
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("handler ran %d times, want 0", n)
			}
			if recs, err := store.KeyList(context.Background(), &idemstore.ListParams{}); err != nil || len(recs) != 0 {
				t.Fatalf("after the timeout the store holds %d records (%v), want none", len(recs), err)
			}
			// The key is free: a prompt request with it runs.
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payments", strings.NewReader(`{"a":1}`))
			req.Header.Set("Idempotency-Key", "slow-key")
			req.Header.Set("Content-Type", "application/json")
			resp, err = http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || calls.Load() != 1 {
				t.Errorf("the prompt request: %d, %d calls; want 201 and 1", resp.StatusCode, calls.Load())
			}
		})
	}
}

// A body that arrives within the bound, even slowly, is served, and so is
// the next request on the same connection (TestBodyDeadlineLifted shows the
// deadline does not outlive the body).
func TestBodyWithinTimeoutIsServed(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	h := idem.New(store, &idem.Config{BodyTimeout: 2 * time.Second})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := range 2 {
		fmt.Fprintf(conn, "POST /x HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k%d\r\nContent-Length: 4\r\n\r\n", i)
		for _, c := range "{ }\n" {
			fmt.Fprint(conn, string(c))
			time.Sleep(50 * time.Millisecond)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d: %d, want 201", i, resp.StatusCode)
		}
	}
}

// deadlineWriter is a ResponseWriter whose connection read deadlines are
// recorded: http.ResponseController sets them on it.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	deadlines []time.Time
}

func (w *deadlineWriter) SetReadDeadline(t time.Time) error {
	w.deadlines = append(w.deadlines, t)
	return nil
}

// The body's read deadline is BodyTimeout from when the middleware starts
// reading, and it is lifted before the handler runs, so that neither the
// handler nor the next request on the connection is cut short by it.
func TestBodyDeadlineLifted(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	w := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	var atHandler []time.Time
	h := idem.New(idemmem.New(nil), &idem.Config{BodyTimeout: timeout})(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		atHandler = append(atHandler, w.deadlines...)
	}))
	r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader("{}"))
	r.Header.Set("Idempotency-Key", "k")
	before := time.Now()
	h.ServeHTTP(w, r)
	after := time.Now()
	if len(atHandler) != 2 || !atHandler[1].IsZero() {
		t.Fatalf("deadlines set before the handler ran: %v, want one, then the zero time (lifted)", atHandler)
	}
	if d := atHandler[0]; d.Before(before.Add(timeout)) || d.After(after.Add(timeout)) {
		t.Fatalf("deadline %v, want %v after the request started", d, timeout)
	}
	if len(w.deadlines) != 2 {
		t.Fatalf("deadlines %v, want no more after the handler", w.deadlines)
	}
}
