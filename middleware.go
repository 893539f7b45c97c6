package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

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

type middleware struct {
	store   idemstore.Store
	waiter  idemstore.Waiter  // nil when the store cannot notify
	txStore idemstore.TxStore // set in transactional mode
	cfg     Config
	methods []string        // covered methods, upper case: a few, so a scan beats a map
	stored  map[string]bool // canonical header names stored for replay
	log     *slog.Logger
	hub     hub
	limits  *scopeLimits
	fps     fpCache
	timed   bool // Metrics is not the no-op default: time store calls
}

func newMiddleware(store idemstore.Store, c *Config) *middleware {
	cfg := c.withDefaults()
	// Seals responses with the keyring, and without one refuses sealed
	// records rather than replaying ciphertext.
	store = idemcrypt.New(store, cfg.Keyring)
	m := &middleware{
		store:  store,
		cfg:    cfg,
		stored: make(map[string]bool),
		log:    cfg.Logger,
	}
	m.fps.digest = cfg.Keyring != nil
	_, nop := cfg.Metrics.(nopMetrics)
	m.timed = !nop
	m.waiter, _ = store.(idemstore.Waiter)
	if cfg.Transactional {
		ts, ok := store.(idemstore.TxStore)
		if !ok {
			panic(fmt.Sprintf("idem: Config.Transactional needs a store that implements idemstore.TxStore; %T does not", store))
		}
		m.txStore = ts
	}
	for _, meth := range cfg.Methods {
		if meth = strings.ToUpper(meth); !slices.Contains(m.methods, meth) {
			m.methods = append(m.methods, meth)
		}
	}
	for _, h := range cfg.StoredHeaders {
		name := http.CanonicalHeaderKey(h)
		if !neverStored[name] {
			m.stored[name] = true
		}
	}
	if cfg.MaxInProgressPerScope > 0 || cfg.NewKeysPerSecondPerScope > 0 {
		m.limits = newScopeLimits(cfg.MaxInProgressPerScope, cfg.NewKeysPerSecondPerScope)
	}
	if cfg.FailOpen {
		m.log.Warn("idem: fail-open is enabled: requests run UNPROTECTED when the store is unavailable; never use this in production")
	}
	return m
}

// neverStored are headers never kept for replay, whatever the allow-list says.
var neverStored = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true, "Www-Authenticate": true, "Connection": true, "Keep-Alive": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Proxy-Connection": true,
	"Content-Length": true, HeaderReplayed: true, idemcrypt.HeaderSealed: true,
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 {
		if m.cfg.RequireKey {
			m.cfg.Metrics.Decision(m.endpoint(r), "", DecisionInvalid)
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
		m.cfg.Metrics.Decision(m.endpoint(r), "", DecisionInvalid)
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
		m.cfg.Metrics.Decision(m.endpoint(r), scope, DecisionInvalid)
		m.writeProblem(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
			fmt.Sprintf("The request body exceeds %d bytes.", m.cfg.MaxBody), 0)
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Nothing is stored: the key was not reserved yet.
		m.cfg.Metrics.Decision(m.endpoint(r), scope, DecisionInvalid)
		m.log.Info("idem: request body too slow", "endpoint", m.endpoint(r), "body_timeout", m.cfg.BodyTimeout)
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
		m:    m,
		body: body,
		id:   idemstore.Identity{Scope: scope, Endpoint: endpoint, Key: key},
	}
	a.fp, a.fpCached = m.fps.fingerprint(r.Method, endpoint, r.URL.RawQuery, r.Header.Get("Content-Type"), scope, body, m.cfg.Fingerprint)
	if m.cfg.Tracer != nil {
		ctx, span := m.cfg.Tracer.Start(r.Context(), "idem.request")
		span.SetAttribute("idem.endpoint", endpoint)
		span.SetAttribute("idem.key_hash", a.keyHash())
		a.span = span
		defer func() { span.End(nil) }()
		r = r.WithContext(ctx)
	}
	m.decide(w, r, next, a)
}

// span starts a child span when tracing is on; the returned end is never nil.
func (m *middleware) span(ctx context.Context, name string) (context.Context, func(error)) {
	if m.cfg.Tracer == nil {
		return ctx, func(error) {}
	}
	ctx, s := m.cfg.Tracer.Start(ctx, name)
	return ctx, s.End
}

