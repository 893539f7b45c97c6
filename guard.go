package idem

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Guard runs operations at most once per idempotency key, on a store, with
// no HTTP in sight: it is the core every adapter shares (the HTTP middleware,
// gRPC interceptors, message consumers, Do for plain functions). It reserves
// the key before the function runs, runs the function at most once, stores
// its result, and answers every retry with the stored result, with the
// states, leases (renewed while the function runs, fenced by a token), wait
// mode, transactional mode and phases, metrics and tracing the middleware
// has. A Guard is safe for concurrent use.
type Guard struct {
	c *core
}

// NewGuard returns a Guard on store. A nil cfg means all defaults (see
// GuardConfig); the adapter supplies the identity, the fingerprint and the
// encoding of each call. Like New, it panics when cfg.Transactional is set
// and store does not implement idemstore.TxStore.
func NewGuard(store idemstore.Store, cfg *GuardConfig) *Guard {
	return &Guard{c: newCore(store, cfg)}
}

// Call names one protected call and fingerprints its request.
type Call struct {
	// Identity names the record. Scope is the tenant or principal (from
	// authentication, never from the payload; may be empty). Endpoint names
	// the operation: "POST /v1/payments", a gRPC full method name, a
	// stream and consumer, a function's name. Key is the client's key: 1
	// to MaxKeyLength printable ASCII characters (and at least
	// Config.MinKeyLength); adapters whose keys may be longer or binary
	// hash them first.
	idemstore.Identity
	// Fingerprint identifies the request the key came with; a retry with
	// the same key and another fingerprint gets ErrKeyReused. Compute it
	// with FingerprintJSON, FingerprintPayload or FingerprintBytes (or
	// Fingerprint for an HTTP request).
	Fingerprint string
	// Heartbeat, when set, is called after each successful renewal of the
	// lease while fn runs (every Config.Lease/3), on the renewal's
	// goroutine: a message consumer uses it to tell its broker that the
	// message is still being worked on. It is not called once the lease is
	// lost, and should return quickly.
	Heartbeat func()
}

// Result is what a protected function produced and what a replay returns:
// opaque bytes and a small record of status and metadata, encoded as the
// adapter chooses (an HTTP response, a gRPC message and status, Do's JSON).
type Result struct {
	// Status is a code of the adapter's choosing in 100–999 (the stores
	// keep it as an HTTP status, which is what idem keys and the console
	// show). Zero is stored, and replayed, as 200.
	Status int
	// Meta is metadata stored with the body (HTTP response headers, gRPC
	// header metadata). Names and values are kept as given.
	Meta map[string][]string
	// Body is the result's bytes. A body over Config.MaxResponse is not
	// stored: the record completes as not replayable.
	Body []byte
	// NotReplayable completes the record without storing the result, for
	// a result that was delivered but cannot be kept (streamed): retries
	// get ErrNotReplayable, never a second run.
	NotReplayable bool
}

// Run runs fn at most once for call.
//
// When this call wins the reservation, fn runs under the lease with a
// context that carries the attempt: MarkUnknown, Reject, KeyFromContext,
// DerivedKeyFromContext, CheckLease, FencingTokenFromContext, RecoveryPoint
// and RunPhases work in it, and in transactional mode so does the driver's
// TxFromContext. That context is cancelled with cause ErrLeaseLost when the
// attempt gives its lease up (Config.LeaseMargin), and when fn returns.
// What becomes of the record then
// is the middleware's after-the-handler policy, with fn's error in the place
// of a 5xx answer:
//
//   - fn returns a nil error: the result is stored, the record completed,
//     and Run returns the result (replayed false).
//   - fn returns an error: fn is taken to have had no effect, as a 5xx
//     says: the key is released (in transactional mode the transaction
//     rolls back) and a retry runs fn again. Run returns fn's error as it
//     is. A function whose effect may have happened before it failed calls
//     MarkUnknown first: the record becomes unknown and is never run again
//     until reconciliation settles it.
//   - MarkUnknown with a nil error: the result is returned but the record
//     is unknown, as in the middleware.
//   - Reject (a refusal before any effect, whatever the error): the record
//     is dropped, so the corrected request may reuse the key.
//   - A panic marks the record unknown (released in transactional mode)
//     and panics again.
//
// When another attempt got there first, Run does not run fn: a completed
// record's result is returned with replayed true; otherwise the error is an
// *Error whose Kind is ErrKeyReused, ErrInProgress (after waiting up to
// Config.Wait when set), ErrOutcomeUnknown, ErrNotReplayable,
// ErrStoreUnavailable (fail closed; with Config.FailOpen fn runs
// unprotected instead) or ErrTooManyKeys. A call whose ctx ends while it
// waits gets ErrInProgress with ctx's error as the cause. An invalid key is
// an error wrapping ErrKeyInvalid, and nothing is stored.
//
// After fn ran, Run returns ErrNotRecorded (with fn's result) when the
// completion could not be written; in transactional mode a completion that
// did not commit had no effect, and Run returns ErrStoreUnavailable, or
// ErrInProgress when the attempt lost its lease, without the result.
//
// The completion is written with a context detached from ctx's
// cancellation: a caller that gives up does not stop the result from being
// stored.
func (g *Guard) Run(ctx context.Context, call Call, fn func(ctx context.Context) (Result, error)) (res Result, replayed bool, err error) {
	c := g.c
	if err := checkKey(call.Key, c.cfg.MinKeyLength); err != nil {
		return Result{}, false, err
	}
	a := &attempt{c: c, params: idemstore.ReserveParams{Identity: call.Identity, Fingerprint: call.Fingerprint}, heartbeat: call.Heartbeat}
	if c.cfg.Tracer != nil {
		var span Span
		ctx, span = c.cfg.Tracer.Start(ctx, "idem.request")
		span.SetAttribute("idem.endpoint", call.Endpoint)
		span.SetAttribute("idem.key_hash", a.keyHash())
		a.span = span
		defer func() { span.End(err) }()
	}
	v := c.claim(ctx, a)
	switch v.d {
	case DecisionCreated, DecisionReleasedRetried:
		if v.held {
			defer c.limits.done(a.id().Scope)
		}
		return g.execute(ctx, a, v.rec, fn)
	case DecisionReplayed:
		resp := v.rec.Response
		// The record is read-only (see idemstore.ReserveResult): the
		// caller gets copies it may change.
		return Result{Status: resp.Status, Meta: cloneMeta(resp.Header), Body: slices.Clone(resp.Body)}, true, nil
	case DecisionStoreError:
		if c.cfg.FailOpen && mayFailOpen(v.err) {
			c.log.Error("idem: store unavailable, running the function UNPROTECTED (fail-open)", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "error", v.err)
			res, err := fn(ctx)
			return res, false, err
		}
	}
	return Result{}, false, v.error()
}

