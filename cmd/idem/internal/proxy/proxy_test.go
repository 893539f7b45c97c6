package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// echo is what the echo upstream saw.
type echo struct {
	Method     string      `json:"method"`
	RequestURI string      `json:"request_uri"`
	Host       string      `json:"host"`
	Header     http.Header `json:"header"`
	Body       string      `json:"body"`
}

func echoUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("upstream reading body: %v", err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.Header().Set("Connection", "X-Resp-Hop")
		w.Header().Set("X-Resp-Hop", "dropped")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(echo{
			Method: r.Method, RequestURI: r.RequestURI, Host: r.Host, Header: r.Header, Body: string(body),
		})
	}))
	t.Cleanup(up.Close)
	return up
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestForwardsFaithfully(t *testing.T) {
	t.Parallel()
	up := echoUpstream(t)

	tests := []struct {
		name     string
		upstream string // path and query appended to the upstream's address
		target   string
		wantURI  string
	}{
		{"plain", "", "/v1/payments", "/v1/payments"},
		{"escaped path", "", "/v1/a%2Fb/c%20d", "/v1/a%2Fb/c%20d"},
		{"query kept verbatim", "", "/v1/x?b=2&a=1&a=0&semi=1;2&enc=%3D", "/v1/x?b=2&a=1&a=0&semi=1;2&enc=%3D"},
		{"upstream path prefix", "/base", "/v1/a%2Fb?q=1", "/base/v1/a%2Fb?q=1"},
		{"upstream query joined", "/base?tenant=t", "/v1?q=1", "/base/v1?tenant=t&q=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := New(mustURL(t, up.URL+tt.upstream), &Config{Logger: quietLogger()})
			front := httptest.NewServer(h)
			defer front.Close()
			defer h.CloseIdleConnections()

			req, err := http.NewRequest(http.MethodPatch, front.URL+tt.target, strings.NewReader(`{"amount": 1}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", `"k-1"`)
			req.Header.Set("Authorization", "Bearer t")
			req.Header.Add("X-Multi", "one")
			req.Header.Add("X-Multi", "two")
			req.Header.Set("X-Forwarded-For", "203.0.113.7")
			req.Header.Set("Forwarded", "for=203.0.113.7")
			req.Header.Set("Connection", "X-Hop")
			req.Header.Set("X-Hop", "dropped")
			req.Header.Set("Keep-Alive", "timeout=5")
			req.Header.Set("Proxy-Connection", "keep-alive")
			req.Header.Set("Proxy-Authorization", "Basic x")
			req.Header.Set("Upgrade", "h2c")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()

			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status = %d, want 201", resp.StatusCode)
			}
			if got := resp.Header.Values("Set-Cookie"); len(got) != 2 || got[0] != "a=1" || got[1] != "b=2" {
				t.Errorf("Set-Cookie = %q, want both cookies in order", got)
			}
			if resp.Header.Get("X-Upstream") != "yes" {
				t.Errorf("X-Upstream not copied back")
			}
			for _, hop := range []string{"X-Resp-Hop", "Keep-Alive"} {
				if v := resp.Header.Get(hop); v != "" {
					t.Errorf("response hop-by-hop header %s = %q, want it dropped", hop, v)
				}
			}

			var got echo
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			if got.Method != http.MethodPatch {
				t.Errorf("method = %q", got.Method)
			}
			if got.RequestURI != tt.wantURI {
				t.Errorf("request URI = %q, want %q", got.RequestURI, tt.wantURI)
			}
			if got.Body != `{"amount": 1}` {
				t.Errorf("body = %q", got.Body)
			}
			if got.Host != mustURL(t, up.URL).Host {
				t.Errorf("Host = %q, want the upstream's", got.Host)
			}
			for name, want := range map[string]string{
				"Idempotency-Key":   `"k-1"`,
				"Authorization":     "Bearer t",
				"X-Forwarded-For":   "203.0.113.7, 127.0.0.1",
				"X-Forwarded-Host":  mustURL(t, front.URL).Host,
				"X-Forwarded-Proto": "http",
				"Forwarded":         "for=203.0.113.7",
			} {
				if v := strings.Join(got.Header.Values(name), ", "); v != want {
					t.Errorf("upstream saw %s = %q, want %q", name, v, want)
				}
			}
			if v := got.Header.Values("X-Multi"); len(v) != 2 || v[0] != "one" || v[1] != "two" {
				t.Errorf("X-Multi = %q, want both field lines", v)
			}
			for _, hop := range []string{"X-Hop", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Upgrade", "Connection"} {
				if v := got.Header.Get(hop); v != "" {
					t.Errorf("hop-by-hop header %s = %q reached the upstream", hop, v)
				}
			}
		})
	}
}

// protect puts the idem middleware on a memory store in front of h.
func protect(h http.Handler) http.Handler {
	return idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{Logger: quietLogger()}})(h)
}

func post(h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// An upstream that cannot be reached never got the request: 502, and the
// key is released, so the retry runs again.
func TestUnreachableUpstreamIs502AndReleases(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now

	h := protect(New(mustURL(t, "http://"+addr), &Config{Logger: quietLogger()}))
	assertProblem(t, post(h, "k"), http.StatusBadGateway, CodeUpstreamUnavailable)
	// Released: the retry executes again (and fails the same way), rather
	// than getting 409 outcome-unknown.
	assertProblem(t, post(h, "k"), http.StatusBadGateway, CodeUpstreamUnavailable)
}

// An upstream that got the request and did not answer in time may have
// acted: 504, and the key's outcome is unknown, so a retry is not run again.
func TestUpstreamTimeoutIs504AndUnknown(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		case <-time.After(10 * time.Second): // bound a broken timeout
		}
	}))
	defer up.Close()
	defer close(release)

	p := New(mustURL(t, up.URL), &Config{Timeout: 50 * time.Millisecond, Logger: quietLogger()})
	defer p.CloseIdleConnections()
	h := protect(p)
	assertProblem(t, post(h, "k"), http.StatusGatewayTimeout, CodeUpstreamTimeout)
	assertProblem(t, post(h, "k"), http.StatusConflict, idem.CodeOutcomeUnknown)
	if n := calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
}

// An upstream whose answer is still arriving when Config.Timeout ends has
// acted: the exchange is cut off (ReverseProxy aborts the answer) and the
// key's outcome is unknown.
func TestUpstreamTimeoutMidBodyIsUnknown(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", strconv.Itoa(1<<20))
		w.WriteHeader(http.StatusCreated)
		w.Write(bytes.Repeat([]byte("x"), 4096))
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		case <-time.After(10 * time.Second): // bound a broken timeout
		}
	}))
	defer up.Close()
	defer close(release)

	p := New(mustURL(t, up.URL), &Config{Timeout: 100 * time.Millisecond, Logger: quietLogger()})
	defer p.CloseIdleConnections()
	// Through a server: ReverseProxy aborts an answer only there.
	front := httptest.NewUnstartedServer(protect(p))
	front.Config.ErrorLog = log.New(io.Discard, "", 0)
	front.Start()
	defer front.Close()
	send := func() (*http.Response, []byte, error) {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := front.Client().Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp, body, err
	}
	start := time.Now()
	if _, _, err := send(); err == nil {
		t.Fatal("the client got a whole answer although the upstream timed out mid-body")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the exchange took %s, want it cut off at the timeout", d)
	}
	resp, body, err := send()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), idem.CodeOutcomeUnknown) {
		t.Errorf("retry: %d %s, want 409 %s", resp.StatusCode, body, idem.CodeOutcomeUnknown)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
}

// An upstream that takes the request and drops the connection may have
// acted: 502, and the key's outcome is unknown.
func TestBrokenExchangeIs502AndUnknown(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.ReadAll(r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijacking: %v", err)
			return
		}
		conn.Close() // no answer at all
	}))
	defer up.Close()
	p := New(mustURL(t, up.URL), &Config{Logger: quietLogger()})
	defer p.CloseIdleConnections()
	h := protect(p)

	rec := post(h, "k")
	assertProblem(t, rec, http.StatusBadGateway, CodeUpstreamUnavailable)
	if !strings.Contains(rec.Body.String(), "broke off") {
		t.Errorf("detail = %s, want it to say the exchange broke off", rec.Body)
	}
	assertProblem(t, post(h, "k"), http.StatusConflict, idem.CodeOutcomeUnknown)
	if n := calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
}

func assertProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d", rec.Code, status)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q", ct)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
		Code   string `json:"code"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body.String(), err)
	}
	if p.Status != status || p.Code != code || p.Type != DefaultProblemTypeBase+code || p.Title == "" || p.Detail == "" {
		t.Errorf("problem = %+v, want status %d code %q", p, status, code)
	}
}

// A client that hangs up does not cancel the upstream call: the upstream
// finishes with a live request context and the proxy handler relays its
// answer.
func TestClientHangUpDoesNotCancelUpstream(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{})
	proceed := make(chan struct{})
	upstreamErr := make(chan error, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-proceed
		upstreamErr <- r.Context().Err()
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "done")
	}))
	defer up.Close()

	h := New(mustURL(t, up.URL), &Config{Logger: quietLogger()})
	defer h.CloseIdleConnections()
	relayed := make(chan int, 1)
	frontSawHangUp := make(chan struct{})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		go func() {
			<-r.Context().Done()
			close(frontSawHangUp)
		}()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		relayed <- rec.Code
	}))
	defer front.Close()

	ctx, cancel := context.WithCancel(context.Background())
	clientErr := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/v1/payments", strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		clientErr <- err
	}()
	<-arrived
	cancel()
	if err := <-clientErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error = %v, want context.Canceled", err)
	}
	select {
	case <-frontSawHangUp: // the hang-up reached the proxy's request context
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy's server never saw the client hang up")
	}
	close(proceed)
	if err := <-upstreamErr; err != nil {
		t.Errorf("upstream request context ended with %v after the client hung up", err)
	}
	if code := <-relayed; code != http.StatusCreated {
		t.Errorf("proxy relayed %d, want the upstream's 201", code)
	}
}