// decide reserves the key and answers by the record's state; it runs the
// handler when this request won the reservation.
func (m *middleware) decide(w http.ResponseWriter, r *http.Request, next http.Handler, a *attempt) {
	if m.limits != nil {
		if ok, retry := m.limits.admit(a.id.Scope, m.cfg.Now()); !ok {
			a.decision(DecisionTooManyKeys)
			m.writeProblem(w, http.StatusTooManyRequests, CodeTooManyKeys,
				"Too many idempotency keys in progress or created for this tenant.", retry)
			return
		}
	}
	admitted := m.limits != nil
	defer func() {
		if admitted {
			m.limits.refund(a.id.Scope)
		}
	}()
	var deadline <-chan time.Time
	for {
		res, err := m.reserve(r.Context(), a)
		if err != nil {
			m.storeFailed(w, r, next, a, "reserve", err)
			return
		}
		if res.Reserved {
			if admitted {
				admitted = false
				defer m.limits.done(a.id.Scope)
			}
			if res.Record.Attempts > 1 {
				a.decision(DecisionReleasedRetried)
			} else {
				a.decision(DecisionCreated)
			}
			m.execute(w, r, next, a, res.Record)
			return
		}
		rec := res.Record
		if rec.Fingerprint != a.fp {
			m.answerReused(w, a)
			return
		}
		if !a.fpCached { // a retry: remember its fingerprint for the next one
			m.fps.remember(r.Method, a.id.Endpoint, r.URL.RawQuery, r.Header.Get("Content-Type"), a.id.Scope, a.body, a.fp)
			a.fpCached = true
		}
		switch rec.State {
		case idemstore.StateCompleted:
			m.replay(w, a, rec)
			return
		case idemstore.StateUnknown:
			a.decision(DecisionUnknown)
			m.log.Info("idem: outcome unknown", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "decision", "unknown")
			m.writeProblem(w, http.StatusConflict, CodeOutcomeUnknown,
				"An earlier request with this key may or may not have taken effect; it is being reconciled. Retry later.",
				m.unknownRetryAfter())
			return
		}
		// In progress (or released but not re-claimable, which a correct
		// store never returns with a matching fingerprint).
		if m.cfg.Wait <= 0 {
			m.answerInProgress(w, a, rec)
			return
		}
		if deadline == nil {
			t := time.NewTimer(m.cfg.Wait)
			defer t.Stop()
			deadline = t.C
		}
		if !m.wait(r.Context(), a, rec, deadline) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			m.answerInProgress(w, a, rec)
			return
		}
	}
}

func (m *middleware) reserve(ctx context.Context, a *attempt) (res *idemstore.ReserveResult, err error) {
	a.token = newToken()
	ctx = a.ops.arm(ctx, m.cfg.StoreTimeout)
	defer a.ops.disarm()
	ctx, end := m.span(ctx, "idem.reserve")
	start := m.clockStart()
	defer func() {
		m.storeCall("reserve", start, err)
		end(err)
	}()
	expired := idemstore.StateUnknown
	if m.txStore != nil {
		expired = idemstore.StateReleased
	}
	a.params = idemstore.ReserveParams{
		Identity:          a.id,
		Fingerprint:       a.fp,
		Token:             a.token,
		Lease:             m.cfg.Lease,
		TTL:               m.cfg.TTL,
		LeaseExpiredState: expired,
	}
	return m.store.KeyReserve(ctx, &a.params)
}

