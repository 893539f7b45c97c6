package idemclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idem-dev/idem/idemclient"
)

// seen is a request as the imitation server received it.
type seen struct {
	method string
	keys   []string // Idempotency-Key field lines
	body   string
}

// server imitates the answers of an idem server: the n-th request gets the
// n-th answer, the last answer repeats.
type server struct {
	*httptest.Server
	mu      sync.Mutex
	reqs    []seen
	answers []http.HandlerFunc
}

func newServer(t *testing.T, answers ...http.HandlerFunc) *server {
	t.Helper()
	s := &server{answers: answers}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.reqs)
		s.reqs = append(s.reqs, seen{method: r.Method, keys: r.Header.Values(idemclient.HeaderKey), body: string(body)})
		answer := s.answers[min(n, len(s.answers)-1)]
		s.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.reqs...)
}

func reply(status int, body string, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

func replyProblem(status int, code string, header ...string) http.HandlerFunc {
	body := fmt.Sprintf(`{"type":"https://idem.dev/problems/%s","title":"%s","status":%d,"code":%q}`, code, code, status, code)
	return reply(status, body, append([]string{"Content-Type", "application/problem+json"}, header...)...)
}

// hangUp closes the connection without answering.
func hangUp(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

// newClient returns a client with millisecond waits, a silent logger and a
// transport whose idle connections close with the test.
func newClient(t *testing.T) *idemclient.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := idemclient.NewClient()
	c.HTTPClient = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	c.RetryWaitMin, c.RetryWaitMax = time.Millisecond, 5*time.Millisecond
	c.Logger = slog.New(slog.DiscardHandler)
	return c
}

func newRequest(t *testing.T, ctx context.Context, method, url, body string) *http.Request {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func readBody(t *testing.T, resp *idemclient.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return string(b)
}

var quotedUUID = regexp.MustCompile(`^"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"$`)

func TestDoKeyedRetries(t *testing.T) {
	t.Parallel()
	ok := reply(201, `{"id":1}`)
	for _, tc := range []struct {
		name         string
		answers      []http.HandlerFunc
		wantStatus   int
		wantAttempts int
		wantReplayed bool
		wantBody     string // a part of the final body the caller reads
	}{
		{name: "first try", answers: []http.HandlerFunc{ok}, wantStatus: 201, wantAttempts: 1, wantBody: `{"id":1}`},
		{
			name:       "key in use, then the replay",
			answers:    []http.HandlerFunc{replyProblem(409, "key-in-use", "Retry-After", "0"), replyProblem(409, "key-in-use"), reply(201, `{"id":1}`, idemclient.HeaderReplayed, "true")},
			wantStatus: 201, wantAttempts: 3, wantReplayed: true, wantBody: `{"id":1}`,
		},
		{name: "connection cut", answers: []http.HandlerFunc{hangUp, hangUp, ok}, wantStatus: 201, wantAttempts: 3, wantBody: `{"id":1}`},
		{name: "429", answers: []http.HandlerFunc{replyProblem(429, "too-many-keys", "Retry-After", "0"), ok}, wantStatus: 201, wantAttempts: 2, wantBody: `{"id":1}`},
		{
			name:       "5xx",
			answers:    []http.HandlerFunc{replyProblem(503, "store-unavailable"), reply(500, ""), reply(502, ""), reply(504, ""), ok},
			wantStatus: 201, wantAttempts: 5, wantBody: `{"id":1}`,
		},
		{name: "408 and 425", answers: []http.HandlerFunc{reply(408, ""), reply(425, ""), ok}, wantStatus: 201, wantAttempts: 3, wantBody: `{"id":1}`},
		{name: "outcome unknown, then resolved", answers: []http.HandlerFunc{replyProblem(409, "outcome-unknown"), ok}, wantStatus: 201, wantAttempts: 2, wantBody: `{"id":1}`},
		{name: "400 is final", answers: []http.HandlerFunc{replyProblem(400, "key-invalid"), ok}, wantStatus: 400, wantAttempts: 1, wantBody: `"code":"key-invalid"`},
		{name: "422 key-reused is final", answers: []http.HandlerFunc{replyProblem(422, "key-reused"), ok}, wantStatus: 422, wantAttempts: 1, wantBody: `"code":"key-reused"`},
		{name: "404 is final", answers: []http.HandlerFunc{reply(404, "no such thing"), ok}, wantStatus: 404, wantAttempts: 1, wantBody: "no such thing"},
		{name: "409 not-replayable is final", answers: []http.HandlerFunc{replyProblem(409, "not-replayable"), ok}, wantStatus: 409, wantAttempts: 1, wantBody: `"code":"not-replayable"`},
		{name: "501 is final", answers: []http.HandlerFunc{reply(501, ""), ok}, wantStatus: 501, wantAttempts: 1},
		{name: "replayed at once", answers: []http.HandlerFunc{reply(200, "old", idemclient.HeaderReplayed, "true")}, wantStatus: 200, wantAttempts: 1, wantReplayed: true, wantBody: "old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, tc.answers...)
			c := newClient(t)
			req := newRequest(t, t.Context(), http.MethodPost, srv.URL+"/v1/payments", `{"amount":100}`)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != tc.wantStatus || resp.Attempts != tc.wantAttempts || resp.Replayed != tc.wantReplayed {
				t.Errorf("Do = %d after %d attempts, replayed %v; want %d after %d, replayed %v",
					resp.StatusCode, resp.Attempts, resp.Replayed, tc.wantStatus, tc.wantAttempts, tc.wantReplayed)
			}
			if !strings.Contains(body, tc.wantBody) {
				t.Errorf("body = %q, want it to contain %q", body, tc.wantBody)
			}
			reqs := srv.seen()
			if len(reqs) != tc.wantAttempts {
				t.Fatalf("server saw %d requests, want %d", len(reqs), tc.wantAttempts)
			}
			m := quotedUUID.FindStringSubmatch(strings.Join(reqs[0].keys, ","))
			if m == nil {
				t.Fatalf("first attempt's key %q is not a quoted UUID", reqs[0].keys)
			}
			if u := uuid.MustParse(m[1]); u.Version() != 4 {
				t.Errorf("key version %d, want 4", u.Version())
			}
			if resp.Key != m[1] {
				t.Errorf("Response.Key = %q, want the key sent, %q", resp.Key, m[1])
			}
			for i, r := range reqs {
				if len(r.keys) != 1 || r.keys[0] != reqs[0].keys[0] || r.body != `{"amount":100}` {
					t.Errorf("attempt %d: keys %q, body %q; want the first attempt's key %q and the same body", i+1, r.keys, r.body, reqs[0].keys[0])
				}
			}
			if got := req.Header.Get(idemclient.HeaderKey); got != "" {
				t.Errorf("Do modified the caller's request: it now has key %q", got)
			}
		})
	}
}

func TestDoProblemBodyReachesCaller(t *testing.T) {
	t.Parallel()
	srv := newServer(t, replyProblem(422, "key-reused"))
	c := newClient(t)
	resp, err := c.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"https://idem.dev/problems/key-reused","title":"key-reused","status":422,"code":"key-reused"}`
	if body := readBody(t, resp); body != want {
		t.Errorf("body = %q, want %q", body, want)
	}
}

func TestDoExhausted(t *testing.T) {
	t.Parallel()
	t.Run("answer", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, replyProblem(409, "key-in-use", "Retry-After", "0"))
		c := newClient(t)
		c.RetryMax = 3
		var waits []int
		c.Backoff = func(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
			waits = append(waits, attempt)
			return idemclient.DefaultBackoff(min, max, attempt, resp)
		}
		resp, err := c.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL, "x"))
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(waits) != "[0 1 2]" {
			t.Errorf("Backoff called with attempts %v, want [0 1 2]", waits)
		}
		body := readBody(t, resp)
		if resp.StatusCode != 409 || resp.Attempts != 4 || len(srv.seen()) != 4 {
			t.Errorf("Do = %d after %d attempts, server saw %d; want the 409 after 4", resp.StatusCode, resp.Attempts, len(srv.seen()))
		}
		if !strings.Contains(body, `"code":"key-in-use"`) {
			t.Errorf("the last answer's body %q did not reach the caller", body)
		}
	})
	t.Run("error", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, hangUp)
		c := newClient(t)
		c.RetryMax = 2
		_, err := c.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL, "x"))
		var e *idemclient.Error
		if !errors.As(err, &e) || !errors.Is(err, idemclient.ErrRetriesExhausted) {
			t.Fatalf("Do error = %v, want an *Error matching ErrRetriesExhausted", err)
		}
		reqs := srv.seen()
		if e.Attempts != 3 || len(reqs) != 3 {
			t.Errorf("gave up after %d attempts, server saw %d; want 3", e.Attempts, len(reqs))
		}
		if `"`+e.Key+`"` != reqs[0].keys[0] {
			t.Errorf("Error.Key = %q, want the key sent, %s", e.Key, reqs[0].keys[0])
		}
		if strings.Contains(err.Error(), e.Key) {
			t.Errorf("error text %q contains the key", err)
		}
	})
	t.Run("max elapsed", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, reply(503, "busy"), reply(201, ""))
		c := newClient(t)
		c.Backoff = func(time.Duration, time.Duration, int, *http.Response) time.Duration { return time.Hour }
		c.MaxElapsed = time.Minute
		start := time.Now()
		resp, err := c.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL, "x"))
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); resp.StatusCode != 503 || resp.Attempts != 1 || body != "busy" {
			t.Errorf("Do = %d %q after %d attempts; want the 503 at once, a wait of an hour being past MaxElapsed", resp.StatusCode, body, resp.Attempts)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("Do took %v", d)
		}
	})
}

func TestDoStopsOnCancel(t *testing.T) {
	t.Parallel()
	t.Run("while waiting", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, reply(503, ""), reply(201, ""))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		c := newClient(t)
		c.MaxElapsed = 0
		c.Backoff = func(time.Duration, time.Duration, int, *http.Response) time.Duration {
			cancel()
			return time.Hour
		}
		req := newRequest(t, ctx, http.MethodPost, srv.URL, "x")
		done := make(chan error, 1)
		go func() {
			_, err := c.Do(req)
			done <- err
		}()
		select {
		case err := <-done:
			var e *idemclient.Error
			if !errors.Is(err, context.Canceled) || !errors.As(err, &e) || e.Attempts != 1 {
				t.Errorf("Do error = %v, want context.Canceled after 1 attempt", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Do kept waiting after the context was canceled")
		}
		if n := len(srv.seen()); n != 1 {
			t.Errorf("server saw %d requests, want 1", n)
		}
	})
	t.Run("during an attempt", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			cancel()
			<-r.Context().Done()
		})
		c := newClient(t)
		_, err := c.Do(newRequest(t, ctx, http.MethodPost, srv.URL, "x"))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Do error = %v, want context.Canceled", err)
		}
		if n := len(srv.seen()); n != 1 {
			t.Errorf("server saw %d requests, want 1", n)
		}
	})
}

func TestDoUnknownOutcome(t *testing.T) {
	t.Parallel()
	for _, disable := range []bool{false, true} {
		t.Run(fmt.Sprintf("disable=%v", disable), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, replyProblem(409, "outcome-unknown", "Retry-After", "30"), replyProblem(503, "store-unavailable"), reply(201, "done"))
			var normal, unknown atomic.Int32
			c := newClient(t)
			c.DisableUnknownOutcomeRetry = disable
			c.Backoff = func(time.Duration, time.Duration, int, *http.Response) time.Duration {
				normal.Add(1)
				return 0
			}
			c.UnknownOutcomeBackoff = func(_, _ time.Duration, _ int, resp *http.Response) time.Duration {
				if resp.Header.Get("Retry-After") != "30" {
					t.Errorf("UnknownOutcomeBackoff got the wrong response")
				}
				unknown.Add(1)
				return 0
			}
			resp, err := c.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL, "x"))
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if disable {
				if resp.StatusCode != 409 || resp.Attempts != 1 || !strings.Contains(body, "outcome-unknown") || unknown.Load()+normal.Load() != 0 {
					t.Errorf("Do = %d %q after %d attempts; want the 409 outcome-unknown at once", resp.StatusCode, body, resp.Attempts)
				}
				return
			}
			if resp.StatusCode != 201 || resp.Attempts != 3 || unknown.Load() != 1 || normal.Load() != 1 {
				t.Errorf("Do = %d after %d attempts, %d unknown-outcome waits and %d others; want 201 after 3, 1 and 1",
					resp.StatusCode, resp.Attempts, unknown.Load(), normal.Load())
			}
		})
	}
}

func TestDoHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	srv := newServer(t, replyProblem(429, "too-many-keys", "Retry-After", "0"), replyProblem(503, "store-unavailable", "Retry-After", past), reply(201, ""))
	c := newClient(t)
	// Computed waits of an hour: only Retry-After can make this call finish.
	c.RetryWaitMin, c.RetryWaitMax = time.Hour, time.Hour
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	resp, err := c.Do(newRequest(t, ctx, http.MethodPost, srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if resp.StatusCode != 201 || resp.Attempts != 3 {
		t.Errorf("Do = %d after %d attempts, want 201 after 3", resp.StatusCode, resp.Attempts)
	}
}

func TestDoUnkeyed(t *testing.T) {
	t.Parallel()
	ok := reply(200, "ok")
	noKeys := []string{}
	for _, tc := range []struct {
		name         string
		method       string
		keyMethods   []string
		answers      []http.HandlerFunc
		wantAttempts int
		wantErr      bool
		wantKey      bool
	}{
		{name: "GET after a cut connection", method: "GET", answers: []http.HandlerFunc{hangUp, ok}, wantAttempts: 2},
		{name: "GET after 503", method: "GET", answers: []http.HandlerFunc{reply(503, ""), ok}, wantAttempts: 2},
		{name: "GET 500 is final", method: "GET", answers: []http.HandlerFunc{reply(500, ""), ok}, wantAttempts: 1},
		{name: "GET 429 is final", method: "GET", answers: []http.HandlerFunc{reply(429, ""), ok}, wantAttempts: 1},
		{name: "GET 409 key-in-use is final", method: "GET", answers: []http.HandlerFunc{replyProblem(409, "key-in-use"), ok}, wantAttempts: 1},
		{name: "PUT is idempotent", method: "PUT", answers: []http.HandlerFunc{reply(503, ""), ok}, wantAttempts: 2},
		{name: "DELETE is idempotent", method: "DELETE", answers: []http.HandlerFunc{hangUp, ok}, wantAttempts: 2},
		{name: "POST without a key is never retried", method: "POST", keyMethods: noKeys, answers: []http.HandlerFunc{hangUp, ok}, wantAttempts: 1, wantErr: true},
		{name: "POST without a key, 503", method: "POST", keyMethods: noKeys, answers: []http.HandlerFunc{reply(503, ""), ok}, wantAttempts: 1},
		{name: "PATCH is keyed", method: "PATCH", answers: []http.HandlerFunc{reply(500, ""), ok}, wantAttempts: 2, wantKey: true},
		{name: "PUT keyed when asked", method: "PUT", keyMethods: []string{"put"}, answers: []http.HandlerFunc{reply(500, ""), ok}, wantAttempts: 2, wantKey: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, tc.answers...)
			c := newClient(t)
			c.KeyMethods = tc.keyMethods
			resp, err := c.Do(newRequest(t, t.Context(), tc.method, srv.URL, "body"))
			if tc.wantErr {
				if err == nil {
					readBody(t, resp)
					t.Fatal("Do succeeded, want an error")
				}
			} else if err != nil {
				t.Fatal(err)
			} else {
				readBody(t, resp)
				if resp.Attempts != tc.wantAttempts {
					t.Errorf("Attempts = %d, want %d", resp.Attempts, tc.wantAttempts)
				}
			}
			reqs := srv.seen()
			if len(reqs) != tc.wantAttempts {
				t.Errorf("server saw %d requests, want %d", len(reqs), tc.wantAttempts)
			}
			for _, r := range reqs {
				if (len(r.keys) > 0) != tc.wantKey || r.body != "body" {
					t.Errorf("server saw keys %q and body %q; want a key: %v, body %q", r.keys, r.body, tc.wantKey, "body")
				}
			}
		})
	}
}

func TestDoKeySources(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		setup   func(c *idemclient.Client, req *http.Request) *http.Request
		wantKey string // the field line sent
		wantRes string // Response.Key
	}{
		{
			name: "WithKey",
			setup: func(c *idemclient.Client, req *http.Request) *http.Request {
				return req.WithContext(idemclient.WithKey(req.Context(), `order-42/"a"\b`))
			},
			wantKey: `"order-42/\"a\"\\b"`, wantRes: `order-42/"a"\b`,
		},
		{
			name: "WithKey, bare",
			setup: func(c *idemclient.Client, req *http.Request) *http.Request {
				c.BareKey = true
				return req.WithContext(idemclient.WithKey(req.Context(), "order-42"))
			},
			wantKey: "order-42", wantRes: "order-42",
		},
		{
			name: "header kept over WithKey",
			setup: func(c *idemclient.Client, req *http.Request) *http.Request {
				req.Header.Set(idemclient.HeaderKey, `"caller-key"`)
				return req.WithContext(idemclient.WithKey(req.Context(), "ignored"))
			},
			wantKey: `"caller-key"`, wantRes: "caller-key",
		},
		{
			name: "bare header kept",
			setup: func(c *idemclient.Client, req *http.Request) *http.Request {
				req.Header.Set(idemclient.HeaderKey, "caller-key")
				return req
			},
			wantKey: "caller-key", wantRes: "caller-key",
		},
		{
			name: "NewKey",
			setup: func(c *idemclient.Client, req *http.Request) *http.Request {
				c.NewKey = func() (string, error) { return "generated", nil }
				return req
			},
			wantKey: `"generated"`, wantRes: "generated",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, reply(503, ""), reply(201, ""))
			c := newClient(t)
			req := tc.setup(c, newRequest(t, t.Context(), http.MethodPost, srv.URL, "x"))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
			if resp.Key != tc.wantRes {
				t.Errorf("Response.Key = %q, want %q", resp.Key, tc.wantRes)
			}
			reqs := srv.seen()
			if len(reqs) != 2 {
				t.Fatalf("server saw %d requests, want 2", len(reqs))
			}
			for _, r := range reqs {
				if len(r.keys) != 1 || r.keys[0] != tc.wantKey {
					t.Errorf("server saw keys %q, want [%s]", r.keys, tc.wantKey)
				}
			}
		})
	}
	t.Run("v7", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, reply(201, ""))
		c := newClient(t)
		c.NewKey = idemclient.NewKeyV7
		resp, err := c.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL, "x"))
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		if u, err := uuid.Parse(resp.Key); err != nil || u.Version() != 7 {
			t.Errorf("key %q is not a version 7 UUID", resp.Key)
		}
	})
	t.Run("a key per logical call", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, reply(201, ""))
		c := newClient(t)
		keys := map[string]bool{}
		for range 5 {
			resp, err := c.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL, "x"))
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
			keys[resp.Key] = true
		}
		if len(keys) != 5 {
			t.Errorf("5 calls used %d keys", len(keys))
		}
	})
	for _, key := range []string{"", "with space", "tab\t", "é", strings.Repeat("k", 256)} {
		t.Run(fmt.Sprintf("invalid %q", key), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, reply(201, ""))
			c := newClient(t)
			ctx := idemclient.WithKey(t.Context(), key)
			_, err := c.Do(newRequest(t, ctx, http.MethodPost, srv.URL, "x"))
			if !errors.Is(err, idemclient.ErrInvalidKey) {
				t.Errorf("Do error = %v, want ErrInvalidKey", err)
			}
			if n := len(srv.seen()); n != 0 {
				t.Errorf("server saw %d requests, want none", n)
			}
		})
	}
	t.Run("bare key with a comma", func(t *testing.T) {
		t.Parallel()
		c := newClient(t)
		c.BareKey = true
		ctx := idemclient.WithKey(t.Context(), "a,b")
		_, err := c.Do(newRequest(t, ctx, http.MethodPost, "http://127.0.0.1:1/", "x"))
		if !errors.Is(err, idemclient.ErrInvalidKey) {
			t.Errorf("Do error = %v, want ErrInvalidKey", err)
		}
	})
}

// onceReader is a body without GetBody: Do must buffer it to send it again.
type onceReader struct {
	r      io.Reader
	closed atomic.Bool
}

func (o *onceReader) Read(p []byte) (int, error) { return o.r.Read(p) }
func (o *onceReader) Close() error               { o.closed.Store(true); return nil }

func TestDoRewindsBody(t *testing.T) {
	t.Parallel()
	payload := strings.Repeat("0123456789", 10000)
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"GetBody", func() io.Reader { return strings.NewReader(payload) }},
		{"buffered", func() io.Reader { return &onceReader{r: strings.NewReader(payload)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, hangUp, reply(500, ""), reply(201, ""))
			c := newClient(t)
			body := tc.body()
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
			reqs := srv.seen()
			if len(reqs) != 3 {
				t.Fatalf("server saw %d requests, want 3", len(reqs))
			}
			for i, r := range reqs {
				if r.body != payload {
					t.Errorf("attempt %d sent %d bytes, want the %d bytes of the body", i+1, len(r.body), len(payload))
				}
			}
			if o, ok := body.(*onceReader); ok && !o.closed.Load() {
				t.Error("the caller's body was not closed")
			}
		})
	}
}

// trackingTransport records every response body and whether it was closed.
type trackingTransport struct {
	base   http.RoundTripper
	mu     sync.Mutex
	bodies []*trackedBody
}

type trackedBody struct {
	io.ReadCloser
	read   atomic.Int64
	closed atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *trackedBody) Close() error { b.closed.Store(true); return b.ReadCloser.Close() }

func (tt *trackingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := tt.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	b := &trackedBody{ReadCloser: resp.Body}
	resp.Body = b
	tt.mu.Lock()
	tt.bodies = append(tt.bodies, b)
	tt.mu.Unlock()
	return resp, nil
}

func TestDoDrainsAbandonedBodies(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 1<<20)
	srv := newServer(t, reply(503, "busy"), reply(502, big), replyProblem(409, "key-in-use"), reply(201, "done"))
	c := newClient(t)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tt := &trackingTransport{base: base}
	c.HTTPClient = &http.Client{Transport: tt}
	resp, err := c.Do(newRequest(t, t.Context(), http.MethodPost, srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if len(tt.bodies) != 4 {
		t.Fatalf("%d responses, want 4", len(tt.bodies))
	}
	for i, b := range tt.bodies[:3] {
		if !b.closed.Load() {
			t.Errorf("abandoned response %d was not closed", i+1)
		}
	}
	if n := tt.bodies[1].read.Load(); n >= int64(len(big)) {
		t.Errorf("read %d bytes of an abandoned 1 MiB body: draining is not bounded", n)
	}
	if tt.bodies[3].closed.Load() {
		t.Error("the final response was closed before the caller read it")
	}
	if body := readBody(t, resp); body != "done" {
		t.Errorf("body = %q", body)
	}
}

func TestDoLogsKeyHashOnly(t *testing.T) {
	t.Parallel()
	srv := newServer(t, replyProblem(409, "key-in-use"), reply(503, ""))
	var buf syncBuffer
	c := newClient(t)
	c.RetryMax = 3
	c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var requests, responses atomic.Int32
	c.RequestLogHook = func(logger *slog.Logger, req *http.Request, attempt int) {
		if n := requests.Add(1); int(n) != attempt {
			t.Errorf("RequestLogHook attempt %d, want %d", attempt, n)
		}
		logger.Info("hook", "attempt", attempt)
	}
	c.ResponseLogHook = func(logger *slog.Logger, resp *http.Response) { responses.Add(1) }
	const key = "secret-key-123"
	resp, err := c.Do(newRequest(t, idemclient.WithKey(t.Context(), key), http.MethodPost, srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	out := buf.String()
	if strings.Contains(out, key) {
		t.Errorf("the log contains the raw key:\n%s", out)
	}
	// idempotency_key_hash is the first 16 hex digits of the key's SHA-256.
	if !strings.Contains(out, "idempotency_key_hash=dc87f94e8f44b501") {
		t.Errorf("the log lacks the key hash:\n%s", out)
	}
	for _, want := range []string{"retrying", "problem_code=key-in-use", "giving up", "status=503", "attempts=4"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if requests.Load() != 4 || responses.Load() != 4 {
		t.Errorf("hooks saw %d requests and %d responses, want 4 and 4", requests.Load(), responses.Load())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestStandardClient(t *testing.T) {
	t.Parallel()
	srv := newServer(t, hangUp, replyProblem(409, "key-in-use"), reply(201, "made", idemclient.HeaderReplayed, "true"))
	c := newClient(t)
	hc := c.StandardClient()
	resp, err := hc.Post(srv.URL, "application/json", strings.NewReader(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(b) != "made" || resp.Header.Get(idemclient.HeaderReplayed) != "true" {
		t.Errorf("Post = %d %q", resp.StatusCode, b)
	}
	reqs := srv.seen()
	if len(reqs) != 3 || len(reqs[0].keys) != 1 || reqs[0].keys[0] != reqs[2].keys[0] || reqs[2].body != `{"a":1}` {
		t.Errorf("server saw %+v; want 3 attempts with one key and the body", reqs)
	}
}