// flushRecorder counts flushes.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushes atomic.Int32
}

func (f *flushRecorder) Flush() { f.flushes.Add(1); f.ResponseRecorder.Flush() }

// A chunked upstream answer is not flushed (the middleware would have to mark
// it not replayable); an event stream is.
func TestFlushesOnlyEventStreams(t *testing.T) {
	t.Parallel()
	tests := []struct {
		contentType string
		wantFlush   bool
	}{
		{"application/json", false},
		{"", false},
		{"text/event-stream", true},
		{"Text/Event-Stream; charset=utf-8", true},
	}
	for _, tt := range tests {
		t.Run(tt.contentType, func(t *testing.T) {
			t.Parallel()
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.contentType != "" {
					w.Header().Set("Content-Type", tt.contentType)
				}
				for range 3 {
					_, _ = io.WriteString(w, "chunk\n")
					w.(http.Flusher).Flush() // chunked: no Content-Length
				}
			}))
			defer up.Close()
			h := New(mustURL(t, up.URL), &Config{Logger: quietLogger()})
			defer h.CloseIdleConnections()

			rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
			if got := rec.Body.String(); got != "chunk\nchunk\nchunk\n" {
				t.Fatalf("body = %q", got)
			}
			if flushed := rec.flushes.Load() > 0; flushed != tt.wantFlush {
				t.Errorf("flushed = %v, want %v", flushed, tt.wantFlush)
			}
		})
	}
}

