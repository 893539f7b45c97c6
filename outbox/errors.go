package outbox

import "errors"

var (
	// ErrNotFound is returned when no message has the id (or, for
	// MessageRedrive, no dead message has it).
	ErrNotFound = errors.New("outbox: message not found")
	// ErrClaimLost is returned by MessageFinish and MessageUnclaim when the
	// message is no longer claimed by the attempt: its claim expired and
	// another relay took it over, or its outcome was already recorded.
	ErrClaimLost = errors.New("outbox: claim lost")
	// ErrDuplicate is returned by Enqueue when a message with the same topic
	// and idempotency key exists: the operation was already enqueued.
	ErrDuplicate = errors.New("outbox: duplicate topic and idempotency key")
	// ErrInvalidMessage is returned by Enqueue for a message without a topic
	// or key, with an over-long one, or with a payload that is not JSON.
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrInFlight is wrapped by the error of HTTPOutcome when the downstream
	// answered 409 key-in-use: an earlier attempt with the same key is still
	// running there. It is worth a retry, but a caller that gives up must
	// treat the operation as possibly done, never as refused.
	ErrInFlight = errors.New("outbox: the downstream is still running an earlier attempt")
)
