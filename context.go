package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"

	"github.com/idem-dev/idem/idemstore"
)

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

// CheckLease reports whether the protected request in ctx still holds its
// lease, on the middleware's clock: nil while it does, ErrLeaseLost once
// its attempt gave up the lease (see Config.LeaseMargin) or the clock says
// it should have, even when the process was paused and its alarms have not
// caught up yet. A handler calls it immediately before an effect it cannot
// take back (idem proxy calls it before every write of the request to the
// upstream), and starts no effect when it fails. Outside a protected
// request it returns nil.
func CheckLease(ctx context.Context) error {
	a := attemptFrom(ctx)
	if a == nil || a.execution == nil {
		return nil
	}
	return a.renewer.check()
}

// AfterLeaseLost arranges for f to run once, in a goroutine of its own,
// when the attempt of the protected request in ctx gives up its lease while
// its handler runs (at once if it has already): the moment the handler's
// context is cancelled with cause ErrLeaseLost. It is for work the handler
// detached from its context's cancellation and must still end when the
// lease is gone: idem proxy's upstream call outlives a client that hangs up,
// but not the lease. It reports false, and f never runs, outside a
// protected request or once the handler has returned. f may run just after
// the handler returned, when the lease was given up as it did.
func AfterLeaseLost(ctx context.Context, f func()) bool {
	a := attemptFrom(ctx)
	if a == nil || a.execution == nil {
		return false
	}
	return a.renewer.afterLost(f)
}

// FencingTokenFromContext returns the fencing token of the protected
// request's attempt: a new random value for every attempt that reserves the
// key, and the one that fences its writes to the store. Sent to a
// downstream (idem proxy sends it in the HeaderAttempt request header), it
// lets the downstream tell attempts apart and refuse a stale one.
func FencingTokenFromContext(ctx context.Context) (string, bool) {
	a := attemptFrom(ctx)
	if a == nil {
		return "", false
	}
	return a.token(), true
}

// KeyFromContext returns the idempotency key of the protected request.
func KeyFromContext(ctx context.Context) (string, bool) {
	a := attemptFrom(ctx)
	if a == nil {
		return "", false
	}
	return a.id().Key, true
}

// DerivedKeyFromContext returns a stable key for an external call named name
// made on behalf of the protected request in ctx: DeriveKey of the request's
// identity. The same scope, endpoint, client key and name always give the
// same value, so a downstream that honours its own Idempotency-Key
// deduplicates retries. It returns "" outside a protected request.
func DerivedKeyFromContext(ctx context.Context, name string) string {
	a := attemptFrom(ctx)
	if a == nil {
		return ""
	}
	return DeriveKey(a.id(), name)
}

// DeriveKey returns the stable key of the external call named name made on
// behalf of the record id, for workers outside a request (a reconciler
// asking the downstream, say). Within a request, DerivedKeyFromContext gives
// the same value.
func DeriveKey(id idemstore.Identity, name string) string {
	h := sha256.New()
	io.WriteString(h, id.Hash())
	io.WriteString(h, name)
	return "idem-" + hex.EncodeToString(h.Sum(nil))[:40]
}