func TestLargeBodyBothWays(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body) // HTTP/1: read it all before answering
		if err != nil {
			t.Errorf("upstream reading body: %v", err)
		}
		_, _ = w.Write(body)
	}))
	defer up.Close()
	h := New(mustURL(t, up.URL), &Config{Logger: quietLogger()})
	defer h.CloseIdleConnections()
	front := httptest.NewServer(h)
	defer front.Close()

	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	resp, err := http.Post(front.URL, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, body) {
		t.Errorf("echoed %d bytes, want the %d sent, byte-identical", len(got), len(body))
	}
}

// Through the middleware, a chunked upstream answer is stored and replayed.
func TestChunkedAnswerIsReplayed(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":`)
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, strconv.Itoa(int(n))+"}")
	}))
	defer up.Close()
	p := New(mustURL(t, up.URL), &Config{Logger: quietLogger()})
	defer p.CloseIdleConnections()
	h := protect(p)

	first, second := post(h, "k"), post(h, "k")
	if first.Code != http.StatusCreated || second.Code != http.StatusCreated {
		t.Fatalf("statuses = %d, %d; want 201 twice", first.Code, second.Code)
	}
	if second.Header().Get(idem.HeaderReplayed) != "true" {
		t.Errorf("second answer not marked %s", idem.HeaderReplayed)
	}
	if first.Body.String() != `{"id":1}` || second.Body.String() != first.Body.String() {
		t.Errorf("bodies = %q, %q; want {\"id\":1} twice", first.Body, second.Body)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
}