// storeFailed fails closed: 503 unless the development fail-open switch is on.
func (m *middleware) storeFailed(w http.ResponseWriter, r *http.Request, next http.Handler, a *attempt, op string, err error) {
	a.decision(DecisionStoreError)
	if m.cfg.FailOpen {
		m.log.Error("idem: store unavailable, running the handler UNPROTECTED (fail-open)", "op", op, "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "error", err)
		next.ServeHTTP(w, r)
		return
	}
	m.log.Error("idem: store unavailable", "op", op, "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "decision", "store_error", "error", err)
	m.writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable,
		"The idempotency store is unavailable; the request was not processed. Retry later.", 1)
}

func (m *middleware) answerReused(w http.ResponseWriter, a *attempt) {
	a.decision(DecisionKeyReused)
	m.log.Info("idem: key reused with another request", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "decision", "key_reused")
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

func (m *middleware) answerInProgress(w http.ResponseWriter, a *attempt, rec *idemstore.Record) {
	a.decision(DecisionInProgress)
	retry := retryAfter(m.cfg.Now(), rec)
	if m.cfg.Async {
		w.Header().Set("Retry-After", fmt.Sprint(retry))
		w.WriteHeader(http.StatusAccepted)
		return
	}
	m.writeProblem(w, http.StatusConflict, CodeKeyInUse,
		"A request with this Idempotency-Key is in progress. Retry later.", retry)
}

// retryAfter estimates the remaining work of an in-progress attempt in whole
// seconds: as long again as it has run so far (a running attempt renews its
// lease, so the lease end says little), at least 1 s and at most the rest of
// the current lease.
func retryAfter(now time.Time, rec *idemstore.Record) int {
	est := now.Sub(rec.StartedAt)
	if rest := rec.LockedUntil.Sub(now); est > rest {
		est = rest
	}
	secs := int((est + time.Second - 1) / time.Second)
	return max(secs, 1)
}

func (m *middleware) unknownRetryAfter() int {
	return max(int(m.cfg.Lease/time.Second), 1)
}

func (m *middleware) replay(w http.ResponseWriter, a *attempt, rec *idemstore.Record) {
	if rec.NotReplayable || rec.Response == nil {
		a.decision(DecisionNotReplayable)
		m.writeProblem(w, http.StatusConflict, CodeNotReplayable,
			"The request with this Idempotency-Key completed, but its response was streamed or too large to store.", 0)
		return
	}
	a.decision(DecisionReplayed)
	// The stored header may be shared with the store (see
	// idemstore.ReserveResult), and the writer's header is anybody's to
	// change: copy the values.
	n := 1
	for _, vs := range rec.Response.Header {
		n += len(vs)
	}
	values := make([]string, n) // one slice for all of them
	h := w.Header()
	for name, vs := range rec.Response.Header {
		n = copy(values, vs)
		h[name], values = values[:n:n], values[n:]
	}
	values[0] = "true"
	h[HeaderReplayed] = values // net/http adds Content-Length
	w.WriteHeader(rec.Response.Status)
	w.Write(rec.Response.Body)
}

// wait blocks until the record may have changed, the deadline passes or the
// client leaves. It is woken by a completion in this process, by the store's
// notifications when it has them, and otherwise re-reads with backoff.
func (m *middleware) wait(ctx context.Context, a *attempt, rec *idemstore.Record, deadline <-chan time.Time) bool {
	ch := m.hub.subscribe(a.id)
	defer m.hub.unsubscribe(a.id, ch)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	woke := make(chan struct{}, 1)
	if m.waiter != nil {
		go func() {
			if m.waiter.KeyWait(ctx, a.id) == nil {
				woke <- struct{}{}
			}
		}()
	}
	// Fallback for completions in other processes without notifications:
	// re-read at a pace tied to the attempt's progress.
	poll := time.NewTimer(min(time.Duration(retryAfter(m.cfg.Now(), rec))*time.Second/4, m.cfg.Lease/3, time.Second))
	defer poll.Stop()
	select {
	case <-ch.c:
	case <-woke:
	case <-poll.C:
	case <-deadline:
		return false
	case <-ctx.Done():
		return false
	}
	return true
}

// execute runs the handler under the lease this request holds.
func (m *middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, a *attempt, rec *idemstore.Record) {
	a.execution = new(execution)
	rw := &a.rec
	*rw = recorder{w: w, max: m.cfg.MaxResponse}
	a.bodyReader.Reset(a.body)
	r.Body = &a.bodyReader
	a.renewer.start(a)
	stopRenew := a.renewer.stop
	a.recoveryPoint = rec.RecoveryPoint
	a.hctx = attemptCtx{Context: r.Context(), a: a}
	var ctx context.Context = &a.hctx
	if m.txStore != nil {
		ctx = idemstore.ContextWithTx(ctx, a.beginTx(context.WithoutCancel(r.Context())))
	}
	defer m.hub.publish(a.id)

	panicked := true
	endHandler := func(error) {}
	defer func() {
		stopRenew()
		if !panicked {
			return
		}
		v := recover() // nil after runtime.Goexit
		if v == http.ErrAbortHandler && rw.clientGone() {
			// The client went away while the answer streamed to it and the
			// handler gave up writing (as ReverseProxy does): the handler
			// answered, so its answer decides the outcome. Not a panic.
			endHandler(nil)
			m.log.Info("idem: client went away during the answer", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "status", rw.finalStatus(), "error", rw.writeErr)
			m.finished(w, r, a, rw)
			panic(v) // net/http drops the connection without logging
		}
		endHandler(errHandlerPanicked)
		what := "handler panicked"
		if v == http.ErrAbortHandler {
			// The handler aborted its answer with the client still there
			// (ReverseProxy does when the upstream's body breaks off).
			what = "handler aborted its answer"
		}
		finish := &idemstore.FinishParams{Identity: a.id, Token: a.token}
		if m.txStore != nil {
			// The transaction rolls back: nothing happened.
			a.rollback(r)
			m.finishStore(r, a, "release", func(ctx context.Context) error { return m.store.KeyRelease(ctx, finish) })
			m.log.Error("idem: "+what+", transaction rolled back, key released", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "decision", "released")
		} else {
			m.finishStore(r, a, "mark_unknown", func(ctx context.Context) error { return m.store.KeyMarkUnknown(ctx, finish) })
			m.log.Error("idem: "+what+", outcome unknown", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "decision", "unknown")
		}
		if v != nil {
			panic(v)
		}
	}()
	ctx, endHandler = m.span(ctx, "idem.handler")
	next.ServeHTTP(rw, r.WithContext(ctx))
	endHandler(nil)
	panicked = false
	stopRenew()
	m.finished(w, r, a, rw)
}

// finished records the outcome of a handler that answered and sends a
// buffered answer.
func (m *middleware) finished(w http.ResponseWriter, r *http.Request, a *attempt, rw *recorder) {
	if m.txStore != nil {
		m.completeTx(w, r, a, rw)
	} else {
		m.complete(r, a, rw)
	}
	rw.finish()
}

// complete records the outcome of the handler (SPEC section 3, after the handler).
func (m *middleware) complete(r *http.Request, a *attempt, rw *recorder) {
	finish := &idemstore.FinishParams{Identity: a.id, Token: a.token}
	switch {
	case a.rejected.Load():
		m.finishStore(r, a, "delete", func(ctx context.Context) error { return m.store.KeyDelete(ctx, finish) })
	case a.unknown.Load():
		m.finishStore(r, a, "mark_unknown", func(ctx context.Context) error { return m.store.KeyMarkUnknown(ctx, finish) })
	case m.releases(rw.finalStatus()):
		m.finishStore(r, a, "release", func(ctx context.Context) error { return m.store.KeyRelease(ctx, finish) })
	default:
		p := m.completeParams(r, a, rw)
		m.finishStore(r, a, "complete", func(ctx context.Context) error { return m.store.KeyComplete(ctx, p) })
	}
}

func (m *middleware) completeParams(r *http.Request, a *attempt, rw *recorder) *idemstore.CompleteParams {
	p := &a.complete
	*p = idemstore.CompleteParams{Identity: a.id, Token: a.token}
	if rw.streamed || rw.hijacked {
		p.NotReplayable = true
	} else {
		a.response = idemstore.Response{Status: rw.finalStatus(), Header: m.storedHeader(rw.Header()), Body: rw.buf}
		if m.cfg.Redact != nil {
			a.response.Body = m.cfg.Redact(r, a.response.Status, a.response.Header, rw.buf)
		}
		p.Response = &a.response
		m.cfg.Metrics.ResponseStored(a.id.Endpoint, len(a.response.Body))
	}
	return p
}

// completeTx finishes a transactional attempt: the completion is written in
// the business transaction and committed before the response is sent. When
// that fails the response is replaced by a problem and the key released, so
// the client never sees success for writes that did not commit.
func (m *middleware) completeTx(w http.ResponseWriter, r *http.Request, a *attempt, rw *recorder) {
	finish := &idemstore.FinishParams{Identity: a.id, Token: a.token}
	release := func() error {
		var err error
		m.finishStore(r, a, "release", func(ctx context.Context) error { err = m.store.KeyRelease(ctx, finish); return err })
		return err
	}
	switch {
	case a.rejected.Load():
		a.rollback(r)
		m.finishStore(r, a, "delete", func(ctx context.Context) error { return m.store.KeyDelete(ctx, finish) })
		return
	case a.unknown.Load():
		a.rollback(r)
		m.finishStore(r, a, "mark_unknown", func(ctx context.Context) error { return m.store.KeyMarkUnknown(ctx, finish) })
		return
	case m.releasesTx(rw.finalStatus()):
		a.rollback(r)
		release()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.cfg.StoreTimeout)
	defer cancel()
	ctx, end := m.span(ctx, "idem.complete")
	tx, err := a.beginTx(context.WithoutCancel(r.Context()))()
	if err == nil {
		err = tx.KeyComplete(ctx, m.completeParams(r, a, rw))
		if err == nil {
			start := m.clockStart()
			err = tx.Commit(ctx)
			m.storeCall("commit", start, err)
			if err != nil {
				// Releasing is safe whatever the commit did: the release is
				// fenced on an in_progress record, and a committed
				// completion is not in progress any more.
				if release() == nil {
					err = fmt.Errorf("%w: %w", errCommitReleased, err)
				}
			}
		} else {
			a.rollback(r)
		}
	}
	end(err)
	switch {
	case err == nil:
	case errors.Is(err, idemstore.ErrLeaseLost):
		m.log.Warn("idem: lease lost before commit; the transaction was rolled back", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint)
		if rw.discard() {
			m.writeProblem(w, http.StatusConflict, CodeKeyInUse,
				"This attempt lost its lease to a newer one and was rolled back. Retry to get the result.", 1)
		}
	default:
		m.log.Error("idem: committing the business transaction failed", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "decision", "store_error", "error", err)
		if !errors.Is(err, errCommitReleased) {
			release()
		}
		if rw.discard() {
			m.writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable,
				"The request could not be committed and had no effect. Retry later.", 1)
		}
	}
}

var errHandlerPanicked = errors.New("idem: handler panicked")

var errCommitReleased = errors.New("commit failed, key released")

// releasesTx is releases for transactional mode, where a 5xx always rolls
// back (whatever the profile).
func (m *middleware) releasesTx(status int) bool {
	return status >= 500 || m.releases(status)
}

// releases reports whether a response of this status releases the key so a
// retry re-executes.
func (m *middleware) releases(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500 && m.cfg.Profile != ProfileStripe
}

// finishStore runs a fenced write after the handler on a context detached
// from the client's: a client that hangs up does not stop it.
func (m *middleware) finishStore(r *http.Request, a *attempt, op string, f func(context.Context) error) {
	ctx := a.ops.arm(r.Context(), m.cfg.StoreTimeout)
	defer a.ops.disarm()
	ctx, end := m.span(ctx, "idem.complete")
	start := m.clockStart()
	err := f(ctx)
	m.storeCall(op, start, err)
	end(err)
	switch {
	case err == nil:
	case errors.Is(err, idemstore.ErrLeaseLost):
		m.log.Warn("idem: lease lost before the attempt finished; its outcome was not recorded", "op", op, "key_hash", a.keyHash(), "endpoint", a.id.Endpoint)
	default:
		m.log.Error("idem: recording the outcome failed; the lease will expire to unknown", "op", op, "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "decision", "store_error", "error", err)
	}
}

// clockStart starts timing a store call, when there are Metrics to tell.
func (m *middleware) clockStart() time.Time {
	if !m.timed {
		return time.Time{}
	}
	return time.Now()
}

// storeCall reports a store call started at start to Metrics.
func (m *middleware) storeCall(op string, start time.Time, err error) {
	if m.timed {
		m.cfg.Metrics.StoreCall(op, time.Since(start), err)
	}
}

// storedHeader returns the headers of h that are stored for replay. When
// all of them are (a handler that sets Content-Type and Location, say), it
// returns h itself: stores copy or serialise what they keep, and nothing
// changes h while the store call runs.
func (m *middleware) storedHeader(h http.Header) http.Header {
	n := 0
	for name := range h {
		if m.stored[name] {
			n++
		}
	}
	if n == len(h) {
		return h
	}
	out := make(http.Header, n)
	for name, vs := range h {
		if m.stored[name] {
			out[name] = vs // stores copy or serialise what they keep
		}
	}
	return out
}

// renewer heartbeats the lease every Lease/3 while the handler runs, on an
// alarm of the process-wide list rather than a goroutine or a runtime timer
// per request.
type renewer struct {
	a       *attempt
	mu      sync.Mutex
	stopped bool
	alarm   alarm
}

func (rn *renewer) start(a *attempt) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.a = a
	procAlarms.set(&rn.alarm, rn, time.Now().Add(a.m.cfg.Lease/3), 0)
}

// alarmed renews the lease in a goroutine of its own: the list calls its
// alarms back one after the other.
func (rn *renewer) alarmed(uint64) {
	go rn.renew()
}

func (rn *renewer) renew() {
	a, m := rn.a, rn.a.m
	rn.mu.Lock()
	stopped := rn.stopped
	rn.mu.Unlock()
	if stopped {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.StoreTimeout)
	start := m.clockStart()
	err := m.store.KeyRenew(ctx, &idemstore.RenewParams{Identity: a.id, Token: a.token, Lease: m.cfg.Lease})
	m.storeCall("renew", start, err)
	cancel()
	if errors.Is(err, idemstore.ErrLeaseLost) {
		m.log.Warn("idem: lease lost while the handler runs", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint)
		return
	}
	if err != nil {
		m.log.Error("idem: renewing the lease failed", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "error", err)
	}
	rn.mu.Lock()
	if !rn.stopped {
		procAlarms.set(&rn.alarm, rn, time.Now().Add(m.cfg.Lease/3), 0)
	}
	rn.mu.Unlock()
}

// stop ends the heartbeat; it is safe to call more than once.
func (rn *renewer) stop() {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.stopped || rn.a == nil {
		return
	}
	rn.stopped = true
	procAlarms.cancel(&rn.alarm)
}

func (m *middleware) endpoint(r *http.Request) string {
	if m.cfg.Endpoint != nil {
		return m.cfg.Endpoint(r)
	}
	if p := r.Pattern; p != "" {
		if i := strings.IndexByte(p, ' '); i > 0 && !strings.ContainsRune(p[:i], '/') {
			return p
		}
		return r.Method + " " + p
	}
	return r.Method + " " + r.URL.Path
}

// readBody reads at most limit bytes of the request body.
// readBody reads the request body within Config.BodyTimeout: a read
// deadline on the connection, lifted once the body is in so the handler's
// own reading (none: it gets the buffered body) and the next request on the
// connection are not cut short.
func (m *middleware) readBody(w http.ResponseWriter, r *http.Request) (body []byte, tooLarge bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	rc := http.NewResponseController(w)
	// The wall clock, not Config.Now: the deadline is the connection's.
	if rc.SetReadDeadline(time.Now().Add(m.cfg.BodyTimeout)) == nil {
		defer func() {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				_ = rc.SetReadDeadline(time.Time{})
			}
		}()
	}
	return readBody(r, m.cfg.MaxBody)
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

// newToken returns a fresh fencing token: 128 bits from the runtime's
// ChaCha8 generator, seeded from the operating system. A token must be
// unique, not secret: it never leaves the server, and a store compares it
// only with the tokens it handed out.
func newToken() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	var h [32]byte
	hex.Encode(h[:], b[:])
	return string(h[:])
}

