// Package idemstore is the contract between the idem middleware, its background
// workers and the store drivers (idemsqlite, idempgx, idemredis, idemmem).
//
// It depends on the standard library only, so drivers and workers can import
// it without pulling in the middleware. Every driver must pass the conformance
// suite in package idemtest.
package idemstore

import (
	"context"
	"net/http"
	"time"
	"unicode/utf8"
)

// State is the lifecycle state of an idempotency record.
type State string

const (
	// StateInProgress means an attempt holds a live lease on the record.
	StateInProgress State = "in_progress"
	// StateCompleted means the response is stored (or the record is marked
	// not replayable) and every retry is answered from it.
	StateCompleted State = "completed"
	// StateReleased means the last attempt certainly had no effect: the next
	// request with the same fingerprint may execute again.
	StateReleased State = "released"
	// StateUnknown means an attempt may or may not have had its effect. The
	// record is never re-executed by a client; reconciliation resolves it.
	StateUnknown State = "unknown"
)

// Valid reports whether s is one of the four states.
func (s State) Valid() bool {
	switch s {
	case StateInProgress, StateCompleted, StateReleased, StateUnknown:
		return true
	}
	return false
}

// Identity names a record: the same key in another scope or on another
// endpoint is a different record.
type Identity struct {
	// Scope is the tenant or principal the key belongs to (from auth, never
	// from the body). It may be empty for single-tenant services.
	Scope string
	// Endpoint is the method and route pattern, e.g. "POST /v1/payments".
	Endpoint string
	// Key is the client's Idempotency-Key value.
	Key string
}

// Response is a stored HTTP response.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Sealed, when not empty, says that Body holds the header and body
	// sealed at rest (package idemcrypt), and names the seal's format and
	// key: "v2 NAME". Header is then empty. Stores keep it with the record
	// as they keep Header.
	Sealed string
}

// Record is the stored state of one idempotency key.
type Record struct {
	Identity
	// Fingerprint is the hex SHA-256 of the request (see idem.Fingerprint).
	Fingerprint string
	State       State
	// Token is the fencing token of the attempt that last held the lease.
	Token string
	// LockedUntil is the end of the current lease (meaningful in_progress).
	LockedUntil time.Time
	// StartedAt is when the current (or last) attempt reserved the record.
	StartedAt time.Time
	// LeaseExpiredState is the state an expired in_progress lease turns into:
	// StateUnknown outside transactions, StateReleased in transactional mode
	// and for phased operations (which then resume at RecoveryPoint).
	LeaseExpiredState State
	// Response is the stored response of a completed, replayable record.
	Response *Response
	// NotReplayable marks a completed record whose response was streamed or
	// too large to store: a retry gets 409 not-replayable.
	NotReplayable bool
	// RecoveryPoint is the last committed phase of a phased operation.
	RecoveryPoint string
	// Attempts counts the executions started for this record.
	Attempts  int
	CreatedAt time.Time
	UpdatedAt time.Time
	// ExpiresAt is the end of retention: past it a settled record is gone.
	// An unknown record never expires (see Store); when it is settled its
	// retention starts again: ExpiresAt = then + TTL.
	ExpiresAt time.Time
	// TTL is the retention the record was reserved with (ReserveParams.TTL).
	TTL time.Duration

	// ReconcileAfter is when the reconciler may next ask about the record
	// while it is unknown (KeyReconcileClaim); zero means at once.
	ReconcileAfter time.Time
	// ReconcileAttempts counts the failed reconciliation attempts of the
	// current unknown outcome (KeyReconcileFail). A new attempt of the
	// request (a reservation) starts the reconciliation state afresh.
	ReconcileAttempts int
	// ReconcileError is the last failed attempt's error, at most
	// MaxReconcileError bytes.
	ReconcileError string
}

// MaxReconcileError bounds Record.ReconcileError in bytes; stores cut a
// longer error with TruncateReconcileError.
const MaxReconcileError = 256