// With StripeErrors the proxy's own answers speak Stripe, as the
// middleware's do under the Stripe profile: api_error, the problem code, and
// Stripe-Should-Retry true only when the request certainly never left.
func TestStripeErrorsWordTheProxysAnswers(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-time.After(10 * time.Second): // bound a broken timeout
		}
	}))
	defer slow.Close()
	defer close(release)
	stripe := idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{Logger: quietLogger()}, Profile: idem.ProfileStripe})
	for _, tt := range []struct {
		name, upstream, code string
		status               int
		shouldRetry          string
	}{
		{"unreachable", "http://" + addr, CodeUpstreamUnavailable, http.StatusBadGateway, "true"},
		{"timeout", slow.URL, CodeUpstreamTimeout, http.StatusGatewayTimeout, "false"},
	} {
		p := New(mustURL(t, tt.upstream), &Config{Timeout: 50 * time.Millisecond, Logger: quietLogger(), StripeErrors: true})
		rec := post(stripe(p), "k-"+tt.name)
		p.CloseIdleConnections()
		if rec.Code != tt.status || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("%s: %d %q %s", tt.name, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
		var e struct {
			Error struct{ Type, Code, Message string }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v: %s", tt.name, err, rec.Body)
		}
		if e.Error.Type != "api_error" || e.Error.Code != tt.code || e.Error.Message == "" {
			t.Errorf("%s: error %+v, want api_error %s", tt.name, e.Error, tt.code)
		}
		if got := rec.Header().Get("Stripe-Should-Retry"); got != tt.shouldRetry {
			t.Errorf("%s: Stripe-Should-Retry %q, want %q", tt.name, got, tt.shouldRetry)
		}
	}
}

// countingConn counts the writes the transport makes on a connection to
// the upstream.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A protected request's body is in memory (the middleware read it to
// fingerprint it): the upstream gets the request line, the headers and the
// body in one write, where ReverseProxy's own wrapping of every body would
// make the transport flush the headers first, one write system call more
// for the proxy and one read more for the upstream. An unprotected request
// streams its body as before. The upstream sees the same bytes either way.
func TestProtectedRequestIsOneWrite(t *testing.T) {
	t.Parallel()
	up := echoUpstream(t)
	var writes atomic.Int64
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes}, nil
	}
	t.Cleanup(tr.CloseIdleConnections)
	h := protect(New(mustURL(t, up.URL), &Config{Logger: quietLogger(), Transport: tr}))

	for i, key := range []string{"one", "two", "three"} {
		before := writes.Load()
		rec := post(h, key)
		if rec.Code != http.StatusCreated {
			t.Fatalf("request %d: status %d, body %s", i, rec.Code, rec.Body)
		}
		var got echo
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		if got.Body != `{"amount":1}` {
			t.Errorf("request %d: upstream got body %q", i, got.Body)
		}
		if n := writes.Load() - before; n != 1 {
			t.Errorf("request %d: %d writes to the upstream, want 1", i, n)
		}
	}

	// Unprotected (no key): the client's body streams through unchanged.
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":2}`))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var got echo
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Body != `{"amount":2}` {
		t.Errorf("unprotected request: status %d, upstream got %q (%v)", rec.Code, got.Body, err)
	}
}
