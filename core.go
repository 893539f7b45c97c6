package idem

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// span starts a child span when tracing is on; the returned end is never nil.
func (m *middleware) span(ctx context.Context, name string) (context.Context, func(error)) {
	if m.cfg.Tracer == nil {
		return ctx, func(error) {}
	}
	ctx, s := m.cfg.Tracer.Start(ctx, name)
	return ctx, s.End
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

// decision reports what the middleware decided for this request.
func (a *attempt) decision(d Decision) {
	a.m.cfg.Metrics.Decision(a.id.Endpoint, a.id.Scope, d)
	if a.span != nil {
		a.span.SetAttribute("idem.decision", string(d))
	}
}

// keyHash names the record in logs without revealing the key.
func (a *attempt) keyHash() string { return a.id.LogHash() }

// release releases the key so a retry re-executes.
func (m *middleware) release(ctx context.Context, a *attempt) error {
	finish := &idemstore.FinishParams{Identity: a.id, Token: a.token}
	var err error
	m.finishStore(ctx, a, "release", func(ctx context.Context) error { err = m.store.KeyRelease(ctx, finish); return err })
	return err
}

// finishStore runs a fenced write after the handler on a context detached
// from the client's: a client that hangs up does not stop it.
func (m *middleware) finishStore(ctx context.Context, a *attempt, op string, f func(context.Context) error) {
	ctx = a.ops.arm(ctx, m.cfg.StoreTimeout)
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
func (a *attempt) rollback(ctx context.Context) {
	a.txOnce.Do(func() { a.txErr = idemstore.ErrNoTx }) // none may begin now
	if a.tx == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.m.cfg.StoreTimeout)
	defer cancel()
	if err := a.tx.Rollback(ctx); err != nil {
		a.m.log.Error("idem: rolling back the business transaction failed", "key_hash", a.keyHash(), "endpoint", a.id.Endpoint, "error", err)
	}
}