// attempt is one request's claim on a record.
type attempt struct {
	m        *middleware
	id       idemstore.Identity
	fp       string
	fpCached bool // fp came from the fingerprint cache, or went into it
	token    string
	unknown  atomic.Bool
	rejected atomic.Bool
	span     Span // nil without a Tracer

	// Embedded so that one allocation serves the whole request.
	body   []byte
	ops    opCtx // the context of the store calls
	params idemstore.ReserveParams
	// *execution is set when the request runs the handler.
	*execution
}

// execution is the part of an attempt only a request that runs the handler
// needs, in one allocation: a replay or a 409 does not pay for it.
type execution struct {
	hctx       attemptCtx
	bodyReader bodyReader
	complete   idemstore.CompleteParams
	response   idemstore.Response
	rec        recorder
	renewer    renewer

	// recoveryPoint is the last committed phase (transactional mode).
	recoveryPoint string
	// tx is the lazily begun business transaction (transactional mode).
	txOnce sync.Once
	tx     idemstore.Tx
	txErr  error
}

// beginTx returns the function that begins the request's business
// transaction once, on first use.
func (a *attempt) beginTx(ctx context.Context) func() (idemstore.Tx, error) {
	return func() (idemstore.Tx, error) {
		a.txOnce.Do(func() {
			a.tx, a.txErr = a.m.txStore.KeyBeginTx(ctx)
		})
		return a.tx, a.txErr
	}
}

