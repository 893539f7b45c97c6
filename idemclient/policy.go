package idemclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"mime"
	"net/http"
	"regexp"
	"strings"
	"time"
)

// Problem codes (the "code" member of an application/problem+json answer)
// that the retry policy tells apart.
const (
	// CodeKeyInUse says another attempt with the same key is running: retry
	// later.
	CodeKeyInUse = "key-in-use"
	// CodeOutcomeUnknown says an earlier attempt may or may not have had its
	// effect: the server answers again once it has reconciled the call.
	CodeOutcomeUnknown = "outcome-unknown"
	// CodeKeyReused says the key was already used with another request. It
	// is final.
	CodeKeyReused = "key-reused"
	// CodeResponseUntrusted (500) says the request completed but the
	// server's stored answer failed verification: the server never runs it
	// again nor replays it. It is final.
	CodeResponseUntrusted = "response-untrusted"
)

// RetryAfterLimit is the longest wait ParseRetryAfter returns.
const RetryAfterLimit = 24 * time.Hour

// problemLimit bounds the prefix of a problem body read for its code.
const problemLimit = 16 << 10

// CheckRetry decides, after an attempt, whether to send the request again.
// resp is nil when err is not, except when the HTTP client's CheckRedirect
// refused a redirect (resp is then the redirect, its body closed). The policy may read resp.Header and call
// ProblemCode(resp), but must not consume resp.Body otherwise. Returning an
// error stops the retries and makes Do return that error.
type CheckRetry func(ctx context.Context, resp *http.Response, err error) (bool, error)

// Backoff returns how long to wait before the next attempt. attempt is 0
// before the first retry, 1 before the second, and so on; resp is the failed
// attempt's response, nil after a transport error.
type Backoff func(min, max time.Duration, attempt int, resp *http.Response) time.Duration

// DefaultRetryPolicy is the policy for requests sent with an idempotency
// key, which a server running the idem middleware executes at most once. It
// retries connection errors and timeouts, 409 with problem code key-in-use or
// outcome-unknown, 408, 425, 429, and 5xx other than 501, 505 and 500
// response-untrusted. It never retries other 4xx (among them 400 and 422
// key-reused), TLS certificate errors, invalid requests, redirect loops or
// refused redirects, and stops with the context's error once ctx is done.
func DefaultRetryPolicy(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		return resp == nil && retryableError(err), nil
	}
	switch s := resp.StatusCode; {
	case s == http.StatusConflict:
		code := ProblemCode(resp)
		return code == CodeKeyInUse || code == CodeOutcomeUnknown, nil
	case s == http.StatusRequestTimeout, s == http.StatusTooEarly, s == http.StatusTooManyRequests:
		return true, nil
	case s == http.StatusNotImplemented, s == http.StatusHTTPVersionNotSupported:
		return false, nil
	case s >= 500 && s <= 599:
		return s != http.StatusInternalServerError || ProblemCode(resp) != CodeResponseUntrusted, nil
	}
	return false, nil
}

// DefaultUnkeyedRetryPolicy is the policy for requests sent without a key
// whose method is idempotent per RFC 9110 (GET, HEAD, OPTIONS, TRACE, PUT,
// DELETE). It retries only connection errors, timeouts and 503, which say
// the server did not act on the request or may safely be asked again.
func DefaultUnkeyedRetryPolicy(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		return resp == nil && retryableError(err), nil
	}
	return resp.StatusCode == http.StatusServiceUnavailable, nil
}

var (
	// Errors from net/http that sending again cannot fix. They have no
	// types to match, so they are matched by text, as go-retryablehttp does.
	redirectsErrorRe     = regexp.MustCompile(`stopped after \d+ redirects\z`)
	schemeErrorRe        = regexp.MustCompile(`unsupported protocol scheme`)
	invalidHeaderErrorRe = regexp.MustCompile(`invalid header`)
)

