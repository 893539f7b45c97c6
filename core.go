package idem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/deadline"
)

// core is the decision logic every adapter shares, the HTTP middleware and
// Guard alike: the reservation, the decision by the record's state (claim),
// waiting, the lease's heartbeat (renewer) and the recording of the outcome
// the after-the-function policy chose (record). It knows nothing of HTTP:
// an adapter turns its request into an attempt and the verdict into its
// protocol's answer.
type core struct {
	store   idemstore.Store
	waiter  idemstore.Waiter  // nil when the store cannot notify
	txStore idemstore.TxStore // set in transactional mode
	cfg     GuardConfig
	log     *slog.Logger
	hub     hub
	limits  *scopeLimits
	timed   bool // Metrics is not the no-op default: time store calls
	// clock is GuardConfig.Clock or the wall clock, and alarms the list of
	// alarms on it: store-call deadlines and lease renewals.
	clock  deadline.Clock
	alarms *deadline.Alarms
}

// newCore applies cfg's defaults and wraps store as every adapter uses it.
func newCore(store idemstore.Store, c *GuardConfig) *core {
	cfg := c.withDefaults()
	if cfg.EncryptionRequired && cfg.Keyring == nil {
		panic("idem: Config.EncryptionRequired needs a Keyring")
	}
	// Seals responses with the keyring, and without one refuses sealed
	// records rather than replaying ciphertext.
	if !offCrypt || cfg.Keyring != nil || cfg.EncryptionRequired {
		store = idemcrypt.NewWithConfig(store, &idemcrypt.Config{Keyring: cfg.Keyring, Required: cfg.EncryptionRequired})
	}
	if offMetrics {
		cfg.Metrics = nopMetrics{}
	}
	if offLogging {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	co := &core{store: store, cfg: cfg, log: cfg.Logger}
	co.clock, co.alarms = deadline.WallClock, deadline.Wall
	if cfg.Clock != nil {
		co.clock = cfg.Clock
		co.alarms = deadline.NewAlarms(cfg.Clock)
	}
	_, nop := cfg.Metrics.(nopMetrics)
	co.timed = !nop
	co.waiter, _ = store.(idemstore.Waiter)
	if cfg.Transactional {
		ts, ok := store.(idemstore.TxStore)
		if !ok {
			panic(fmt.Sprintf("idem: Config.Transactional needs a store that implements idemstore.TxStore; %T does not", store))
		}
		co.txStore = ts
	}
	if cfg.MaxInProgressPerScope > 0 || cfg.NewKeysPerSecondPerScope > 0 {
		co.limits = newScopeLimits(cfg.MaxInProgressPerScope, cfg.NewKeysPerSecondPerScope)
	}
	if cfg.FailOpen {
		co.log.Warn("idem: fail-open is enabled: requests run UNPROTECTED when the store is unavailable; never use this in production")
	}
	return co
}

// untrusted reports whether err refuses a completed record's stored
// response as untrustworthy: it does not authenticate (altered, moved from
// another record, planted from an earlier one) or, with
// Config.EncryptionRequired, it is not sealed in the current format. Such a
// record completed: it is never run again.
func untrusted(err error) bool {
	return err != nil && (errors.Is(err, idemcrypt.ErrOpen) || errors.Is(err, idemcrypt.ErrNotSealed))
}

// mayFailOpen reports whether a store error may run the request
// unprotected under Config.FailOpen: not when the store answered with a
// completed record whose response this process cannot open (a key missing
// from its keyring), whose request already ran.
func mayFailOpen(err error) bool {
	return !errors.Is(err, idemcrypt.ErrUnknownKey)
}

// attempt is one request's claim on a record.
type attempt struct {
	c           *core
	fpCached    bool      // fp came from the fingerprint cache, or went into it
	label       string    // the endpoint in Metrics, when the adapter sets one
	reserveSent time.Time // when the last reservation was sent, on the core's clock
	unknown     atomic.Bool
	rejected    atomic.Bool
	span        Span // nil without a Tracer
	// heartbeat is Call.Heartbeat: nil but for a Guard's caller that asked.
	heartbeat func()

	// Embedded so that one allocation serves the whole request.
	body []byte
	ops  deadline.Ctx // the context of the store calls
	// params is the reservation sent to the store, and holds the attempt's
	// identity, fingerprint and token (see id, fp and token): kept once,
	// the allocation is a size class smaller.
	params idemstore.ReserveParams
	// *execution is set when the request runs the handler.
	*execution
}

// id is the attempt's identity.
func (a *attempt) id() idemstore.Identity { return a.params.Identity }

// fp is the fingerprint of the attempt's request.
func (a *attempt) fp() string { return a.params.Fingerprint }

// token is the fencing token of the attempt's last reservation.
func (a *attempt) token() string { return a.params.Token }

// decision reports what the middleware decided for this request.
func (a *attempt) decision(d Decision) {
	a.c.cfg.Metrics.Decision(a.metricsEndpoint(), a.id().Scope, d)
	if a.span != nil {
		a.span.SetAttribute("idem.decision", string(d))
	}
}

// metricsEndpoint is the endpoint label of the attempt in Metrics, logs
// and spans: the adapter's label (the HTTP middleware's, never a raw path
// by default, which may carry a secret), else the endpoint, which Guard's
// callers name. The record keeps the endpoint; key_hash names it.
func (a *attempt) metricsEndpoint() string {
	if a.label != "" {
		return a.label
	}
	return a.id().Endpoint
}

// keyHash names the record in logs without revealing the key.
func (a *attempt) keyHash() string { return a.id().LogHash() }

// verdict is what claim decided for an attempt.
type verdict struct {
	d Decision
	// rec is the reserved record (DecisionCreated, DecisionReleasedRetried)
	// or the completed record to replay (DecisionReplayed).
	rec *idemstore.Record
	// retry is the Retry-After of a refusal, in whole seconds.
	retry int
	// err is the store's error (DecisionStoreError), or the caller's
	// context error when it gave up waiting (DecisionInProgress, which
	// claim then does not report to Metrics: an adapter that still answers
	// reports it).
	err error
	// held reports that the attempt holds a per-scope in-progress slot,
	// which the caller returns with limits.done when the attempt ends.
	held bool
}

// runs reports whether the attempt holds the lease and runs the function.
func (v *verdict) runs() bool {
	return v.d == DecisionCreated || v.d == DecisionReleasedRetried
}

// claim reserves the attempt's key and decides, by the record's state, what
// the adapter does: run the function (the attempt holds the lease), replay,
// or refuse. In wait mode it blocks on an in-progress record up to
// Config.Wait. It reports the decision to Metrics and the span, and logs
// the refusals that deserve a line.
func (c *core) claim(ctx context.Context, a *attempt) (v verdict) {
	if c.limits == nil {
		return c.claimKey(ctx, a)
	}
	ok, retry := c.limits.admit(a.id().Scope, c.clock.Now())
	if !ok {
		a.decision(DecisionTooManyKeys)
		return verdict{d: DecisionTooManyKeys, retry: retry}
	}
	defer func() {
		if v.runs() {
			v.held = true
		} else {
			c.limits.refund(a.id().Scope)
		}
	}()
	return c.claimKey(ctx, a)
}

// claimKey is claim past the per-scope limits. Its one defer, outside the
// loop, is open-coded (a defer in a loop, or two defers in a function of
// this many returns, make the compiler run every defer of the function
// through the runtime's defer records, a hundred instructions on every
// call, a replay's too).
func (c *core) claimKey(ctx context.Context, a *attempt) verdict {
	var waitOver <-chan struct{}
	var stopWait func() bool // set once claimKey waits
	defer func() {
		if stopWait != nil {
			stopWait()
		}
	}()
	for {
		res, err := c.reserve(ctx, a)
		if untrusted(err) {
			a.decision(DecisionUntrusted)
			c.log.Error("idem: stored response refused: it cannot be trusted, so it is not replayed and the request is not run again",
				"key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "untrusted", "error", err)
			return verdict{d: DecisionUntrusted, err: err}
		}
		if err != nil {
			a.decision(DecisionStoreError)
			if !c.cfg.FailOpen || !mayFailOpen(err) { // the adapter logs the bypass
				c.log.Error("idem: store unavailable", "op", "reserve", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "store_error", "error", err)
			}
			return verdict{d: DecisionStoreError, retry: 1, err: err}
		}
		rec := res.Record
		if res.Reserved {
			d := DecisionCreated
			if rec.Attempts > 1 {
				d = DecisionReleasedRetried
			}
			a.decision(d)
			return verdict{d: d, rec: rec}
		}
		if rec.Fingerprint != a.fp() {
			a.decision(DecisionKeyReused)
			c.log.Info("idem: key reused with another request", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "key_reused")
			return verdict{d: DecisionKeyReused}
		}
		switch rec.State {
		case idemstore.StateCompleted:
			if rec.NotReplayable || rec.Response == nil {
				a.decision(DecisionNotReplayable)
				return verdict{d: DecisionNotReplayable}
			}
			a.decision(DecisionReplayed)
			return verdict{d: DecisionReplayed, rec: rec}
		case idemstore.StateUnknown:
			a.decision(DecisionUnknown)
			c.log.Info("idem: outcome unknown", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "unknown")
			return verdict{d: DecisionUnknown, retry: c.unknownRetryAfter()}
		}
		// In progress (or released but not re-claimable, which a correct
		// store never returns with a matching fingerprint).
		if c.cfg.Wait <= 0 {
			a.decision(DecisionInProgress)
			return verdict{d: DecisionInProgress, retry: retryAfter(c.clock.Now(), rec)}
		}
		if waitOver == nil {
			waitOver, stopWait = c.after(c.cfg.Wait)
		}
		if !c.wait(ctx, a, rec, waitOver) {
			if err := ctx.Err(); err != nil {
				return verdict{d: DecisionInProgress, retry: retryAfter(c.clock.Now(), rec), err: err}
			}
			a.decision(DecisionInProgress)
			return verdict{d: DecisionInProgress, retry: retryAfter(c.clock.Now(), rec)}
		}
	}
}

func (c *core) reserve(ctx context.Context, a *attempt) (res *idemstore.ReserveResult, err error) {
	a.params.Token = newToken()
	// The lease counts from here: the store counts it from when it gets
	// the call, which is no earlier.
	a.reserveSent = c.clock.Now()
	if !offDeadlines {
		// The timeout counts from reserveSent too (alarms is on the
		// same clock): the memory store's look at it reads no clock.
		ctx = a.ops.ArmAt(c.alarms, ctx, c.cfg.StoreTimeout, a.reserveSent)
		defer a.ops.Disarm()
	}
	ctx, end := c.span(ctx, "idem.reserve")
	// On the wall clock, the reading of reserveSent times the call too:
	// one clock reading a request fewer.
	start := a.reserveSent
	if c.cfg.Clock != nil {
		start = c.clockStart()
	}
	defer func() {
		c.storeCall("reserve", start, err)
		end(err)
	}()
	expired := idemstore.StateUnknown
	if c.txStore != nil {
		expired = idemstore.StateReleased
	}
	a.params.Lease, a.params.TTL, a.params.LeaseExpiredState = c.cfg.Lease, c.cfg.TTL, expired
	return c.store.KeyReserve(ctx, &a.params)
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

func (c *core) unknownRetryAfter() int {
	return max(int(c.cfg.Lease/time.Second), 1)
}

// begin starts the execution of an attempt that holds the lease on rec:
// the heartbeat, and the context the function runs with (ctx, carrying the
// attempt and, in transactional mode, the business transaction), which is
// cancelled with cause ErrLeaseLost when the attempt gives up its lease
// (see renewer). The caller stops the heartbeat (a.renewer.stop) when the
// function returns, which cancels that context.
func (a *attempt) begin(ctx context.Context, rec *idemstore.Record) context.Context {
	a.execution = new(execution)
	a.reserved = rec
	hctx, cancel := context.WithCancelCause(ctx)
	a.renewer.start(a, a.reserveSent, cancel)
	a.recoveryPoint = rec.RecoveryPoint
	a.hctx = attemptCtx{Context: hctx, a: a}
	var fctx context.Context = &a.hctx
	if a.c.txStore != nil {
		fctx = idemstore.ContextWithTx(fctx, a.beginTx(context.WithoutCancel(ctx)))
	}
	return fctx
}

// errCommitReleased marks a transactional completion whose commit failed
// after which the key was released.
var errCommitReleased = errors.New("commit failed, key released")

// record writes the outcome the after-the-function policy chose
// (afterHandler): in transactional mode a completion commits with the
// business transaction, and every other outcome rolls it back first. p is
// the completion, needed only when o completes the record. The writes use
// a context detached from ctx's cancellation.
//
// It returns the store's error, already logged. After a completion in
// transactional mode an error means nothing was committed and the key was
// released (idemstore.ErrLeaseLost: a newer attempt holds it); after any
// other write, the record is left as it was, and turns unknown when the
// lease expires.
func (c *core) record(ctx context.Context, a *attempt, o outcome, p *idemstore.CompleteParams) error {
	if o.rollback {
		a.rollback(ctx)
	}
	switch o.record {
	case recordDropped:
		finish := &idemstore.FinishParams{Identity: a.id(), Token: a.token()}
		return c.finishStore(ctx, a, "delete", func(ctx context.Context) error { return c.store.KeyDelete(ctx, finish) })
	case recordUnknown:
		finish := &idemstore.FinishParams{Identity: a.id(), Token: a.token()}
		return c.finishStore(ctx, a, "mark_unknown", func(ctx context.Context) error { return c.store.KeyMarkUnknown(ctx, finish) })
	case recordReleased:
		return c.release(ctx, a)
	}
	if c.txStore != nil {
		return c.completeTx(ctx, a, p)
	}
	return c.finishStore(ctx, a, "complete", func(ctx context.Context) error { return c.store.KeyComplete(ctx, p) })
}

// release releases the key so a retry re-executes.
func (c *core) release(ctx context.Context, a *attempt) error {
	finish := &idemstore.FinishParams{Identity: a.id(), Token: a.token()}
	return c.finishStore(ctx, a, "release", func(ctx context.Context) error { return c.store.KeyRelease(ctx, finish) })
}

// completeTx writes the completion in the business transaction and commits
// it. When that fails nothing took effect: the key is released (unless a
// newer attempt holds it) and the error says why.
func (c *core) completeTx(ctx context.Context, a *attempt, p *idemstore.CompleteParams) error {
	cctx, cancel := deadline.WithTimeout(c.alarms, ctx, c.cfg.StoreTimeout)
	defer cancel()
	cctx, end := c.span(cctx, "idem.complete")
	tx, err := a.beginTx(context.WithoutCancel(ctx))()
	if err == nil {
		err = tx.KeyComplete(cctx, p)
		if err == nil {
			start := c.clockStart()
			err = tx.Commit(cctx)
			c.storeCall("commit", start, err)
			if err != nil {
				// Releasing is safe whatever the commit did: the release is
				// fenced on an in_progress record, and a committed
				// completion is not in progress any more.
				if c.release(ctx, a) == nil {
					err = fmt.Errorf("%w: %w", errCommitReleased, err)
				}
			}
		} else {
			a.rollback(ctx)
		}
	}
	end(err)
	switch {
	case err == nil:
	case errors.Is(err, idemstore.ErrLeaseLost):
		c.log.Warn("idem: lease lost before commit; the transaction was rolled back", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint())
	default:
		c.log.Error("idem: committing the business transaction failed", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "store_error", "error", err)
		if !errors.Is(err, errCommitReleased) {
			c.release(ctx, a)
		}
	}
	return err
}

// finishStore runs a fenced write after the function on a context detached
// from ctx's cancellation: a client that hangs up does not stop it. It
// logs a failure and returns it.
func (c *core) finishStore(ctx context.Context, a *attempt, op string, f func(context.Context) error) error {
	var sctx context.Context
	if offDeadlines {
		sctx = context.WithoutCancel(ctx)
	} else {
		sctx = a.ops.Arm(c.alarms, ctx, c.cfg.StoreTimeout)
		defer a.ops.Disarm()
	}
	sctx, end := c.span(sctx, "idem.complete")
	start := c.clockStart()
	err := f(sctx)
	c.storeCall(op, start, err)
	end(err)
	switch {
	case err == nil:
	case errors.Is(err, idemstore.ErrLeaseLost):
		c.log.Warn("idem: lease lost before the attempt finished; its outcome was not recorded", "op", op, "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint())
	default:
		c.log.Error("idem: recording the outcome failed; the lease will expire to unknown", "op", op, "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "decision", "store_error", "error", err)
	}
	return err
}

// beginTx returns the function that begins the request's business
// transaction once, on first use.
func (a *attempt) beginTx(ctx context.Context) func() (idemstore.Tx, error) {
	return func() (idemstore.Tx, error) {
		a.txOnce.Do(func() {
			a.tx, a.txErr = a.c.txStore.KeyBeginTx(ctx)
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
	ctx, cancel := deadline.WithTimeout(a.c.alarms, ctx, a.c.cfg.StoreTimeout)
	defer cancel()
	if err := a.tx.Rollback(ctx); err != nil {
		a.c.log.Error("idem: rolling back the business transaction failed", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "error", err)
	}
}

// span starts a child span when tracing is on; the returned end is never nil.
func (c *core) span(ctx context.Context, name string) (context.Context, func(error)) {
	if c.cfg.Tracer == nil {
		return ctx, func(error) {}
	}
	ctx, s := c.cfg.Tracer.Start(ctx, name)
	return ctx, s.End
}

// clockStart starts timing a store call, when there are Metrics to tell.
// The wall clock, not Config.Clock: a latency is measured, not decided.
func (c *core) clockStart() time.Time {
	if !c.timed {
		return time.Time{}
	}
	return time.Now()
}

// storeCall reports a store call started at start to Metrics.
func (c *core) storeCall(op string, start time.Time, err error) {
	if c.timed {
		c.cfg.Metrics.StoreCall(op, time.Since(start), err)
	}
}

// newToken returns a fresh fencing token: 128 bits from the runtime's
// ChaCha8 generator, seeded from the operating system, in 32 hex digits. A
// token must be unique, not secret: only this server writes to the store
// with it, and a store compares it only with the tokens it handed out. It
// may leave the server (idem proxy sends it upstream in HeaderAttempt),
// since knowing it lets nobody else write a record. Every reservation
// makes one, a replay's too.
func newToken() string {
	var h [32]byte
	putHex64(h[:16], rand.Uint64())
	putHex64(h[16:], rand.Uint64())
	return string(h[:])
}

// putHex64 writes v into b[:16] in lower-case hex, most significant digit
// first, as hex.Encode writes v's big-endian bytes, eight digits at a time
// (hex.Encode takes a few hundred instructions for 16 bytes).
func putHex64(b []byte, v uint64) {
	binary.BigEndian.PutUint64(b[:8], hexDigits(uint32(v>>32)))
	binary.BigEndian.PutUint64(b[8:16], hexDigits(uint32(v)))
}

// hexDigits returns v's eight hex digits in ASCII, one a byte, the most
// significant in the top byte.
func hexDigits(v uint32) uint64 {
	// Spread the nibbles out, one to each byte.
	x := uint64(v)
	x = (x | x<<16) & 0x0000ffff0000ffff
	x = (x | x<<8) & 0x00ff00ff00ff00ff
	x = (x | x<<4) & 0x0f0f0f0f0f0f0f0f
	// A nibble n is '0'+n, or 'a'+n-10 = '0'+n+39 when n > 9: letters has
	// 1 in the bytes of those.
	letters := (x + 0x0606060606060606) >> 4 & 0x0101010101010101
	return x + 0x3030303030303030 + letters*39
}
