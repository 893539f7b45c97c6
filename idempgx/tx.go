package idempgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.TxStore = (*Store)(nil)

// KeyBeginTx begins a business transaction on the store's pool for the
// middleware's transactional mode: the handler's writes, the outbox rows and
// the key's completion commit together (idemstore.TxStore).
func (s *Store) KeyBeginTx(ctx context.Context) (idemstore.Tx, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("beginning transaction: %w", err)
	}
	return &Tx{s: s, tx: tx}, nil
}

// Tx is a business transaction begun by KeyBeginTx. It implements
// idemstore.Tx; handlers reach the pgx.Tx through TxFromContext, and code
// handed an idemstore.Tx (a phase of idem.RunPhases) through TxFrom.
type Tx struct {
	s  *Store
	tx pgx.Tx
}

// KeyComplete is CompleteTx in this transaction.
func (t *Tx) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	return t.s.CompleteTx(ctx, t.tx, p)
}

// KeyCheckpoint is CheckpointTx in this transaction.
func (t *Tx) KeyCheckpoint(ctx context.Context, p *idemstore.CheckpointParams) error {
	return t.s.CheckpointTx(ctx, t.tx, p.Identity, p.Token, p.RecoveryPoint)
}

// Commit commits the transaction.
func (t *Tx) Commit(ctx context.Context) error {
	if err := t.tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing transaction: %w", err)
	}
	return nil
}

// Rollback rolls the transaction back; after Commit or Rollback it does
// nothing.
func (t *Tx) Rollback(ctx context.Context) error {
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("rolling back transaction: %w", err)
	}
	return nil
}

// Driver returns the pgx.Tx.
func (t *Tx) Driver() any { return t.tx }

// TxFrom returns the pgx.Tx of tx, a transaction begun by KeyBeginTx
// (directly or through a store that wraps this one, such as idemcrypt or
// idemcache), and false for a nil tx or any other store's transaction.
func TxFrom(tx idemstore.Tx) (pgx.Tx, bool) {
	if tx == nil {
		return nil, false
	}
	ptx, ok := tx.Driver().(pgx.Tx)
	return ptx, ok
}

// TxFromContext returns the business transaction of a request in
// transactional mode, beginning it on first use, or idemstore.ErrNoTx. The
// handler writes through it; the middleware completes the key in it and
// commits. It is TxFrom of the context's transaction.
func TxFromContext(ctx context.Context) (pgx.Tx, error) {
	tx, err := idemstore.TxFromContext(ctx)
	if err != nil {
		return nil, err
	}
	ptx, ok := TxFrom(tx)
	if !ok {
		return nil, fmt.Errorf("idempgx: the request's transaction is a %T, not a pgx.Tx", tx.Driver())
	}
	return ptx, nil
}

// CompleteTx is KeyComplete inside the caller's transaction: the completion
// commits or rolls back with the business writes (transactional mode). It
// locks the record until tx ends, so a concurrent takeover waits for the
// outcome. On idemstore.ErrLeaseLost the caller must roll tx back.
// A request waiting for the record is notified when tx commits.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, p *idemstore.CompleteParams) error {
	if err := s.complete(ctx, tx, p); err != nil {
		return fmt.Errorf("completing key in transaction: %w", err)
	}
	return nil
}

// CheckpointTx records recoveryPoint as the last committed phase of the
// attempt holding token, inside the caller's transaction (phased
// operations). It changes nothing else: the lease is not extended. It
// returns idemstore.ErrLeaseLost when the record is not in_progress under
// token, and the caller must then roll tx back.
func (s *Store) CheckpointTx(ctx context.Context, tx pgx.Tx, id idemstore.Identity, token, recoveryPoint string) error {
	now := s.now()
	err := s.fencedExec(ctx, tx, s.q.checkpoint,
		id.Scope, id.Endpoint, id.Key, token, now, recoveryPoint)
	if err != nil {
		return fmt.Errorf("checkpointing key: %w", err)
	}
	return nil
}
