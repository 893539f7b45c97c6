package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.TxStore = (*Store)(nil)

// KeyBeginTx begins a business transaction on the store's pool (at READ
// COMMITTED, as every session of NewConnector) for the middleware's
// transactional mode: the handler's writes, the outbox rows and the key's
// completion commit together (idemstore.TxStore).
func (s *Store) KeyBeginTx(ctx context.Context) (idemstore.Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("beginning transaction: %w", err)
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
	return t.s.CompleteTx(ctx, t.tx, p)
}

// KeyCheckpoint is CheckpointTx in this transaction.
func (t *Tx) KeyCheckpoint(ctx context.Context, p *idemstore.CheckpointParams) error {
	return t.s.CheckpointTx(ctx, t.tx, p)
}

// Commit commits the transaction.
func (t *Tx) Commit(context.Context) error {
	if err := t.tx.Commit(); err != nil {
		return fmt.Errorf("committing transaction: %w", err)
	}
	return nil
}

// Rollback rolls the transaction back; after Commit or Rollback it does
// nothing.
func (t *Tx) Rollback(context.Context) error {
	if err := t.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("rolling back transaction: %w", err)
	}
	return nil
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
		return nil, fmt.Errorf("idemmysql: the request's transaction is a %T, not a *sql.Tx", tx.Driver())
	}
	return stx, nil
}

// CompleteTx is KeyComplete inside the caller's transaction: the completion
// commits or rolls back with the business writes (transactional mode). It
// locks the record until tx ends, so a concurrent takeover waits for the
// outcome. On idemstore.ErrLeaseLost, or any error (a deadlock rolls the
// whole transaction back), the caller must roll tx back. tx must be a
// transaction on a pool of NewConnector.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p *idemstore.CompleteParams) error {
	if err := s.complete(ctx, tx, p); err != nil {
		return fmt.Errorf("completing key in transaction: %w", err)
	}
	return nil
}

// CheckpointTx records p.RecoveryPoint as the last committed phase of the
// attempt holding p.Token, inside the caller's transaction (phased
// operations). It changes nothing else: the lease is not extended. It
// returns idemstore.ErrLeaseLost when the record is not in_progress under
// the token, and the caller must then roll tx back.
func (s *Store) CheckpointTx(ctx context.Context, tx *sql.Tx, p *idemstore.CheckpointParams) error {
	if len(p.RecoveryPoint) > maxPointLen {
		return fmt.Errorf("checkpointing key: the recovery point is %d bytes, more than the %d the MySQL store keeps",
			len(p.RecoveryPoint), maxPointLen)
	}
	a := idArgs(p.Identity, s.now())
	a["token"] = bin(p.Token)
	a["recovery_point"] = bin(p.RecoveryPoint)
	if err := s.fenced(ctx, tx, qCheckpoint, a); err != nil {
		return fmt.Errorf("checkpointing key: %w", err)
	}
	return nil
}
