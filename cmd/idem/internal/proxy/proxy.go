// Package proxy is the handler behind `idem proxy`: a reverse proxy that
// forwards every request faithfully to one upstream and copies the answer
// back.
//
// The upstream call is the handler the idem middleware protects, so it runs
// to completion even when the client hangs up: the outbound request uses a
// context detached from the client's, bounded by Config.Timeout. Nothing is
// retried here; retries are the client's, made safe by the middleware.
//
// A protected request carries its attempt's fencing token to the upstream
// in the Idempotency-Attempt header (idem.HeaderAttempt; a client's own is
// never forwarded), and is never written to the upstream once its lease is
// gone (see lease.go): the proxy answers 503 lease-lost and drops the
// record, if it is still the attempt's, since nothing happened.
//
// An upstream that cannot be reached answers 502 (the key is released: the
// request never left). An exchange that fails after the request may have
// reached the upstream (a timeout answers 504, a connection broken mid-way
// 502) marks the key's outcome unknown with idem.MarkUnknown, since the
// upstream may have acted; so does an upstream body cut off mid-way, through
// the http.ErrAbortHandler that ReverseProxy raises. The same abort after a
// client went away while the answer streamed to it is a hang-up: the
// upstream answered, and the middleware records that answer (not replayable
// when it streamed).
package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/deadline"
	"github.com/idem-dev/idem/internal/redact"
)

// Default settings of Config.
const (
	DefaultTimeout         = 60 * time.Second
	DefaultProblemTypeBase = idem.DefaultProblemBaseURI
)

// Problem codes of the answers the proxy makes itself.
const (
	// CodeUpstreamUnavailable answers 502 when the upstream could not be
	// reached or broke the exchange.
	CodeUpstreamUnavailable = "upstream-unavailable"
	// CodeUpstreamTimeout answers 504 when the upstream did not answer within
	// Config.Timeout.
	CodeUpstreamTimeout = "upstream-timeout"
	// CodeLeaseLost answers 503 when the attempt lost its lease on the key
	// before or while the request went to the upstream (a pause of the
	// process, the store out of reach): a retry gets the outcome.
	CodeLeaseLost = "lease-lost"
)

