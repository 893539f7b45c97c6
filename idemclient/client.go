package idemclient

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Defaults set by NewClient.
const (
	defaultRetryWaitMin = 250 * time.Millisecond
	defaultRetryWaitMax = 30 * time.Second
	defaultRetryMax     = 6
	defaultMaxElapsed   = 2 * time.Minute
	defaultTimeout      = 30 * time.Second
)

// drainLimit bounds how much of an abandoned response body is read so its
// connection can be reused; a longer body is closed unread, which closes the
// connection instead.
const drainLimit = 64 << 10

// Client is a retrying HTTP client that sends an Idempotency-Key with
// state-changing requests. Make one with NewClient and adjust its fields
// before the first call; a Client is safe for concurrent use afterwards.
// Nil function fields mean the documented defaults; other zero values are
// taken literally (RetryMax 0 makes one attempt, zero waits do not wait).
type Client struct {
	// HTTPClient sends each attempt. Its Timeout, if any, bounds each
	// attempt, not the whole call. When nil, http.DefaultClient is used.
	// NewClient sets a client with its own transport and a 30 second
	// timeout.
	HTTPClient *http.Client

	// Logger receives a debug record per retry and a warning when Do gives
	// up. Keys appear only as a short hash (attribute idempotency_key_hash:
	// the first 16 hex digits of the SHA-256 of the header value, the hash
	// under which a downstream's logs name the same key). Defaults to
	// slog.Default().
	Logger *slog.Logger
	// RequestLogHook, if set, is called before each attempt (attempt counts
	// from 1). The request carries the raw key in its Idempotency-Key
	// header: a hook that logs headers must leave that one out.
	RequestLogHook func(logger *slog.Logger, req *http.Request, attempt int)
	// ResponseLogHook, if set, is called with each attempt's response. It
	// must not consume the body.
	ResponseLogHook func(logger *slog.Logger, resp *http.Response)

	// RetryWaitMin and RetryWaitMax bound the waits computed by Backoff.
	// NewClient sets 250 ms and 30 s.
	RetryWaitMin, RetryWaitMax time.Duration
	// RetryMax is the most attempts after the first. NewClient sets 6.
	RetryMax int
	// MaxElapsed bounds the whole call: no wait that would end past it is
	// started, and the last answer is returned instead. Zero means no bound.
	// NewClient sets 2 minutes.
	MaxElapsed time.Duration

	// CheckRetry is the retry policy for requests sent with a key. Defaults
	// to DefaultRetryPolicy.
	CheckRetry CheckRetry
	// CheckRetryUnkeyed is the retry policy for requests sent without a key
	// whose method is idempotent per RFC 9110. Requests that have neither a
	// key nor an idempotent method are never retried. Defaults to
	// DefaultUnkeyedRetryPolicy.
	CheckRetryUnkeyed CheckRetry
	// Backoff computes the wait before a retry. Defaults to DefaultBackoff.
	Backoff Backoff
	// UnknownOutcomeBackoff computes the wait before retrying a 409
	// outcome-unknown. Defaults to DefaultUnknownOutcomeBackoff.
	UnknownOutcomeBackoff Backoff
	// DisableUnknownOutcomeRetry returns a 409 outcome-unknown to the
	// caller at once instead of waiting for the server to reconcile it.
	DisableUnknownOutcomeRetry bool

	// KeyMethods are the methods that get a key. Nil means POST and PATCH;
	// an empty, non-nil slice sends no keys (a request that carries an
	// Idempotency-Key header keeps it in any case).
	KeyMethods []string
	// NewKey makes the key of a logical call that has none from WithKey.
	// Defaults to NewKeyV4.
	NewKey func() (string, error)
	// BareKey sends the key as is, as Stripe and most payment APIs expect.
	// By default the key is sent as an RFC 8941 sf-string ("…"), as
	// draft-ietf-httpapi-idempotency-key-header specifies; the idem
	// middleware accepts both.
	BareKey bool
}

// NewClient returns a Client with the defaults: a fresh transport and a 30
// second timeout per attempt, waits of 250 ms to 30 s, 6 retries, 2 minutes
// in all.
func NewClient() *Client {
	return &Client{
		HTTPClient: &http.Client{
			Transport: http.DefaultTransport.(*http.Transport).Clone(),
			Timeout:   defaultTimeout,
		},
		RetryWaitMin: defaultRetryWaitMin,
		RetryWaitMax: defaultRetryWaitMax,
		RetryMax:     defaultRetryMax,
		MaxElapsed:   defaultMaxElapsed,
	}
}

