package idempgx

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
)

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