// TruncateReconcileError returns s cut to at most MaxReconcileError bytes,
// on a UTF-8 boundary, with "…" marking the cut.
func TruncateReconcileError(s string) string {
	if len(s) <= MaxReconcileError {
		return s
	}
	const mark = "…"
	n := MaxReconcileError - len(mark)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + mark
}

// Expired reports whether r is gone at now: past its ExpiresAt and not
// unknown. An unknown record (or an in_progress one whose expired lease
// turns unknown) never expires.
func (r *Record) Expired(now time.Time) bool {
	if now.Before(r.ExpiresAt) {
		return false
	}
	if r.State == StateUnknown {
		return false
	}
	return !(r.LeaseExpired(now) && r.LeaseExpiredState != StateReleased)
}

// LeaseExpired reports whether r is in_progress with a lease that ended at or
// before now.
func (r *Record) LeaseExpired(now time.Time) bool {
	return r.State == StateInProgress && !now.Before(r.LockedUntil)
}

// ReserveParams are the inputs of Store.KeyReserve.
type ReserveParams struct {
	Identity
	Fingerprint string
	// Token is a new random fencing token for this attempt.
	Token string
	// Lease is the lease length; LockedUntil = now + Lease.
	Lease time.Duration
	// TTL is the retention; ExpiresAt = now + TTL for a new record.
	TTL time.Duration
	// LeaseExpiredState is stored on a new record (StateUnknown or
	// StateReleased); see Record.LeaseExpiredState.
	LeaseExpiredState State
}

// ReserveResult is the outcome of Store.KeyReserve.
type ReserveResult struct {
	// Reserved reports that this attempt now holds the lease (a new record,
	// or a takeover of a released record or of an expired lease whose
	// LeaseExpiredState is StateReleased).
	Reserved bool
	// Record is the record after the call. When Reserved is false it is the
	// existing record, as the caller must answer from it; the caller compares
	// its Fingerprint. An in_progress record found with an expired lease whose
	// LeaseExpiredState is StateUnknown is returned (and stored) as unknown.
	//
	// The Record is read-only for the caller: a store may share its
	// Response (headers and body) with its own memory and with other
	// callers, so that a replay copies nothing it does not have to. A
	// caller that hands the headers on to code that may modify them copies
	// them first. Records from the other methods belong to the caller.
	// idemtest.CheckReserveResults fails a test in which the caller, or the
	// store, changes a record after it was returned.
	Record *Record
}

// CompleteParams are the inputs of Store.KeyComplete.
type CompleteParams struct {
	Identity
	Token string
	// Response is stored unless NotReplayable is set.
	Response      *Response
	NotReplayable bool
	// Record, when not nil, is the record as the attempt reserved it.
	// Stores ignore it. A wrapper that binds the stored response to its
	// record (idemcrypt seals the fingerprint and the creation time with
	// it) takes them from Record instead of reading the record first.
	Record *Record
}

// FinishParams name an attempt by its record and fencing token, for
// KeyRelease, KeyMarkUnknown and KeyDelete.
type FinishParams struct {
	Identity
	Token string
}

// RenewParams are the inputs of Store.KeyRenew.
type RenewParams struct {
	Identity
	Token string
	// Lease is the new lease length from now.
	Lease time.Duration
}

// ResolveParams are the inputs of Store.KeyResolve, used by reconcilers and
// operators to settle an unknown record.
type ResolveParams struct {
	Identity
	// Token must equal the record's current token (as read by the caller),
	// so a resolution based on stale information fails with ErrLeaseLost.
	Token string
	// To is StateCompleted or StateReleased.
	To State
	// Response is stored when To is StateCompleted; nil means not replayable.
	Response *Response
	// Record, when not nil, is the record as the caller read it (see
	// CompleteParams.Record). Stores ignore it.
	Record *Record
}

// SweepParams are the inputs of Store.KeySweep.
type SweepParams struct {
	// Limit bounds the batch. Defaults to 1000 when zero.
	Limit int
}