// Response is the answer to a logical call.
type Response struct {
	*http.Response
	// Replayed reports that the server answered with the stored response of
	// an earlier execution (Idempotent-Replayed: true).
	Replayed bool
	// Attempts is how many times Do sent the request. (net/http may itself
	// send a keyed request again, once, when a reused connection closes
	// before any answer; that is not counted.)
	Attempts int
	// Key is the idempotency key sent on every attempt, empty if none was.
	Key string
}

// Do sends req, retrying as the policies allow, and returns the final
// answer. It does not modify req. For a keyed request, every attempt carries
// the same Idempotency-Key: the key from req's header if it has one, else
// the one from WithKey on req's context, else a new one. The body is sent
// again from req.GetBody, or, when that is nil, from a copy read into memory
// before the first attempt.
//
// As with http.Client, a non-2xx answer is not an error: when the retries
// run out on a 409, 429 or 5xx, that answer is returned with its body
// intact. Do returns an *Error when it has no answer: a transport error that
// was final or the last one, the context's error, an error from the policy.
// Do returns at once when req's context is done.
func (c *Client) Do(req *http.Request) (*Response, error) {
	ctx := req.Context()
	start := time.Now()
	logger := c.logger()

	key, header, keyed, err := c.requestKey(req)
	if err != nil {
		closeBody(req)
		return nil, c.fail(req, "", 0, false, err)
	}
	retryable := keyed || idempotentMethod(req.Method)
	policy := c.CheckRetryUnkeyed
	if policy == nil {
		policy = DefaultUnkeyedRetryPolicy
	}
	if keyed {
		policy = c.CheckRetry
		if policy == nil {
			policy = DefaultRetryPolicy
		}
	}
	body, err := newBodySource(req, retryable)
	if err != nil {
		return nil, c.fail(req, key, 0, false, err)
	}

	attrs := []slog.Attr{slog.String("method", req.Method), slog.String("url", req.URL.Redacted())}
	if key != "" {
		attrs = append(attrs, slog.String("idempotency_key_hash", keyHash(key)))
	}

	for attempt := 1; ; attempt++ {
		r, err := body.request(req, attempt)
		if err != nil {
			return nil, c.fail(req, key, attempt-1, false, err)
		}
		if header != "" {
			r.Header.Set(HeaderKey, header)
		}
		if c.RequestLogHook != nil {
			c.RequestLogHook(logger, r, attempt)
		}
		resp, doErr := c.httpClient().Do(r)
		if resp != nil && c.ResponseLogHook != nil {
			c.ResponseLogHook(logger, resp)
		}
		if !retryable {
			if doErr != nil {
				return nil, c.fail(req, key, attempt, false, doErr)
			}
			return newResponse(resp, key, attempt), nil
		}

		retry, checkErr := policy(ctx, resp, doErr)
		unknown := resp != nil && resp.StatusCode == http.StatusConflict && ProblemCode(resp) == CodeOutcomeUnknown
		if retry && unknown && c.DisableUnknownOutcomeRetry {
			retry = false
		}
		if checkErr != nil {
			drain(resp)
			return nil, c.fail(req, key, attempt, false, checkErr)
		}
		if !retry {
			if doErr != nil {
				return nil, c.fail(req, key, attempt, false, doErr)
			}
			return newResponse(resp, key, attempt), nil
		}

		logAttrs := append(outcomeAttrs(resp, doErr), attrs...)
		giveUp := attempt > c.RetryMax
		var wait time.Duration
		if !giveUp {
			backoff := c.Backoff
			if backoff == nil {
				backoff = DefaultBackoff
			}
			if unknown {
				backoff = c.UnknownOutcomeBackoff
				if backoff == nil {
					backoff = DefaultUnknownOutcomeBackoff
				}
			}
			wait = max(backoff(c.RetryWaitMin, c.RetryWaitMax, attempt-1, resp), 0)
			giveUp = c.MaxElapsed > 0 && time.Since(start)+wait > c.MaxElapsed
		}
		if giveUp {
			logger.LogAttrs(ctx, slog.LevelWarn, "idemclient: giving up",
				append(logAttrs, slog.Int("attempts", attempt))...)
			if doErr != nil {
				return nil, c.fail(req, key, attempt, true, doErr)
			}
			return newResponse(resp, key, attempt), nil
		}
		logger.LogAttrs(ctx, slog.LevelDebug, "idemclient: retrying",
			append(logAttrs, slog.Int("attempt", attempt), slog.Duration("wait", wait))...)
		drain(resp)
		if err := sleep(ctx, wait); err != nil {
			return nil, c.fail(req, key, attempt, false, err)
		}
	}
}

