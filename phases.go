package idem

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

// Phase is one atomic phase of a multi-step operation (Brandur Leach's
// "atomic phases"): its local writes and the advance of the record's
// recovery point commit in one transaction. A phase makes at most one
// external call, carrying DerivedKeyFromContext(ctx, Name) so the downstream
// deduplicates a call repeated after a crash.
type Phase struct {
	// Name is the recovery point recorded when the phase commits. Names are
	// unique within an operation.
	Name string
	// Run does the phase's work in tx (idemsqlite.TxFrom, idempgx.TxFrom
	// and idemmem.TxFrom give the driver's transaction). An error rolls
	// the phase back.
	Run func(ctx context.Context, tx idemstore.Tx) error
}

// RunPhases runs the phases of the protected request in order, each in its
// own transaction, skipping those an earlier attempt already committed: a
// retry after a crash or an expired lease resumes at the recorded recovery
// point and never repeats a committed phase. Whatever the handler writes
// after RunPhases returns (through the driver's TxFromContext) commits with
// the key's completion, as in any transactional request.
//
// An error from a phase is returned as is; the handler should answer 5xx,
// which releases the key (keeping the recovery point) so a retry resumes.
func RunPhases(ctx context.Context, phases ...Phase) error {
	a := attemptFrom(ctx)
	if a == nil || a.c.txStore == nil {
		return ErrNotTransactional
	}
	start := 0
	if rp := a.recoveryPoint; rp != "" {
		start = -1
		for i, p := range phases {
			if p.Name == rp {
				start = i + 1
				break
			}
		}
		if start < 0 {
			return fmt.Errorf("idem: recovery point %q is not one of the phases", rp)
		}
	}
	for _, p := range phases[start:] {
		if err := a.runPhase(ctx, p); err != nil {
			return err
		}
		a.recoveryPoint = p.Name
	}
	return nil
}

func (a *attempt) runPhase(ctx context.Context, p Phase) error {
	tx, err := a.c.txStore.KeyBeginTx(ctx)
	if err != nil {
		return fmt.Errorf("beginning phase %q: %w", p.Name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := p.Run(ctx, tx); err != nil {
		return err
	}
	if err := tx.KeyCheckpoint(ctx, &idemstore.CheckpointParams{Identity: a.id(), Token: a.token(), RecoveryPoint: p.Name}); err != nil {
		return fmt.Errorf("recording phase %q: %w", p.Name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing phase %q: %w", p.Name, err)
	}
	a.c.log.Info("idem: phase committed", "key_hash", a.keyHash(), "endpoint", a.metricsEndpoint(), "recovery_point", p.Name)
	return nil
}

// RecoveryPoint returns the last committed phase of the protected request's
// record ("" before the first), so a handler can tell a resumed attempt.
func RecoveryPoint(ctx context.Context) string {
	if a := attemptFrom(ctx); a != nil {
		return a.recoveryPoint
	}
	return ""
}