// rollback rolls back the business transaction if one was begun.
func (a *attempt) rollback(r *http.Request) {
	a.txOnce.Do(func() { a.txErr = idemstore.ErrNoTx }) // none may begin now
	if a.tx == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), a.m.cfg.StoreTimeout)
	defer cancel()
	if err := a.tx.Rollback(ctx); err != nil {
		a.m.log.Error("idem: rolling back the business transaction failed", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "error", err)
	}
}

// decision reports what the middleware decided for this request.
func (a *attempt) decision(d Decision) {
	a.m.cfg.Metrics.Decision(a.id.Endpoint, a.id.Scope, d)
	if a.span != nil {
		a.span.SetAttribute("idem.decision", string(d))
	}
}

// bodyReader gives the handler the body the middleware read.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// keyHash names the record in logs without revealing the key.
func (a *attempt) keyHash() string { return a.id.LogHash() }

type attemptKey struct{}

// attemptCtx is the handler's context: the request's, with the attempt as
// the value of attemptKey. It is what context.WithValue makes, embedded in
// the execution instead of allocated.
type attemptCtx struct {
	context.Context
	a *attempt
}

func (c *attemptCtx) Value(key any) any {
	if key == (attemptKey{}) {
		return c.a
	}
	return c.Context.Value(key)
}