// Config configures the proxy. A nil *Config means all defaults.
type Config struct {
	// Timeout bounds each upstream exchange, from sending the request to the
	// end of the response body. Defaults to DefaultTimeout.
	Timeout time.Duration
	// Transport sends the upstream requests. Defaults to a clone of
	// http.DefaultTransport that keeps more idle connections per host and
	// checks the lease of a protected request before every write of it to
	// an HTTP/1 connection. With another transport the lease is checked
	// when the request gets its connection.
	Transport http.RoundTripper
	// ProblemTypeBase prefixes the problem code to form the problem+json
	// "type" URI. Defaults to DefaultProblemTypeBase.
	ProblemTypeBase string
	// StripeErrors words the proxy's own answers (502, 503, 504) as Stripe's API
	// does, {"error":{"type":"api_error",...}}, as the middleware does under
	// idem.ProfileStripe. Defaults to problem+json.
	StripeErrors bool
	// Logger receives upstream failures. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults() Config {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256
		t.MaxIdleConns = 1024
		// http.DefaultTransport's dialer.
		t.DialContext = gatedDialer((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
		cfg.Transport = t
	}
	if cfg.ProblemTypeBase == "" {
		cfg.ProblemTypeBase = DefaultProblemTypeBase
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Handler forwards requests to the upstream. Create it with New.
type Handler struct {
	cfg      Config
	upstream *url.URL
	rp       *httputil.ReverseProxy
}

// New returns a handler that forwards every request to upstream, an absolute
// http or https URL whose path, if any, prefixes the request's path and whose
// query, if any, is joined to the request's query.
func New(upstream *url.URL, cfg *Config) *Handler {
	h := &Handler{cfg: cfg.withDefaults(), upstream: upstream}
	h.rp = &httputil.ReverseProxy{
		Rewrite:      h.rewrite,
		Transport:    h.cfg.Transport,
		ErrorHandler: h.fail,
		BufferPool:   copyBuffers,
	}
	return h
}

// ServeHTTP forwards r to the upstream and copies the answer to w. The
// upstream request does not end when the client hangs up; it ends with the
// upstream's answer or after Config.Timeout.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The detached context keeps the request's values (the middleware's
	// state) and drops its cancellation. Its deadline also keeps
	// ReverseProxy from watching CloseNotify, which would cancel on hang-up.
	// It expires on the process's shared alarm list rather than on a
	// runtime timer of its own: one allocation, no timer per request.
	if _, protected := idem.FencingTokenFromContext(r.Context()); !protected {
		ctx, release := deadline.WithTimeout(deadline.Wall, r.Context(), h.cfg.Timeout)
		defer release()
		h.rp.ServeHTTP(flushGate{w}, r.WithContext(ctx))
		return
	}
	// A protected request: the same, but the exchange ends when the
	// middleware gives the lease up, and is sent under its lease.
	s, ctx := newSending(r.Context(), deadline.Wall, h.cfg.Timeout)
	defer s.ctx.Disarm()
	defer s.disarm()
	idem.AfterLeaseLost(r.Context(), s.leaseLost)
	h.rp.ServeHTTP(flushGate{w}, r.WithContext(ctx))
}

// CloseIdleConnections closes the idle upstream connections, when the
// transport can.
func (h *Handler) CloseIdleConnections() {
	if t, ok := h.cfg.Transport.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
}

// rewrite builds the outbound request. ReverseProxy has already removed the
// hop-by-hop headers (RFC 9110 §7.6.1, and those the Connection header
// names) and the client's forwarding headers.
func (h *Handler) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(h.upstream)
	// ReverseProxy wraps every outbound body in a reader whose Close does
	// nothing, which net/http does not know to be in memory, so the
	// transport would flush the headers before it copies the body: two
	// writes to the upstream. A body that is an io.NopCloser already (the
	// idem middleware hands a protected request's body over as one, over
	// the bytes it read) needs no wrapper, and net/http sends an in-memory
	// one with the headers in one write. Nothing else changes: the body's
	// bytes, its length, and that the transport never retries it.
	if pr.Out.Body != nil && reflect.TypeOf(pr.In.Body) == nopCloserType {
		pr.Out.Body = pr.In.Body
	}
	// ReverseProxy drops query parameters it cannot parse (a ";" in the
	// query); the upstream gets the query exactly as the client sent it.
	pr.Out.URL.RawQuery = joinQuery(h.upstream.RawQuery, pr.In.URL.RawQuery)
	// X-Forwarded-For: append the client's address to what it arrived with.
	if prior := pr.In.Header.Values("X-Forwarded-For"); len(prior) > 0 {
		pr.Out.Header["X-Forwarded-For"] = prior
	}
	// Forwarded (RFC 7239) passes through as it came; the proxy adds only
	// the X-Forwarded-* headers.
	if fwd := pr.In.Header.Values("Forwarded"); len(fwd) > 0 {
		pr.Out.Header["Forwarded"] = fwd
	}
	pr.SetXForwarded()
	// The attempt's fencing token, never a client's.
	pr.Out.Header.Del(idem.HeaderAttempt)
	if token, ok := idem.FencingTokenFromContext(pr.In.Context()); ok {
		pr.Out.Header[idem.HeaderAttempt] = []string{token}
	}
}

// nopCloserType is the type of io.NopCloser's result for a reader with
// WriteTo, such as a bytes.Reader.
var nopCloserType = reflect.TypeOf(io.NopCloser(new(bytes.Reader)))

func joinQuery(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "&" + b
}

// fail answers a failed upstream exchange with a problem+json 502 or 504.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	sent := !neverSent(err)
	s := sendingFrom(r.Context())
	if s != nil && !s.mayHaveSent() {
		sent = false // no byte of the request left the process
	}
	status, code, detail := http.StatusBadGateway, CodeUpstreamUnavailable, "The upstream service could not be reached."
	switch {
	case s != nil && s.refused.Load():
		status, code = http.StatusServiceUnavailable, CodeLeaseLost
		detail = "The request was not sent: this proxy lost its hold on the Idempotency-Key (a pause, or its store out of reach). Retry to get the outcome."
		if sent {
			detail = "This proxy lost its hold on the Idempotency-Key while the request was on its way: its outcome is unknown until reconciled. Retry later."
		}
	case errors.Is(err, context.DeadlineExceeded):
		status, code, detail = http.StatusGatewayTimeout, CodeUpstreamTimeout, "The upstream service did not answer in time."
	case sent:
		detail = "The upstream service broke off the exchange."
	}
	h.cfg.Logger.LogAttrs(r.Context(), slog.LevelWarn, "upstream request failed",
		slog.String("method", r.Method),
		slog.String("upstream", redact.URL(h.upstream.String())),
		slog.Bool("maybe_sent", sent),
		slog.Int("status", status),
		slog.String("error", err.Error()),
	)
	retryAfter := 0
	switch {
	case sent:
		// The upstream may have acted: the key must not be released for a
		// retry to run it again. Outside a protected request this does nothing.
		idem.MarkUnknown(r.Context())
	case code == CodeLeaseLost:
		// Nothing happened: the record is dropped (if it is still this
		// attempt's), whatever the profile does with a 5xx.
		idem.Reject(r.Context())
		retryAfter = 1
	}
	if h.cfg.StripeErrors {
		// Stripe-Should-Retry: a request that never left may be sent again;
		// one the upstream may have acted on waits for reconciliation.
		writeStripeError(w, h.cfg.ProblemTypeBase, status, code, detail, !sent)
		return
	}
	writeProblem(w, h.cfg.ProblemTypeBase, status, code, detail, retryAfter)
}

