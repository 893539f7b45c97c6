package idemclient_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemclient"
)

// answer builds a response as the retry policy sees it.
func answer(status int, contentType, body string, header ...string) *http.Response {
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body))}
}

func problem(status int, code string) *http.Response {
	body := fmt.Sprintf(`{"type":"https://idem.dev/problems/%s","title":"t","status":%d,"code":%q}`, code, status, code)
	return answer(status, "application/problem+json", body)
}

func urlError(err error) error {
	return &url.Error{Op: "Post", URL: "http://127.0.0.1/x", Err: err}
}

var policyCases = []struct {
	name           string
	resp           *http.Response
	err            error
	keyed, unkeyed bool // expected decisions of the two default policies
}{
	{name: "200", resp: answer(200, "", "ok")},
	{name: "201", resp: answer(201, "application/json", "{}")},
	{name: "202 async in progress", resp: answer(202, "", "", "Retry-After", "1")},
	{name: "304", resp: answer(304, "", "")},
	{name: "400", resp: problem(400, "key-invalid")},
	{name: "401", resp: answer(401, "", "")},
	{name: "403", resp: answer(403, "", "")},
	{name: "404", resp: answer(404, "", "")},
	{name: "408", resp: answer(408, "", ""), keyed: true},
	{name: "409 key-in-use", resp: problem(409, "key-in-use"), keyed: true},
	{name: "409 outcome-unknown", resp: problem(409, "outcome-unknown"), keyed: true},
	{name: "409 not-replayable", resp: problem(409, "not-replayable")},
	{name: "409 conflict", resp: problem(409, "conflict")},
	{name: "409 key-in-use as plain json", resp: answer(409, "application/json", `{"code":"key-in-use"}`)},
	{name: "409 without body", resp: answer(409, "application/problem+json", "")},
	{name: "409 broken json", resp: answer(409, "application/problem+json", `{"code":"key-in-use"`)},
	{name: "409 problem with charset", resp: answer(409, "application/problem+json; charset=utf-8", `{"code":"key-in-use"}`), keyed: true},
	{name: "413", resp: problem(413, "body-too-large")},
	{name: "422 key-reused", resp: problem(422, "key-reused")},
	{name: "425", resp: answer(425, "", ""), keyed: true},
	{name: "429", resp: problem(429, "too-many-keys"), keyed: true},
	{name: "500", resp: answer(500, "", ""), keyed: true},
	{name: "500 response-untrusted", resp: problem(500, "response-untrusted")},
	{name: "501", resp: answer(501, "", "")},
	{name: "502", resp: answer(502, "", ""), keyed: true},
	{name: "503", resp: problem(503, "store-unavailable"), keyed: true, unkeyed: true},
	{name: "504", resp: answer(504, "", ""), keyed: true},
	{name: "505", resp: answer(505, "", "")},
	{name: "connection refused", err: urlError(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), keyed: true, unkeyed: true},
	{name: "connection reset", err: urlError(syscall.ECONNRESET), keyed: true, unkeyed: true},
	{name: "eof", err: urlError(io.EOF), keyed: true, unkeyed: true},
	{name: "client timeout", err: urlError(context.DeadlineExceeded), keyed: true, unkeyed: true},
	{name: "unknown authority", err: urlError(x509.UnknownAuthorityError{})},
	{name: "redirect loop", err: urlError(errors.New("stopped after 10 redirects"))},
	{name: "bad scheme", err: urlError(errors.New(`unsupported protocol scheme "ftp"`))},
	{name: "invalid header", err: urlError(errors.New(`net/http: invalid header field name "a b"`))},
	{name: "http server behind https", err: urlError(http.ErrSchemeMismatch)},
	{name: "refused redirect", resp: answer(302, "", "", "Location", "/elsewhere"), err: urlError(errors.New("no redirects, please"))},
}

func TestDefaultRetryPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range policyCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range []struct {
				name   string
				policy idemclient.CheckRetry
				want   bool
			}{
				{"DefaultRetryPolicy", idemclient.DefaultRetryPolicy, tc.keyed},
				{"DefaultUnkeyedRetryPolicy", idemclient.DefaultUnkeyedRetryPolicy, tc.unkeyed},
			} {
				var resp *http.Response
				var want string
				if tc.resp != nil {
					// A fresh copy per policy: the policy may peek at the body.
					b, _ := io.ReadAll(tc.resp.Body)
					tc.resp.Body = io.NopCloser(strings.NewReader(string(b)))
					resp = &http.Response{StatusCode: tc.resp.StatusCode, Header: tc.resp.Header, Body: io.NopCloser(strings.NewReader(string(b)))}
					want = string(b)
				}
				got, err := p.policy(t.Context(), resp, tc.err)
				if err != nil || got != p.want {
					t.Errorf("%s = %v, %v; want %v, nil", p.name, got, err, p.want)
				}
				if resp != nil {
					if b, _ := io.ReadAll(resp.Body); string(b) != want {
						t.Errorf("%s: body after the policy = %q, want %q", p.name, b, want)
					}
				}
			}
		})
	}
}

func TestRetryPolicyStopsOnContextDone(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for _, policy := range []idemclient.CheckRetry{idemclient.DefaultRetryPolicy, idemclient.DefaultUnkeyedRetryPolicy} {
		retry, err := policy(ctx, nil, urlError(context.Canceled))
		if retry || !errors.Is(err, context.Canceled) {
			t.Errorf("policy after cancel = %v, %v; want false, context.Canceled", retry, err)
		}
	}
}