func attemptFrom(ctx context.Context) *attempt {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return a
}

// MarkUnknown tells the middleware that the handler's effect may already
// have happened although it answers with an error: the record becomes
// unknown instead of released, and no retry re-executes it until
// reconciliation resolves it. It reports false outside a protected request.
func MarkUnknown(ctx context.Context) bool {
	a := attemptFrom(ctx)
	if a == nil {
		return false
	}
	a.unknown.Store(true)
	return true
}

// Reject declares the handler's response a rejection made before any effect
// (failed validation, refused authorisation): the record is dropped instead
// of stored, so the corrected request may reuse the key. It reports false
// outside a protected request.
func Reject(ctx context.Context) bool {
	a := attemptFrom(ctx)
	if a == nil {
		return false
	}
	a.rejected.Store(true)
	return true
}

// KeyFromContext returns the idempotency key of the protected request.
func KeyFromContext(ctx context.Context) (string, bool) {
	a := attemptFrom(ctx)
	if a == nil {
		return "", false
	}
	return a.id.Key, true
}

// DerivedKey returns a stable key for an external call named name made on
// behalf of the protected request: the same scope, endpoint, client key and
// name always give the same value, so a downstream that honours its own
// Idempotency-Key deduplicates retries. It returns "" outside a protected
// request.
func DerivedKey(ctx context.Context, name string) string {
	a := attemptFrom(ctx)
	if a == nil {
		return ""
	}
	return DeriveKey(a.id, name)
}