// StandardClient returns an *http.Client whose transport is c, for code
// that takes a standard client. The Response extras (Replayed, Attempts,
// Key) are not available through it.
func (c *Client) StandardClient() *http.Client {
	return &http.Client{Transport: &RoundTripper{Client: c}}
}

// RoundTripper is an http.RoundTripper that sends each request through
// Client.Do.
type RoundTripper struct {
	// Client sends the requests. It must not be nil.
	Client *Client
}

// RoundTrip implements http.RoundTripper.
func (rt *RoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.Client.Do(req)
	if err != nil {
		return nil, err
	}
	return resp.Response, nil
}

func (c *Client) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

func (c *Client) httpClient() *http.Client {
	if c.HTTPClient != nil {
		return c.HTTPClient
	}
	return http.DefaultClient
}

func (c *Client) fail(req *http.Request, key string, attempts int, exhausted bool, err error) error {
	return &Error{
		Method:    req.Method,
		URL:       req.URL.Redacted(),
		Key:       key,
		Attempts:  attempts,
		Exhausted: exhausted,
		Err:       err,
	}
}

// requestKey decides the key of a request: the header it carries, else a
// key for a KeyMethods request from the context or NewKey. header is the
// value to set, empty when the request keeps its own.
func (c *Client) requestKey(req *http.Request) (key, header string, keyed bool, err error) {
	if vs := req.Header.Values(HeaderKey); len(vs) > 0 {
		return unquoteKey(vs[0]), "", true, nil
	}
	if !c.keyMethod(req.Method) {
		return "", "", false, nil
	}
	key, ok := KeyFromContext(req.Context())
	if !ok {
		newKey := c.NewKey
		if newKey == nil {
			newKey = NewKeyV4
		}
		if key, err = newKey(); err != nil {
			return "", "", false, err
		}
	}
	if !validKey(key, c.BareKey) {
		return "", "", false, ErrInvalidKey
	}
	if c.BareKey {
		return key, key, true, nil
	}
	return key, quoteKey(key), true, nil
}

func (c *Client) keyMethod(method string) bool {
	if c.KeyMethods == nil {
		return method == http.MethodPost || method == http.MethodPatch
	}
	for _, m := range c.KeyMethods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// idempotentMethod reports whether method is idempotent per RFC 9110
// section 9.2.2.
func idempotentMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace,
		http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// bodySource gives each attempt the request body from the start.
type bodySource struct {
	getBody func() (io.ReadCloser, error)
	// buffered reports that getBody serves a copy Do read into memory, to
	// be used for the first attempt too.
	buffered bool
	length   int64
}

func newBodySource(req *http.Request, retryable bool) (*bodySource, error) {
	if req.Body == nil || req.Body == http.NoBody || !retryable {
		return &bodySource{}, nil
	}
	if req.GetBody != nil {
		return &bodySource{getBody: req.GetBody, length: req.ContentLength}, nil
	}
	data, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading request body: %w", err)
	}
	return &bodySource{
		getBody: func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		},
		buffered: true,
		length:   int64(len(data)),
	}, nil
}

// request returns the request for one attempt: a clone of req with its
// body rewound.
func (b *bodySource) request(req *http.Request, attempt int) (*http.Request, error) {
	r := req.Clone(req.Context())
	if b.getBody == nil || (attempt == 1 && !b.buffered) {
		return r, nil
	}
	body, err := b.getBody()
	if err != nil {
		return nil, fmt.Errorf("rewinding request body: %w", err)
	}
	r.Body = body
	r.GetBody = b.getBody
	r.ContentLength = b.length
	return r, nil
}

func newResponse(resp *http.Response, key string, attempts int) *Response {
	return &Response{
		Response: resp,
		Replayed: replayed(resp.Header),
		Attempts: attempts,
		Key:      key,
	}
}

func replayed(h http.Header) bool {
	v := strings.TrimSpace(h.Get(HeaderReplayed))
	return strings.EqualFold(v, "true") || v == "?1"
}

// drain reads a bounded part of an abandoned response body and closes it,
// so the connection can be reused and nothing leaks.
func drain(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
	resp.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func outcomeAttrs(resp *http.Response, err error) []slog.Attr {
	if err != nil {
		return []slog.Attr{slog.String("error", err.Error())}
	}
	attrs := []slog.Attr{slog.Int("status", resp.StatusCode)}
	if code := ProblemCode(resp); code != "" {
		attrs = append(attrs, slog.String("problem_code", code))
	}
	return attrs
}
