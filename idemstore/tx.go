package idemstore

import "context"

// CheckpointParams are the inputs of Tx.KeyCheckpoint.
type CheckpointParams struct {
	Identity
	Token string
	// RecoveryPoint is the name of the phase the transaction completes.
	RecoveryPoint string
}

// TxStore is implemented by stores that can write a record's completion
// inside the caller's business transaction (transactional mode, SPEC
// section 5): business writes, outbox rows and the key's completion commit
// together or not at all. The SQL stores implement it, and idemmem does with
// copy-on-write transactions for tests.
type TxStore interface {
	Store
	// KeyBeginTx starts a business transaction.
	KeyBeginTx(ctx context.Context) (Tx, error)
}

// Tx is a business transaction that can also finish the key's attempt.
type Tx interface {
	// KeyComplete writes the completion inside the transaction, fenced and
	// with the same semantics as Store.KeyComplete. It returns ErrLeaseLost
	// when the attempt no longer holds the record: the caller must roll back.
	KeyComplete(ctx context.Context, p *CompleteParams) error
	// KeyCheckpoint sets the record's recovery point inside the transaction,
	// fenced on the token of an in_progress record (ErrLeaseLost otherwise).
	KeyCheckpoint(ctx context.Context, p *CheckpointParams) error
	// Commit commits the transaction.
	Commit(ctx context.Context) error
	// Rollback rolls the transaction back; after Commit it does nothing.
	Rollback(ctx context.Context) error
	// Driver returns the driver's transaction, for the driver's own typed
	// accessor (idemsqlite.TxFrom gives a *sql.Tx, idempgx.TxFrom a
	// pgx.Tx, idemmem.TxFrom an *idemmem.Tx); a wrapping store returns the
	// wrapped transaction's. Other code calls the accessor rather than
	// asserting the type itself.
	Driver() any
}

type txKey struct{}

// ContextWithTx returns a context whose TxFromContext calls begin (once, on
// first use) and return the request's business transaction. The middleware
// sets it; handlers read it through their driver's TxFromContext.
func ContextWithTx(ctx context.Context, begin func() (Tx, error)) context.Context {
	return context.WithValue(ctx, txKey{}, begin)
}

// TxFromContext returns the request's business transaction, beginning it on
// first use, or ErrNoTx.
func TxFromContext(ctx context.Context) (Tx, error) {
	begin, _ := ctx.Value(txKey{}).(func() (Tx, error))
	if begin == nil {
		return nil, ErrNoTx
	}
	return begin()
}