// checkKey refuses a key a Guard cannot store: empty, longer than
// MaxKeyLength, shorter than min or with a character other than printable
// ASCII (what ParseKey accepts from a header).
func checkKey(key string, min int) error {
	switch {
	case key == "":
		return errKeyEmpty
	case len(key) > MaxKeyLength:
		return errKeyTooLong
	case len(key) < min:
		return fmt.Errorf("%w: shorter than %d characters", ErrKeyInvalid, min)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c == 0x7f {
			return errKeyControl
		} else if c >= 0x80 {
			return errKeyNonASCII
		}
	}
	return nil
}

func cloneMeta(h map[string][]string) map[string][]string {
	if h == nil {
		return nil
	}
	h = maps.Clone(h)
	for name, vs := range h {
		h[name] = slices.Clone(vs)
	}
	return h
}

// error returns the *Error of a verdict that did not run the function.
func (v *verdict) error() error {
	e := &Error{RetryAfter: time.Duration(v.retry) * time.Second, Cause: v.err}
	switch v.d {
	case DecisionKeyReused:
		e.Kind = ErrKeyReused
	case DecisionInProgress:
		e.Kind = ErrInProgress
	case DecisionUnknown:
		e.Kind = ErrOutcomeUnknown
	case DecisionNotReplayable:
		e.Kind = ErrNotReplayable
	case DecisionTooManyKeys:
		e.Kind = ErrTooManyKeys
	case DecisionUntrusted:
		e.Kind = ErrResponseUntrusted
	default:
		e.Kind = ErrStoreUnavailable
	}
	return e
}

// execute runs fn under the lease the attempt holds on rec and records
// its outcome.
func (g *Guard) execute(ctx context.Context, a *attempt, rec *idemstore.Record, fn func(context.Context) (Result, error)) (res Result, replayed bool, err error) {
	c := g.c
	fctx := a.begin(ctx, rec)
	defer c.hub.publish(a.id())

	panicked := true
	endFn := func(error) {}
	defer func() {
		a.renewer.stop()
		if !panicked {
			return
		}
		v := recover() // nil after runtime.Goexit
		endFn(errHandlerPanicked)
		o := afterHandler(handled{panicked: true}, ProfileIETF, c.txStore != nil)
		c.record(ctx, a, o, nil)
		if o.record == recordReleased {
			c.log.Error("idem: function panicked, transaction rolled back, key released", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "released")
		} else {
			c.log.Error("idem: function panicked, outcome unknown", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "unknown")
		}
		if v != nil {
			panic(v)
		}
	}()
	fctx, endFn = c.span(fctx, "idem.handler")
	res, err = fn(fctx)
	endFn(err)
	panicked = false
	a.renewer.stop()

	o := afterHandler(handled{
		failed:   err != nil,
		streamed: res.NotReplayable || int64(len(res.Body)) > c.cfg.MaxResponse,
		rejected: a.rejected.Load(),
		unknown:  a.unknown.Load(),
	}, ProfileIETF, c.txStore != nil)
	var p *idemstore.CompleteParams
	if o.record == recordCompleted || o.record == recordNotReplayable {
		p = &a.complete
		*p = idemstore.CompleteParams{Identity: a.id(), Token: a.token(), NotReplayable: o.record == recordNotReplayable, Record: a.reserved}
		if o.record == recordCompleted {
			status := res.Status
			if status == 0 {
				status = 200
			}
			a.response = idemstore.Response{Status: status, Header: res.Meta, Body: res.Body}
			p.Response = &a.response
			c.cfg.Metrics.ResponseStored(a.metricsEndpoint(), len(res.Body))
		}
	}
	rerr := c.record(ctx, a, o, p)
	switch {
	case rerr == nil || p == nil:
		// Only a completion's failure changes the answer: after an
		// error, a rejection or an unknown outcome, fn's own answer
		// stands (the record turns unknown if the write did not happen).
		return res, false, err
	case c.txStore == nil:
		return res, false, &Error{Kind: ErrNotRecorded, Cause: rerr}
	case errors.Is(rerr, idemstore.ErrLeaseLost):
		return Result{}, false, &Error{Kind: ErrInProgress, RetryAfter: time.Second, Cause: rerr}
	default:
		return Result{}, false, &Error{Kind: ErrStoreUnavailable, RetryAfter: time.Second, Cause: rerr}
	}
}