// DeriveKey is DerivedKey for a known identity, for workers outside a request.
func DeriveKey(id idemstore.Identity, name string) string {
	h := sha256.New()
	io.WriteString(h, id.Hash())
	io.WriteString(h, name)
	return "idem-" + hex.EncodeToString(h.Sum(nil))[:40]
}

// hub wakes requests waiting on a record in this process when an attempt
// finishes.
type hub struct {
	mu sync.Mutex
	m  map[idemstore.Identity]*waitChan
	// waiting counts the subscriptions, so that publish, which every
	// execution calls, skips the lock and the lookup when nobody waits. A
	// subscription that lands just after publish looked misses this wake-up
	// as it would have under the lock; the waiter's re-read covers it.
	waiting atomic.Int64
}

type waitChan struct {
	c    chan struct{}
	refs int
}

func (h *hub) subscribe(id idemstore.Identity) *waitChan {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[idemstore.Identity]*waitChan)
	}
	wc := h.m[id]
	if wc == nil {
		wc = &waitChan{c: make(chan struct{})}
		h.m[id] = wc
	}
	wc.refs++
	h.waiting.Add(1)
	return wc
}

func (h *hub) unsubscribe(id idemstore.Identity, wc *waitChan) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting.Add(-1)
	wc.refs--
	if wc.refs == 0 && h.m[id] == wc {
		delete(h.m, id)
	}
}

func (h *hub) publish(id idemstore.Identity) {
	if h.waiting.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if wc := h.m[id]; wc != nil {
		close(wc.c)
		delete(h.m, id)
	}
}
