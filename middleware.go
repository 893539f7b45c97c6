package idem

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/neverstored"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderAttempt is the request header in which idem proxy sends the
// upstream the fencing token of the attempt (FencingTokenFromContext), and
// the reconciler's lookup the token of the attempt it asks about. An
// upstream that keeps it can refuse an attempt it has already answered
// for, such as one it told a lookup it never saw.
const HeaderAttempt = "Idempotency-Attempt"

// HeaderReplayed is set to "true" on every answer served from a stored response.
const HeaderReplayed = "Idempotent-Replayed"

// New returns the idempotency middleware on store. A nil cfg means all
// defaults (see Config).
func New(store idemstore.Store, cfg *Config) func(http.Handler) http.Handler {
	m := newMiddleware(store, cfg)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next)
		})
	}
}

// middleware is the HTTP adapter on the core: it turns a request into an
// attempt (key, scope, endpoint, fingerprint of the body), runs the handler
// when the core's claim says so, and answers the core's verdicts with
// problems and replays.
type middleware struct {
	*core
	cfg     Config          // with its defaults; its GuardConfig is the core's
	methods []string        // covered methods, upper case: a few, so a scan beats a map
	stored  map[string]bool // canonical header names stored for replay
	fps     fpCache
	// endpoints keeps the endpoints endpoint made, so that a request of
	// an endpoint seen before finds its name instead of building it.
	endpoints labelSlots
}

