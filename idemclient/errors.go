package idemclient

import (
	"errors"
	"fmt"
)

var (
	// ErrRetriesExhausted is matched (with errors.Is) by the error Do returns
	// when the last attempt failed and RetryMax or MaxElapsed forbade another.
	ErrRetriesExhausted = errors.New("idemclient: retries exhausted")
	// ErrInvalidKey is returned by Do when the key from WithKey or NewKey is
	// not 1 to 255 visible ASCII characters (see WithKey).
	ErrInvalidKey = errors.New("idemclient: invalid idempotency key")
)

// Error is the error Do returns when it has no response to give. It carries
// the key that was sent, so the caller can retry the same logical call later
// with WithKey, and unwraps to the cause (a transport error, the context's
// error, an error from CheckRetry) and, when retries ran out, to
// ErrRetriesExhausted.
type Error struct {
	// Method and URL name the request.
	Method, URL string
	// Key is the idempotency key sent on every attempt; empty for requests
	// sent without a key.
	Key string
	// Attempts is how many times the request was sent.
	Attempts int
	// Exhausted reports that the attempts or the time budget ran out.
	Exhausted bool
	// Err is the cause.
	Err error
}

// Error implements error. It never contains the key.
func (e *Error) Error() string {
	what := "failed"
	if e.Exhausted {
		what = "giving up"
	}
	return fmt.Sprintf("idemclient: %s %s: %s after %d attempt(s): %v", e.Method, e.URL, what, e.Attempts, e.Err)
}

// Unwrap returns the cause and, when retries ran out, ErrRetriesExhausted.
func (e *Error) Unwrap() []error {
	if e.Exhausted {
		return []error{e.Err, ErrRetriesExhausted}
	}
	return []error{e.Err}
}
