package idem

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/idem-dev/idem/idemstore"
)

// execute runs the handler under the lease this request holds.
func (m *middleware) execute(w http.ResponseWriter, r *http.Request, next http.Handler, a *attempt, rec *idemstore.Record) {
	ctx := a.begin(r.Context(), rec)
	stopRenew := a.renewer.stop
	rw := &a.rec
	*rw = recorder{w: w, max: m.cfg.MaxResponse}
	a.bodyReader.Reset(a.body)
	// io.NopCloser, which net/http knows for in memory: a handler that
	// forwards the request (a ReverseProxy) writes it in one piece.
	r.Body = io.NopCloser(&a.bodyReader)
	defer m.hub.publish(a.id())

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
			m.log.Info("idem: client went away during the answer", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "status", rw.finalStatus(), "error", rw.writeErr)
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
		o := afterHandler(handled{panicked: true}, m.cfg.Profile, m.txStore != nil)
		m.complete(w, r, a, rw, o)
		if o.record == recordReleased {
			// The transaction rolled back: nothing happened.
			m.log.Error("idem: "+what+", transaction rolled back, key released", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "released")
		} else {
			m.log.Error("idem: "+what+", outcome unknown", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "unknown")
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
	m.complete(w, r, a, rw, afterHandler(handled{
		status:   rw.finalStatus(),
		streamed: rw.streamed || rw.hijacked,
		rejected: a.rejected.Load(),
		unknown:  a.unknown.Load(),
	}, m.cfg.Profile, m.txStore != nil))
	rw.finish()
}

// complete records the outcome the policy chose (afterHandler) with the
// core. When a transactional completion did not commit, the buffered
// response is replaced by a problem: the client never sees success for
// writes that did not commit.
func (m *middleware) complete(w http.ResponseWriter, r *http.Request, a *attempt, rw *recorder, o outcome) {
	var p *idemstore.CompleteParams
	if o.record == recordCompleted || o.record == recordNotReplayable {
		p = m.completeParams(r, a, rw, o.record)
	}
	err := m.record(r.Context(), a, o, p)
	if err == nil || p == nil || m.txStore == nil || !rw.discard() {
		return
	}
	if errors.Is(err, idemstore.ErrLeaseLost) {
		m.writeProblem(w, http.StatusConflict, CodeKeyInUse,
			"This attempt lost its lease to a newer one and was rolled back. Retry to get the result.", 1)
		return
	}
	m.writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable,
		"The request could not be committed and had no effect. Retry later.", 1)
}

func (m *middleware) completeParams(r *http.Request, a *attempt, rw *recorder, rec recordAs) *idemstore.CompleteParams {
	p := &a.complete
	*p = idemstore.CompleteParams{Identity: a.id(), Token: a.token(), Record: a.reserved}
	if rec == recordNotReplayable {
		p.NotReplayable = true
	} else {
		a.response = idemstore.Response{Status: rw.finalStatus(), Header: m.storedHeader(rw.Header()), Body: rw.buf}
		if m.cfg.Redact != nil {
			a.response.Body = m.cfg.Redact(r, a.response.Status, a.response.Header, rw.buf)
		}
		p.Response = &a.response
		m.cfg.Metrics.ResponseStored(a.metricsEndpoint(), len(a.response.Body))
	}
	return p
}

var errHandlerPanicked = errors.New("idem: handler panicked")

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

// execution is the part of an attempt only a request that runs the handler
// needs, in one allocation: a replay or a 409 does not pay for it.
type execution struct {
	// reserved is the record as this attempt reserved it: the completion
	// carries it, so that the encryption binds the response to the
	// record's fingerprint and creation time without reading it again.
	reserved   *idemstore.Record
	hctx       attemptCtx
	bodyReader bytes.Reader // the body the middleware read, for the handler
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
