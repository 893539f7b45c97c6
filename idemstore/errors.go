package idemstore

import "errors"

var (
	// ErrNotFound is returned when no live record has the identity.
	ErrNotFound = errors.New("idemstore: record not found")
	// ErrLeaseLost is returned when a fenced write finds that the record no
	// longer belongs to the attempt's token, or not in a state it may change.
	ErrLeaseLost = errors.New("idemstore: lease lost")
	// ErrInvalidState is returned when KeyResolve finds a record that is not
	// unknown, or is asked to resolve to a state other than completed or
	// released.
	ErrInvalidState = errors.New("idemstore: invalid state for this operation")
	// ErrNoTx is returned by TxFromContext outside a transactional request.
	ErrNoTx = errors.New("idemstore: no transaction in this context (the route is not in transactional mode)")
)
