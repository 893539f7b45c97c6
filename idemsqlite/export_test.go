package idemsqlite

import (
	"context"
	"database/sql"
)

// BatchStats returns how many group-commit transactions of s committed and
// how many writes they held.
func BatchStats(s *Store) (commits, writes int64) {
	return s.batch.commits.Load(), s.batch.writes.Load()
}

// BatchReruns returns how many times a batch of s ran its writes again after
// an atomic write failed.
func BatchReruns(s *Store) int64 { return s.batch.reruns.Load() }

// PinReadFirst makes KeyReserve of s always read before it writes (on), or
// never. Call it before using s.
func PinReadFirst(s *Store, on bool) {
	s.pin = -1
	if on {
		s.pin = 1
	}
}

// ReadsFirst reports whether KeyReserve of s now reads before it writes.
func ReadsFirst(s *Store) bool { return s.readFirst() }

// OnQueued makes s call f with the queue's length whenever a write joins the
// queue of writes for the writer (the first of them leads the next batch).
// Call it before using s.
func OnQueued(s *Store, f func(n int)) { s.batch.queued = f }

// OnCommitted makes s call f with the number of writes of each group-commit
// transaction that committed; one call at a time. Call it before using s.
func OnCommitted(s *Store, f func(n int)) { s.batch.committed = f }

// WriteTx runs f as one write of the store, in a transaction it may share
// with other writes (group commit).
func WriteTx(s *Store, ctx context.Context, f func(ctx context.Context, tx *sql.Tx) error) error {
	return s.batch.do(ctx, false, f)
}