// neverSent reports whether err proves the request never reached the
// upstream: the connection could not be made.
func neverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// writeProblem writes an RFC 9457 problem+json answer, shaped as the
// middleware's, with Retry-After when retryAfter (seconds) is positive.
func writeProblem(w http.ResponseWriter, typeBase string, status int, code, detail string, retryAfter int) {
	body, _ := json.Marshal(idem.Problem{ // cannot fail: strings and an int
		Type: typeBase + code, Title: http.StatusText(status), Status: status, Detail: detail, Code: code,
	})
	hdr := w.Header()
	clear(hdr)
	hdr.Set("Content-Type", "application/problem+json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	hdr.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		hdr.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeStripeError writes Stripe's error object for a server-side failure:
// type api_error, the problem code as its code and the problem type URI as
// its doc_url.
func writeStripeError(w http.ResponseWriter, typeBase string, status int, code, message string, shouldRetry bool) {
	type stripeError struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
		DocURL  string `json:"doc_url"`
	}
	body, _ := json.Marshal(struct { // cannot fail: strings
		Error stripeError `json:"error"`
	}{stripeError{Type: "api_error", Code: code, Message: message, DocURL: typeBase + code}})
	hdr := w.Header()
	clear(hdr)
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Stripe-Should-Retry", strconv.FormatBool(shouldRetry))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// copyBufferSize is the size of the buffers ReverseProxy copies response
// bodies with: its own default.
const copyBufferSize = 32 << 10

// copyBuffers recycles ReverseProxy's copy buffers. Without a pool every
// response gets a fresh 32 KiB buffer: most of what the proxy allocated per
// request, and so most of its garbage collection.
var copyBuffers = &bufferPool{}

// bufferPool is an httputil.BufferPool of copyBufferSize buffers. It pools
// array pointers, so that Put does not allocate.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if buf, ok := b.p.Get().(*[copyBufferSize]byte); ok {
		return buf[:]
	}
	return new([copyBufferSize]byte)[:]
}

func (b *bufferPool) Put(buf []byte) {
	if len(buf) == copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(buf))
	}
}

// flushGate lets ReverseProxy flush only event streams. ReverseProxy flushes
// after every write when the upstream's answer has no Content-Length, and the
// middleware must treat a flushed answer as streamed, hence not replayable.
// Buffering such answers keeps an ordinary chunked answer replayable; the
// server still sends a large body as it fills its buffer.
type flushGate struct{ http.ResponseWriter }

// FlushError flushes when the answer is an event stream, and does nothing
// otherwise. http.ResponseController finds it before Unwrap.
func (w flushGate) FlushError() error {
	if !isEventStream(w.Header().Get("Content-Type")) {
		return nil
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the writer's other features.
func (w flushGate) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func isEventStream(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}