// retryableError reports whether a transport error may go away on retry:
// connection errors and timeouts do; certificate errors, unsupported
// schemes, invalid headers, redirect loops and an HTTP server behind an
// https URL do not.
func retryableError(err error) bool {
	if errors.Is(err, http.ErrSchemeMismatch) {
		return false
	}
	var (
		certVerify *tls.CertificateVerificationError
		unknownCA  x509.UnknownAuthorityError
		invalid    x509.CertificateInvalidError
		hostname   x509.HostnameError
	)
	if errors.As(err, &certVerify) || errors.As(err, &unknownCA) ||
		errors.As(err, &invalid) || errors.As(err, &hostname) {
		return false
	}
	msg := err.Error()
	if redirectsErrorRe.MatchString(msg) || schemeErrorRe.MatchString(msg) || invalidHeaderErrorRe.MatchString(msg) {
		return false
	}
	return true
}

// DefaultBackoff waits as long as the response's Retry-After says when it
// has one, and otherwise a duration drawn uniformly from
// [0, min(max, min·2^attempt)] (exponential backoff with full jitter).
func DefaultBackoff(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
	if d, ok := retryAfter(resp); ok {
		return d
	}
	return jitter(ceiling(min, max, attempt))
}

// DefaultUnknownOutcomeBackoff is the backoff after 409 outcome-unknown,
// which resolves only when the server reconciles the call: Retry-After when
// the response has one (but at least min), otherwise a duration drawn from
// the upper half of [0, min(4·max, 4·min·2^attempt)].
func DefaultUnknownOutcomeBackoff(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
	if d, ok := retryAfter(resp); ok {
		return maxDuration(d, min)
	}
	c := ceiling(mul4(min), mul4(max), attempt)
	return c/2 + jitter(c-c/2)
}

func retryAfter(resp *http.Response) (time.Duration, bool) {
	if resp == nil {
		return 0, false
	}
	return ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
}

// ceiling is min·2^attempt capped at max, without overflow.
func ceiling(min, max time.Duration, attempt int) time.Duration {
	if min < 0 {
		min = 0
	}
	if max < min {
		max = min
	}
	c := min
	for i := 0; i < attempt && c < max; i++ {
		if c > max/2 {
			return max
		}
		c *= 2
	}
	return minDuration(c, max)
}

// jitter returns a duration drawn uniformly from [0, d].
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if d == math.MaxInt64 {
		return rand.N(d)
	}
	return rand.N(d + 1)
}

func mul4(d time.Duration) time.Duration {
	if d > math.MaxInt64/4 {
		return math.MaxInt64
	}
	return 4 * d
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

func maxDuration(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

// ParseRetryAfter parses a Retry-After field value, delta-seconds or an
// HTTP-date (RFC 9110 section 10.2.3), into a wait from now. A date in the
// past is a zero wait; waits are capped at RetryAfterLimit. It reports false
// for an empty or malformed value.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		const limit = int64(RetryAfterLimit / time.Second)
		var secs int64
		for i := 0; i < len(v); i++ {
			secs = secs*10 + int64(v[i]-'0')
			if secs >= limit {
				return RetryAfterLimit, true
			}
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now)
	switch {
	case d < 0:
		return 0, true
	case d > RetryAfterLimit:
		return RetryAfterLimit, true
	}
	return d, true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ProblemCode returns the "code" member of an application/problem+json
// response body, or "" when the response is not problem+json or has no code.
// It reads at most a 16 KiB prefix of the body and puts it back, so the body
// still reads in full afterwards; calling it again does not read again.
func ProblemCode(resp *http.Response) string {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		return ""
	}
	if p, ok := resp.Body.(*peekedBody); ok {
		return p.code
	}
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" {
		return ""
	}
	prefix, readErr := io.ReadAll(io.LimitReader(resp.Body, problemLimit))
	p := &peekedBody{closer: resp.Body}
	if readErr != nil {
		p.r = io.MultiReader(bytes.NewReader(prefix), errReader{readErr})
	} else {
		p.r = io.MultiReader(bytes.NewReader(prefix), resp.Body)
	}
	var problem struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(prefix, &problem) == nil {
		p.code = problem.Code
	}
	resp.Body = p
	return p.code
}

// peekedBody is a response body whose prefix was read for its problem code
// and is read again before the rest.
type peekedBody struct {
	r      io.Reader
	closer io.Closer
	code   string
}

func (p *peekedBody) Read(b []byte) (int, error) { return p.r.Read(b) }
func (p *peekedBody) Close() error               { return p.closer.Close() }

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