// ReapParams are the inputs of Store.KeyReap.
type ReapParams struct {
	// Limit bounds the batch. Defaults to 1000 when zero.
	Limit int
}

// PurgeParams are the inputs of Store.KeyPurge.
type PurgeParams struct {
	Identity
	// Token, when not empty, must equal the record's token (as the operator
	// read it), else ErrLeaseLost: the purge then names the record the
	// operator looked at.
	Token string
	// Force allows purging a record that is unknown or in_progress: the
	// operator accepts that the next request with the key executes again,
	// although an earlier attempt may have had (or may still have) its
	// effect.
	Force bool
}

// ReconcileClaimParams are the inputs of Store.KeyReconcileClaim.
type ReconcileClaimParams struct {
	// Limit bounds the batch. Defaults to 100 when zero.
	Limit int
	// Hold is how long the claimed records are withheld from other
	// claimers: ReconcileAfter = now + Hold. It should outlast one
	// reconciliation pass.
	Hold time.Duration
	// Grace, when positive, withholds the records whose lease ended less
	// than Grace ago: a record is claimed only once now is at or after
	// LockedUntil + Grace, so that nobody asks the downstream about an
	// operation it may still be acting on (or about to receive). Zero
	// withholds none, whatever their LockedUntil.
	Grace time.Duration
}

// ReconcileFailParams are the inputs of Store.KeyReconcileFail.
type ReconcileFailParams struct {
	Identity
	// Token must equal the record's token (as claimed), else ErrLeaseLost.
	Token string
	// Error is the failure, stored cut to MaxReconcileError bytes; empty
	// when the reconciler could not tell yet without failing.
	Error string
	// Delay is the backoff: ReconcileAfter = now + Delay.
	Delay time.Duration
}

// Backlog is the result of Store.KeyBacklog.
type Backlog struct {
	// Unknown is the number of records stored as unknown.
	Unknown int
	// OldestUnknownSince is when the oldest of them turned unknown (its
	// UpdatedAt); zero when there is none.
	OldestUnknownSince time.Time
}

// ListParams filter Store.KeyList. Zero fields do not filter.
type ListParams struct {
	State    State
	Scope    string
	Endpoint string
	// CreatedBefore keeps records created strictly before it.
	CreatedBefore time.Time
	// After is a cursor: the Identity of the last record of the previous page.
	After *Identity
	// Limit bounds the page. Defaults to 100 when zero.
	Limit int
}