func newMiddleware(store idemstore.Store, c *Config) *middleware {
	m := &middleware{cfg: c.withDefaults(), stored: make(map[string]bool), endpoints: labelSlots{seed: maphash.MakeSeed()}}
	m.core = newCore(store, &m.cfg.GuardConfig)
	// The core's settings as the core uses them (a benchmark build's
	// features may change them), so that both read the same.
	m.cfg.GuardConfig = m.core.cfg
	cfg := &m.cfg
	m.fps.digest = cfg.Keyring != nil
	for _, meth := range cfg.Methods {
		if meth = strings.ToUpper(meth); !slices.Contains(m.methods, meth) {
			m.methods = append(m.methods, meth)
		}
	}
	for _, h := range cfg.StoredHeaders {
		name := http.CanonicalHeaderKey(h)
		if !neverstored.Has(name) { // whatever the allow-list says
			m.stored[name] = true
		}
	}
	return m
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header[HeaderKey] // canonical: no need for Values to make it so
	if len(values) == 0 {
		if m.cfg.RequireKey {
			m.cfg.Metrics.Decision(m.metricsEndpoint(r), "", DecisionInvalid)
			m.writeProblem(w, http.StatusBadRequest, CodeKeyMissing, "This endpoint requires an Idempotency-Key header.", 0)
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	key, err := ParseKey(values)
	if err == nil && len(key) < m.cfg.MinKeyLength {
		err = fmt.Errorf("%w: shorter than %d characters", ErrKeyInvalid, m.cfg.MinKeyLength)
	}
	if err != nil {
		m.cfg.Metrics.Decision(m.metricsEndpoint(r), "", DecisionInvalid)
		m.writeProblem(w, http.StatusBadRequest, CodeKeyInvalid, err.Error(), 0)
		return
	}
	scope := ""
	if m.cfg.Scope != nil {
		if scope, err = m.cfg.Scope(r); err != nil {
			m.writeProblem(w, http.StatusUnauthorized, CodeUnauthorized, "The request's tenant could not be determined.", 0)
			return
		}
	}
	body, tooLarge, err := m.readBody(w, r)
	if tooLarge {
		m.cfg.Metrics.Decision(m.metricsEndpoint(r), scope, DecisionInvalid)
		m.writeProblem(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
			fmt.Sprintf("The request body exceeds %d bytes.", m.cfg.MaxBody), 0)
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Nothing is stored: the key was not reserved yet.
		m.cfg.Metrics.Decision(m.metricsEndpoint(r), scope, DecisionInvalid)
		m.log.Info("idem: request body too slow", "endpoint", m.metricsEndpoint(r), "body_timeout", m.cfg.BodyTimeout)
		w.Header().Set("Connection", "close")
		m.writeProblem(w, http.StatusRequestTimeout, CodeBodyTimeout,
			fmt.Sprintf("The request body did not arrive within %s.", m.cfg.BodyTimeout), 0)
		return
	}
	if err != nil {
		// The client went away or sent a broken body: nothing is stored.
		m.writeProblem(w, http.StatusBadRequest, CodeBodyUnreadable, "The request body could not be read.", 0)
		return
	}

	endpoint := m.endpoint(r)
	a := &attempt{
		c:      m.core,
		body:   body,
		params: idemstore.ReserveParams{Identity: idemstore.Identity{Scope: scope, Endpoint: endpoint, Key: key}},
		label:  m.metricsLabel(r, endpoint),
	}
	contentType := firstValue(r.Header, headerContentType)
	if offCanonical {
		contentType = "application/octet-stream" // hashed as raw bytes
	}
	a.params.Fingerprint, a.fpCached = m.fps.fingerprint(r.Method, endpoint, r.URL.RawQuery, contentType, scope, body, m.cfg.Fingerprint)
	if m.cfg.Tracer != nil {
		ctx, span := m.cfg.Tracer.Start(r.Context(), "idem.request")
		span.SetAttribute("idem.endpoint", a.label)
		span.SetAttribute("idem.key_hash", a.keyHash())
		a.span = span
		defer func() { span.End(nil) }()
		r = r.WithContext(ctx)
	}
	m.decide(w, r, next, a)
}

// headerContentType is the canonical name of the request's content type.
const headerContentType = "Content-Type"

// firstValue is h.Get(name) for a name in canonical form, as the
// middleware's constants are (headername_test.go checks them): h.Get
// would canonicalise it again, on every request, at a cost of a few
// hundred instructions a name.
func firstValue(h http.Header, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// decide has the core claim the key and answers its verdict; it runs the
// handler when this request won the reservation.
func (m *middleware) decide(w http.ResponseWriter, r *http.Request, next http.Handler, a *attempt) {
	v := m.claim(r.Context(), a)
	switch v.d {
	case DecisionCreated, DecisionTooManyKeys, DecisionStoreError, DecisionKeyReused:
	default:
		if !a.fpCached { // a retry: remember its fingerprint for the next one
			m.fps.remember(r.Method, a.id().Endpoint, r.URL.RawQuery, firstValue(r.Header, headerContentType), a.id().Scope, a.body, a.fp())
			a.fpCached = true
		}
	}
	switch v.d {
	case DecisionCreated, DecisionReleasedRetried:
		if v.held {
			defer m.limits.done(a.id().Scope)
		}
		m.execute(w, r, next, a, v.rec)
	case DecisionReplayed:
		m.replay(w, v.rec)
	case DecisionNotReplayable:
		m.writeProblem(w, http.StatusConflict, CodeNotReplayable,
			"The request with this Idempotency-Key completed, but its response was streamed or too large to store.", 0)
	case DecisionUnknown:
		m.writeProblem(w, http.StatusConflict, CodeOutcomeUnknown,
			"An earlier request with this key may or may not have taken effect; it is being reconciled. Retry later.",
			v.retry)
	case DecisionInProgress:
		if v.err != nil {
			// The request's context ended while it waited: the client
			// left, or a timeout in front of this handler ended it. Answer
			// all the same: nobody reads it in the first case, and in the
			// second net/http would otherwise send an empty 200, which
			// reads as success.
			a.decision(DecisionInProgress)
		}
		m.answerInProgress(w, v.retry)
	case DecisionKeyReused:
		m.answerReused(w)
	case DecisionTooManyKeys:
		m.writeProblem(w, http.StatusTooManyRequests, CodeTooManyKeys,
			"Too many idempotency keys in progress or created for this tenant.", v.retry)
	case DecisionUntrusted:
		m.writeProblem(w, http.StatusInternalServerError, CodeResponseUntrusted,
			"The request with this Idempotency-Key completed, but its stored response failed verification: it is not replayed, and the request is not run again.", 0)
	default:
		m.storeFailed(w, r, next, a, v.err)
	}
}

// storeFailed fails closed: 503 unless the development fail-open switch is
// on. The core logged the failure and counted the decision.
func (m *middleware) storeFailed(w http.ResponseWriter, r *http.Request, next http.Handler, a *attempt, err error) {
	if m.cfg.FailOpen && mayFailOpen(err) {
		m.log.Error("idem: store unavailable, running the handler UNPROTECTED (fail-open)", "op", "reserve", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "error", err)
		next.ServeHTTP(w, r)
		return
	}
	m.writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable,
		"The idempotency store is unavailable; the request was not processed. Retry later.", 1)
}

func (m *middleware) answerReused(w http.ResponseWriter) {
	const detail = "This Idempotency-Key was already used with a different request."
	switch m.cfg.Profile {
	case ProfileStripe:
		m.writeProblem(w, http.StatusBadRequest, CodeKeyReused, detail, 0)
	case ProfileAppstrate:
		m.writeProblem(w, http.StatusConflict, CodeConflict, detail, 0)
	default:
		m.writeProblem(w, http.StatusUnprocessableEntity, CodeKeyReused, detail, 0)
	}
}

// answerInProgress answers a request whose key another attempt holds:
// retry is the core's estimate of the remaining work, in seconds.
func (m *middleware) answerInProgress(w http.ResponseWriter, retry int) {
	if m.cfg.Async {
		w.Header().Set("Retry-After", fmt.Sprint(retry))
		w.WriteHeader(http.StatusAccepted)
		return
	}
	m.writeProblem(w, http.StatusConflict, CodeKeyInUse,
		"A request with this Idempotency-Key is in progress. Retry later.", retry)
}

// replay answers with the stored response of a completed record.
func (m *middleware) replay(w http.ResponseWriter, rec *idemstore.Record) {
	// The stored header may be shared with the store (see
	// idemstore.ReserveResult), and the writer's header is anybody's to
	// change: copy the values, into one array sized for one value a name
	// (the usual) in one pass over the map. A name with more values may
	// move the rest to a larger array: the names given a part of the
	// first keep it, a copy all the same.
	values := make([]string, 1, 1+len(rec.Response.Header))
	values[0] = "true"
	replayed := values[:1:1]
	h := w.Header()
	for name, vs := range rec.Response.Header {
		n := len(values)
		values = append(values, vs...)
		h[name] = values[n:len(values):len(values)]
	}
	h[HeaderReplayed] = replayed // net/http adds Content-Length
	w.WriteHeader(rec.Response.Status)
	w.Write(rec.Response.Body)
}

func (m *middleware) endpoint(r *http.Request) string {
	if m.cfg.Endpoint != nil {
		return m.cfg.Endpoint(r)
	}
	if p := r.Pattern; p != "" {
		if i := strings.IndexByte(p, ' '); i > 0 && !strings.ContainsRune(p[:i], '/') {
			return p
		}
		return m.endpoints.label(r.Method, p, "")
	}
	return m.endpoints.label(r.Method, r.URL.Path, "")
}

// EscapedPathEndpoint returns a Config.Endpoint that names a request by
// its method and its path as sent (URL.EscapedPath), as idem proxy does:
// an upstream that routes on the raw path may serve /a%2Fb and /a/b as
// different resources. Like the default, it keeps the names it made, so
// that a request to an endpoint seen before allocates none.
func EscapedPathEndpoint() func(r *http.Request) string {
	names := &labelSlots{seed: maphash.MakeSeed()}
	return func(r *http.Request) string {
		return names.label(r.Method, r.URL.EscapedPath(), "")
	}
}

// metricsEndpoint is the endpoint label of r in Metrics, logs and spans:
// never the raw path unless Config.MetricsEndpoint says so.
func (m *middleware) metricsEndpoint(r *http.Request) string {
	return m.metricsLabel(r, "")
}

// metricsLabel is metricsEndpoint given endpoint, m.endpoint(r) when the
// caller has it already (else ""), so that it is not computed again.
func (m *middleware) metricsLabel(r *http.Request, endpoint string) string {
	switch {
	case m.cfg.MetricsEndpoint != nil:
		return m.cfg.MetricsEndpoint(r)
	case m.cfg.Endpoint != nil || r.Pattern != "":
		if endpoint == "" {
			endpoint = m.endpoint(r)
		}
		return endpoint
	}
	return unrouted(r)
}

// unrouted is the metrics label of a request named by its raw path.
var unrouted = MetricsPathPrefix(0)

// MetricsPathPrefix returns a Config.MetricsEndpoint that names a request
// by its method and the first segments segments of its path, followed by
// "/*" when the path goes on: with 2, POST /v1/reset/TOKEN is "POST
// /v1/reset/*" and POST /v1/payments stays "POST /v1/payments". Choose
// segments so that no kept segment carries an identifier or a secret.
func MetricsPathPrefix(segments int) func(r *http.Request) string {
	labels := &labelSlots{seed: maphash.MakeSeed()}
	return func(r *http.Request) string {
		p := r.URL.EscapedPath()
		if p == "" {
			p = "/"
		}
		end := 0 // p[:end] is kept: the leading "/" and segments segments
		for n := 0; n < segments; n++ {
			i := strings.IndexByte(p[end+1:], '/')
			if i < 0 {
				return labels.label(r.Method, p, "")
			}
			end += 1 + i
		}
		if end+1 >= len(p) {
			return labels.label(r.Method, p, "")
		}
		return labels.label(r.Method, p[:end], "/*")
	}
}

// labelSlots keeps the labels MetricsPathPrefix made (and the endpoint
// names of the default Endpoint and EscapedPathEndpoint), so that a
// request finds its label instead of building it: a hash of the kept path
// picks a slot, which the first label made into it keeps (labels are few,
// by the choice of segments; a label whose slot another holds is built
// each time, as without the slots: so is the name of a path with an
// identifier in it, once the slots are taken).
type labelSlots struct {
	seed  maphash.Seed
	slots [64]atomic.Pointer[pathLabel]
}

// pathLabel is method + " " + path + suffix; path is a part of label, not
// of a request.
type pathLabel struct{ method, path, suffix, label string }

// label returns method + " " + path + suffix.
func (ls *labelSlots) label(method, path, suffix string) string {
	slot := &ls.slots[(maphash.String(ls.seed, path)+uint64(len(method)))%uint64(len(ls.slots))]
	if e := slot.Load(); e != nil && e.path == path && e.method == method && e.suffix == suffix {
		return e.label
	}
	label := method + " " + path + suffix
	if slot.Load() == nil {
		start := len(method) + 1
		slot.CompareAndSwap(nil, &pathLabel{method: label[:len(method)], path: label[start : start+len(path)], suffix: suffix, label: label})
	}
	return label
}

// readBody reads the request body within Config.BodyTimeout: a read
// deadline on the connection, lifted once the body is in so the handler's
// own reading (none: it gets the buffered body) and the next request on the
// connection are not cut short.
func (m *middleware) readBody(w http.ResponseWriter, r *http.Request) (body []byte, tooLarge bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	// The wall clock, not Config.Clock: the deadline is the connection's.
	if offBodyRead || setReadDeadline(w, time.Now().Add(m.cfg.BodyTimeout)) != nil {
		return readBody(r, m.cfg.MaxBody) // the writer cannot bound the read
	}
	body, tooLarge, err = readBody(r, m.cfg.MaxBody)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		_ = setReadDeadline(w, time.Time{})
	}
	return body, tooLarge, err
}

// setReadDeadline is http.ResponseController's SetReadDeadline without its
// allocations: it unwraps w as a ResponseController does, and a writer
// without the method (httptest's recorder, a wrapper without Unwrap)
// answers http.ErrNotSupported itself, not wrapped in a new error.
func setReadDeadline(w http.ResponseWriter, t time.Time) error {
	for {
		switch x := w.(type) {
		case interface{ SetReadDeadline(time.Time) error }:
			return x.SetReadDeadline(t)
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return http.ErrNotSupported
		}
	}
}

func readBody(r *http.Request, limit int64) (body []byte, tooLarge bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	if r.ContentLength > limit {
		return nil, true, nil
	}
	if r.ContentLength >= 0 {
		// net/http never delivers more than the declared length.
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, body)
		return body, false, err
	}
	body = make([]byte, 0, 512)
	for {
		if len(body) == cap(body) {
			body = append(body, 0)[:len(body)]
		}
		n, err := r.Body.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if int64(len(body)) > limit {
			return nil, true, nil
		}
		if err == io.EOF {
			return body, false, nil
		}
		if err != nil {
			return nil, false, err
		}
	}
}
