package idem

import (
	"errors"
	"time"
)

// Problem codes: the short names carried in the "code" member of every
// problem+json answer and appended to Config.ProblemBaseURI to form "type".
const (
	CodeKeyMissing       = "key-missing"
	CodeKeyInvalid       = "key-invalid"
	CodeKeyReused        = "key-reused"
	CodeKeyInUse         = "key-in-use"
	CodeOutcomeUnknown   = "outcome-unknown"
	CodeNotReplayable    = "not-replayable"
	CodeBodyTooLarge     = "body-too-large"
	CodeStoreUnavailable = "store-unavailable"
	CodeTooManyKeys      = "too-many-keys"
	// CodeBodyUnreadable answers a request whose body could not be read
	// (the client went away or sent a broken body); nothing is stored.
	CodeBodyUnreadable = "body-unreadable"
	// CodeBodyTimeout answers 408 a request whose body did not arrive
	// within Config.BodyTimeout; nothing is stored.
	CodeBodyTimeout = "body-timeout"
	// CodeConflict is the Appstrate profile's code for a reused key.
	CodeConflict = "conflict"
	// CodeUnauthorized answers a request whose scope could not be determined.
	CodeUnauthorized = "unauthorized"
	// CodeResponseUntrusted answers 500 a request whose key completed but
	// whose stored response failed verification (see ErrResponseUntrusted).
	CodeResponseUntrusted = "response-untrusted"
)

// ErrKeyInvalid is wrapped by every error ParseKey returns. The wrapping
// error's text says why the key was refused and never contains the key, so it
// may be shown to clients.
var ErrKeyInvalid = errors.New("invalid Idempotency-Key")

// ErrLeaseLost is the cause (context.Cause) with which the context of a
// protected handler or Guard function is cancelled when its attempt gives
// up its lease, and the error CheckLease returns from then on: the lease
// could not be renewed until Config.LeaseMargin before its end, or another
// attempt holds the key. The attempt must start no effect after it: once
// its lease is gone, a retry may already be running the operation.
var ErrLeaseLost = errors.New("idem: the attempt's lease is lost")

// ErrNotTransactional is returned by RunPhases outside a request protected
// by a middleware in transactional mode.
var ErrNotTransactional = errors.New("idem: phases need a request in transactional mode")

// The errors Guard.Run (and Do) return when they do not run the function, or
// when its outcome could not be recorded. Adapters map them to their
// protocol (HTTP problem, gRPC status, message ack); they come wrapped in an
// *Error that carries a retry delay and the cause, and match with errors.Is.
var (
	// ErrKeyReused: the key was already used with another request (another
	// fingerprint). Retrying does not help; the caller must use a new key.
	ErrKeyReused = errors.New("idem: key reused with another request")
	// ErrInProgress: another attempt with the key holds the lease (or, in
	// transactional mode, this attempt lost it and rolled back). Retry after
	// Error.RetryAfter.
	ErrInProgress = errors.New("idem: an attempt with this key is in progress")
	// ErrOutcomeUnknown: an earlier attempt may or may not have had its
	// effect. The function is not run again until reconciliation settles
	// the record.
	ErrOutcomeUnknown = errors.New("idem: outcome of an earlier attempt unknown")
	// ErrNotReplayable: an earlier attempt completed, but its result was not
	// stored (too large, or marked so by the adapter). The function is
	// never run again for the key.
	ErrNotReplayable = errors.New("idem: earlier result not replayable")
	// ErrStoreUnavailable: the store failed or timed out before the
	// function ran (it did not run), or a transactional completion did not
	// commit (it had no effect). Retry after Error.RetryAfter.
	ErrStoreUnavailable = errors.New("idem: store unavailable")
	// ErrResponseUntrusted: an earlier attempt completed, but its stored
	// result failed verification (package idemcrypt: it does not
	// authenticate, or Config.EncryptionRequired refuses it as not sealed
	// in the current format). It is not returned, and the function is never
	// run again for the key: an operator looks at the record (its effect
	// happened, or the record was planted).
	ErrResponseUntrusted = errors.New("idem: stored result cannot be trusted")
	// ErrTooManyKeys: a per-scope limit (Config.MaxInProgressPerScope,
	// Config.NewKeysPerSecondPerScope) refused the new key; nothing was
	// stored.
	ErrTooManyKeys = errors.New("idem: too many keys for this scope")
	// ErrNotRecorded: the function ran and returned its result, which Run
	// returns with this error, but its outcome could not be written (the
	// store failed or the lease was taken over). Its effect may have
	// happened: the record turns unknown when its lease expires and is not
	// run again. An adapter that acknowledges work (a message consumer)
	// must not acknowledge it.
	ErrNotRecorded = errors.New("idem: outcome not recorded")
)

// Error is the error Guard.Run returns for a decision that did not run the
// function (and for ErrNotRecorded). Kind is one of the sentinels above and
// is safe to show to clients; Cause is for logs only (a store's error, the
// caller's context error) and may name internals, never keys or payloads.
type Error struct {
	// Kind is ErrKeyReused, ErrInProgress, ErrOutcomeUnknown,
	// ErrNotReplayable, ErrStoreUnavailable, ErrTooManyKeys,
	// ErrResponseUntrusted or ErrNotRecorded.
	Kind error
	// RetryAfter, when positive, is when a retry may get an answer: for
	// ErrInProgress an estimate of the remaining work (from the attempt's
	// progress, not the whole lease), for the others a fixed back-off.
	RetryAfter time.Duration
	// Cause is the underlying error, or nil.
	Cause error
}

// Error returns Kind's text, followed by the cause when there is one.
func (e *Error) Error() string {
	if e.Cause == nil {
		return e.Kind.Error()
	}
	return e.Kind.Error() + ": " + e.Cause.Error()
}

// Unwrap returns Kind and Cause, so errors.Is matches either.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}

// Code returns the problem code of Kind (CodeKeyReused, CodeKeyInUse, ...),
// as the HTTP middleware names it; "" for ErrNotRecorded, which has no
// answer of its own.
func (e *Error) Code() string {
	switch e.Kind {
	case ErrKeyReused:
		return CodeKeyReused
	case ErrInProgress:
		return CodeKeyInUse
	case ErrOutcomeUnknown:
		return CodeOutcomeUnknown
	case ErrNotReplayable:
		return CodeNotReplayable
	case ErrStoreUnavailable:
		return CodeStoreUnavailable
	case ErrTooManyKeys:
		return CodeTooManyKeys
	case ErrResponseUntrusted:
		return CodeResponseUntrusted
	}
	return ""
}