// Store is the contract every idem store implements.
//
// Every method that finishes an attempt (KeyComplete, KeyRelease,
// KeyMarkUnknown, KeyDelete, KeyRenew) is conditional on the fencing token and
// returns ErrLeaseLost when the record no longer belongs to that attempt.
// Errors other than the sentinels in this package mean the store is
// unavailable: the middleware fails closed on them.
//
// Time comes from the store's clock, never from the caller's parameters.
//
// Retention: a completed or released record past its ExpiresAt is gone (see
// Record.Expired). An unknown record is never gone while unresolved: every
// method treats it as live past its ExpiresAt, KeyReap never deletes it, and
// no backend TTL removes it. It leaves unknown only by being settled
// (KeyComplete by the late true outcome, KeyRelease, KeyResolve), which
// restarts its retention (ExpiresAt = now + TTL), or by KeyPurge with Force.
//
// Reconciliation state (added with KeyPurge, KeyReconcileClaim,
// KeyReconcileFail and KeyBacklog): every record carries ReconcileAfter,
// ReconcileAttempts and ReconcileError, reset by a reservation that starts a
// new attempt, so that any process can carry on reconciling where another
// stopped.
type Store interface {
	// KeyReserve atomically inserts a new in_progress record or takes over a
	// released one (or an expired lease that turns released), and otherwise
	// returns the existing record. It never checks then inserts. An expired
	// record (Record.Expired) is treated as absent and replaced. A new
	// attempt (insert or takeover) stores p.TTL and starts the
	// reconciliation state afresh.
	KeyReserve(ctx context.Context, p *ReserveParams) (*ReserveResult, error)
	// KeyGet returns the record, or ErrNotFound (also when expired). An
	// in_progress record with an expired lease is reported in the state it
	// turns into (without writing).
	KeyGet(ctx context.Context, id Identity) (*Record, error)
	// KeyComplete stores the response and moves the record to completed. It
	// succeeds when the token matches and the state is in_progress or
	// unknown (a late but true outcome settles an unknown record).
	KeyComplete(ctx context.Context, p *CompleteParams) error
	// KeyRelease moves the record to released (from in_progress or unknown)
	// when the token matches. The recovery point is kept.
	KeyRelease(ctx context.Context, p *FinishParams) error
	// KeyMarkUnknown moves an in_progress record to unknown when the token
	// matches.
	KeyMarkUnknown(ctx context.Context, p *FinishParams) error
	// KeyDelete removes the record when the token matches and it is
	// in_progress: the request was rejected before any effect.
	KeyDelete(ctx context.Context, p *FinishParams) error
	// KeyRenew extends the lease of an in_progress record when the token
	// matches and the lease has not been taken over.
	KeyRenew(ctx context.Context, p *RenewParams) error
	// KeyResolve settles an unknown record to completed or released. It
	// returns ErrLeaseLost when the token differs and ErrInvalidState when the
	// record is not unknown.
	KeyResolve(ctx context.Context, p *ResolveParams) error
	// KeySweep turns in_progress records whose lease expired into their
	// LeaseExpiredState, at most p.Limit of them, and returns them.
	KeySweep(ctx context.Context, p *SweepParams) ([]*Record, error)
	// KeyReap deletes at most p.Limit expired records (Record.Expired:
	// never an unknown one) and returns how many it deleted.
	KeyReap(ctx context.Context, p *ReapParams) (int, error)
	// KeyList returns records ordered by (Scope, Endpoint, Key).
	KeyList(ctx context.Context, p *ListParams) ([]*Record, error)

	// KeyPurge deletes a record for an operator and returns it as it was.
	// A completed or released record is deleted as asked; an unknown
	// record (or an in_progress one whose expired lease turns unknown) or
	// an in_progress record with a live lease only with p.Force, else
	// ErrInvalidState. It returns ErrNotFound when there is no live record
	// and ErrLeaseLost when p.Token is set and differs.
	KeyPurge(ctx context.Context, p *PurgeParams) (*Record, error)
	// KeyReconcileClaim claims up to p.Limit records stored as unknown whose
	// ReconcileAfter is at or before now (and, with a positive p.Grace,
	// whose LockedUntil + p.Grace is too), earliest ReconcileAfter first: it
	// sets their ReconcileAfter to now + p.Hold and returns them. While the
	// hold lasts no other claim returns them, so concurrent reconcilers
	// never ask about the same record at once. (An in_progress record whose
	// lease expired is claimed once KeySweep or a reservation has turned it
	// unknown.)
	KeyReconcileClaim(ctx context.Context, p *ReconcileClaimParams) ([]*Record, error)
	// KeyReconcileFail records an attempt that left the record unknown:
	// ReconcileAttempts+1, ReconcileError = p.Error (cut to
	// MaxReconcileError bytes), ReconcileAfter = now + p.Delay. It returns
	// ErrLeaseLost when the token differs or the record is not unknown.
	KeyReconcileFail(ctx context.Context, p *ReconcileFailParams) error
	// KeyBacklog counts the records stored as unknown, across every
	// process using the store, and reports the oldest.
	KeyBacklog(ctx context.Context) (*Backlog, error)
}

// Waiter is implemented by stores that can tell a waiting request that a
// record may have changed (PostgreSQL LISTEN/NOTIFY, Redis pub/sub). KeyWait
// returns when the record identified by id may have changed, or with ctx's
// error. Spurious wake-ups are allowed.
type Waiter interface {
	KeyWait(ctx context.Context, id Identity) error
}