func TestProblemCode(t *testing.T) {
	t.Parallel()
	long := `{"code":"key-in-use","detail":"` + strings.Repeat("x", 20<<10) + `"}`
	for _, tc := range []struct {
		name, contentType, body, want string
	}{
		{"problem", "application/problem+json", `{"status":409,"code":"key-in-use"}`, "key-in-use"},
		{"parameters", "Application/Problem+JSON; charset=utf-8", `{"code":"outcome-unknown"}`, "outcome-unknown"},
		{"plain json", "application/json", `{"code":"key-in-use"}`, ""},
		{"no content type", "", `{"code":"key-in-use"}`, ""},
		{"no code", "application/problem+json", `{"title":"x"}`, ""},
		{"code not a string", "application/problem+json", `{"code":7}`, ""},
		{"not json", "application/problem+json", `key-in-use`, ""},
		{"empty", "application/problem+json", ``, ""},
		{"longer than the prefix", "application/problem+json", long, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := answer(409, tc.contentType, tc.body)
			if got := idemclient.ProblemCode(resp); got != tc.want {
				t.Errorf("ProblemCode = %q, want %q", got, tc.want)
			}
			if got := idemclient.ProblemCode(resp); got != tc.want {
				t.Errorf("second ProblemCode = %q, want %q", got, tc.want)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil || string(b) != tc.body {
				t.Errorf("body after ProblemCode = %d bytes, %v; want the %d bytes sent", len(b), err, len(tc.body))
			}
			if err := resp.Body.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	if got := idemclient.ProblemCode(nil); got != "" {
		t.Errorf("ProblemCode(nil) = %q", got)
	}
}

var now = time.Date(2025, 11, 25, 12, 0, 0, 0, time.UTC)

var retryAfterCases = []struct {
	in     string
	want   time.Duration
	wantOK bool
}{
	{"", 0, false},
	{" ", 0, false},
	{"0", 0, true},
	{"5", 5 * time.Second, true},
	{" 5\t", 5 * time.Second, true},
	{"0005", 5 * time.Second, true},
	{"120", 2 * time.Minute, true},
	{"86399", 86399 * time.Second, true},
	{"86400", idemclient.RetryAfterLimit, true},
	{"99999999999999999999999999", idemclient.RetryAfterLimit, true},
	{"-1", 0, false},
	{"+5", 0, false},
	{"1.5", 0, false},
	{"5s", 0, false},
	{"1 2", 0, false},
	{"abc", 0, false},
	{"Tue, 25 Nov 2025 12:00:30 GMT", 30 * time.Second, true},           // IMF-fixdate
	{"Tuesday, 25-Nov-25 12:01:00 GMT", time.Minute, true},              // RFC 850
	{"Tue Nov 25 12:00:10 2025", 10 * time.Second, true},                // asctime
	{"Tue, 25 Nov 2025 11:00:00 GMT", 0, true},                          // past
	{"Mon, 01 Jan 1900 00:00:00 GMT", 0, true},                          // long past
	{"Fri, 31 Dec 9999 23:59:59 GMT", idemclient.RetryAfterLimit, true}, // far future
	{"Tue, 25 Nov 2025 12:00:30", 0, false},
	{"Tue, 32 Nov 2025 12:00:30 GMT", 0, false},
	{"2025-11-25T12:00:30Z", 0, false},
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range retryAfterCases {
		got, ok := idemclient.ParseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.wantOK)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, tc := range retryAfterCases {
		f.Add(tc.in, now.Unix())
	}
	f.Fuzz(func(t *testing.T, in string, unix int64) {
		d, ok := idemclient.ParseRetryAfter(in, time.Unix(unix, 0))
		if d < 0 || d > idemclient.RetryAfterLimit {
			t.Fatalf("ParseRetryAfter(%q) = %v, out of [0, %v]", in, d, idemclient.RetryAfterLimit)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, false; want 0 when not ok", in, d)
		}
	})
}

func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	const min, max = 10 * time.Millisecond, 300 * time.Millisecond
	for attempt := range 12 {
		ceiling := min << attempt
		if ceiling > max {
			ceiling = max
		}
		var top time.Duration
		for range 200 {
			d := idemclient.DefaultBackoff(min, max, attempt, nil)
			if d < 0 || d > ceiling {
				t.Fatalf("DefaultBackoff(attempt %d) = %v, out of [0, %v]", attempt, d, ceiling)
			}
			top = maxOf(top, d)
		}
		if top < ceiling/2 {
			t.Errorf("DefaultBackoff(attempt %d) never above %v in 200 draws: no jitter up to %v", attempt, top, ceiling)
		}
	}
	if d := idemclient.DefaultBackoff(min, math.MaxInt64, 200, nil); d < 0 {
		t.Errorf("DefaultBackoff at a huge attempt = %v", d)
	}
	if d := idemclient.DefaultBackoff(0, 0, 3, nil); d != 0 {
		t.Errorf("DefaultBackoff(0, 0) = %v, want 0", d)
	}
	// Retry-After wins over the computed wait, in both directions.
	for _, tc := range []struct {
		header string
		want   time.Duration
	}{{"0", 0}, {"3", 3 * time.Second}} {
		resp := answer(429, "", "", "Retry-After", tc.header)
		if d := idemclient.DefaultBackoff(time.Second, time.Minute, 2, resp); d != tc.want {
			t.Errorf("DefaultBackoff with Retry-After %s = %v, want %v", tc.header, d, tc.want)
		}
	}
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	if d := idemclient.DefaultBackoff(0, time.Millisecond, 0, answer(503, "", "", "Retry-After", date)); d < 80*time.Second || d > 90*time.Second {
		t.Errorf("DefaultBackoff with an HTTP-date 90 s ahead = %v", d)
	}
	if d := idemclient.DefaultBackoff(0, time.Millisecond, 0, answer(503, "", "", "Retry-After", "soon")); d > time.Millisecond {
		t.Errorf("DefaultBackoff with a malformed Retry-After = %v, want the computed wait", d)
	}
}

func TestDefaultUnknownOutcomeBackoff(t *testing.T) {
	t.Parallel()
	const min, max = 10 * time.Millisecond, 300 * time.Millisecond
	for attempt := range 10 {
		ceiling := 4 * min << attempt
		if ceiling > 4*max {
			ceiling = 4 * max
		}
		for range 100 {
			d := idemclient.DefaultUnknownOutcomeBackoff(min, max, attempt, nil)
			if d < ceiling/2 || d > ceiling {
				t.Fatalf("DefaultUnknownOutcomeBackoff(attempt %d) = %v, out of [%v, %v]", attempt, d, ceiling/2, ceiling)
			}
		}
	}
	resp := answer(409, "", "", "Retry-After", "0")
	if d := idemclient.DefaultUnknownOutcomeBackoff(min, max, 0, resp); d != min {
		t.Errorf("DefaultUnknownOutcomeBackoff with Retry-After 0 = %v, want at least min %v", d, min)
	}
	resp = answer(409, "", "", "Retry-After", "7")
	if d := idemclient.DefaultUnknownOutcomeBackoff(min, max, 0, resp); d != 7*time.Second {
		t.Errorf("DefaultUnknownOutcomeBackoff with Retry-After 7 = %v, want 7s", d)
	}
}

func maxOf(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}
