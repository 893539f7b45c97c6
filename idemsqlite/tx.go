package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.TxStore = (*Store)(nil)

// KeyBeginTx begins a business transaction on the store's write pool for the
// middleware's transactional mode: the handler's writes, the outbox rows and
// the key's completion commit together (idemstore.TxStore). The transaction
// holds SQLite's write lock until it ends, so the store's other writes wait
// for it: keep it short.
func (s *Store) KeyBeginTx(ctx context.Context) (idemstore.Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, interpretError("beginning transaction", err)
	}
	return &Tx{s: s, tx: tx}, nil
}

// Tx is a business transaction begun by KeyBeginTx. It implements
// idemstore.Tx; handlers reach the *sql.Tx through TxFromContext, and code
// handed an idemstore.Tx (a phase of idem.RunPhases) through TxFrom.
type Tx struct {
	s  *Store
	tx *sql.Tx
}

// KeyComplete is CompleteTx in this transaction.
func (t *Tx) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	return t.s.complete(ctx, t.q(), p)
}

// KeyCheckpoint is CheckpointTx in this transaction.
func (t *Tx) KeyCheckpoint(ctx context.Context, p *idemstore.CheckpointParams) error {
	return t.s.fencedExec(ctx, t.q(), "checkpointing key", checkpointKey, p.Identity, p.Token, p.RecoveryPoint)
}

// q runs the store's prepared statements in the transaction: it was begun
// on the store's write pool, where they are prepared.
func (t *Tx) q() querier { return preparedQuerier{q: t.tx, tx: t.tx, st: t.s.wst} }

// Commit commits the transaction.
func (t *Tx) Commit(context.Context) error {
	return interpretError("committing transaction", t.tx.Commit())
}

// Rollback rolls the transaction back; after Commit or Rollback it does
// nothing.
func (t *Tx) Rollback(context.Context) error {
	return interpretError("rolling back transaction", rollback(t.tx))
}

// Driver returns the *sql.Tx.
func (t *Tx) Driver() any { return t.tx }

// TxFrom returns the *sql.Tx of tx, a transaction begun by KeyBeginTx
// (directly or through a store that wraps this one, such as idemcrypt or
// idemcache), and false for a nil tx or any other store's transaction.
func TxFrom(tx idemstore.Tx) (*sql.Tx, bool) {
	if tx == nil {
		return nil, false
	}
	stx, ok := tx.Driver().(*sql.Tx)
	return stx, ok
}

// TxFromContext returns the business transaction of a request in
// transactional mode, beginning it on first use, or idemstore.ErrNoTx. The
// handler writes through it; the middleware completes the key in it and
// commits. It is TxFrom of the context's transaction.
func TxFromContext(ctx context.Context) (*sql.Tx, error) {
	tx, err := idemstore.TxFromContext(ctx)
	if err != nil {
		return nil, err
	}
	stx, ok := TxFrom(tx)
	if !ok {
		return nil, fmt.Errorf("idemsqlite: the request's transaction is a %T, not a *sql.Tx", tx.Driver())
	}
	return stx, nil
}

// CompleteTx is KeyComplete inside the caller's transaction: the completion
// commits or rolls back with the business writes (transactional mode). It
// returns idemstore.ErrLeaseLost when the attempt no longer owns the record,
// and the caller must then roll tx back. tx must be a transaction on the
// store's database (see DB).
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p *idemstore.CompleteParams) error {
	return s.complete(ctx, tx, p)
}

// complete stores the response of p's attempt through q.
func (s *Store) complete(ctx context.Context, q querier, p *idemstore.CompleteParams) error {
	status, header, body, nr, err := responseArgs(p.Response, p.NotReplayable)
	if err != nil {
		return err
	}
	return s.fencedExec(ctx, q, "completing key", completeKey, p.Identity, p.Token, status, header, body, nr)
}

// CheckpointTx records p.RecoveryPoint as the last committed phase of the
// attempt holding p.Token, inside the caller's transaction (phased
// operations). It does not extend the lease. It returns
// idemstore.ErrLeaseLost when the record is not in_progress under the token,
// and the caller must then roll tx back.
func (s *Store) CheckpointTx(ctx context.Context, tx *sql.Tx, p *idemstore.CheckpointParams) error {
	return s.fencedExec(ctx, tx, "checkpointing key", checkpointKey, p.Identity, p.Token, p.RecoveryPoint)
}
