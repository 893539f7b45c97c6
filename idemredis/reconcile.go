package idemredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// KeyPurge deletes a record for an operator and returns it as it was: one
// script that checks it may be purged (an unknown or in_progress record only
// with p.Force) and removes it from every index.
func (s *Store) KeyPurge(ctx context.Context, p *idemstore.PurgeParams) (*idemstore.Record, error) {
	now := s.now()
	a := purgeArgs{now: us(now), token: p.Token, force: p.Force}
	v, err := s.run(ctx, purgeScript, a.call(s.keysOf(p.Identity).boxed)).Text()
	// Gone, or to be used again as new: not worth a GET first (see replay).
	s.keys.setDone(p.Identity, 0)
	if err != nil {
		return nil, fmt.Errorf("purging key: %w", interpretError(err))
	}
	r, err := decodeRecord(v)
	if err != nil {
		return nil, fmt.Errorf("purging key: %w", err)
	}
	if r.LeaseExpired(now) {
		r.State = r.LeaseExpiredState
	}
	return r, nil
}

// KeyReconcileClaim claims due unknown records. It reads the reconcile
// indexes of the buckets (see drainIndex: bucketCount/sweepChunk round
// trips) and runs the claim script on each due entry; the script claims a
// record only if it is still unknown and due, so of concurrent claimers
// exactly one gets it. Records come earliest reconcile_after first within a
// bucket, not across buckets.
func (s *Store) KeyReconcileClaim(ctx context.Context, p *idemstore.ReconcileClaimParams) ([]*idemstore.Record, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	now := s.now()
	a := claimArgs{now: micros(now), holdUntil: micros(now.Add(p.Hold)), grace: strconv.FormatInt(max(p.Grace.Microseconds(), 0), 10)}
	var out []*idemstore.Record
	err := s.drainIndex(ctx, ":reconcile", a.now, limit, func(cands []recordKeys) (int, error) {
		cmds := s.evalEach(ctx, claimScript, cands, a.keysArgs)
		n := 0
		for _, cmd := range cmds {
			v, err := cmd.Text()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return n, fmt.Errorf("claiming unknown keys: %w", interpretError(err))
			}
			r, err := decodeRecord(v)
			if err != nil {
				return n, fmt.Errorf("claiming unknown keys: %w", err)
			}
			out = append(out, r)
			n++
		}
		return n, nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b *idemstore.Record) int {
		if c := a.UpdatedAt.Compare(b.UpdatedAt); c != 0 {
			return c
		}
		return compareIdentity(a.Identity, b.Identity)
	})
	return out, nil
}

// KeyReconcileFail records a failed reconciliation attempt when the token
// matches and the record is unknown.
func (s *Store) KeyReconcileFail(ctx context.Context, p *idemstore.ReconcileFailParams) error {
	a := reconcileFailArgs{token: p.Token, errText: idemstore.TruncateReconcileError(p.Error),
		reconcileAfter: us(s.now().Add(p.Delay))}
	err := s.run(ctx, failScript, a.call(s.keysOf(p.Identity).boxed)).Err()
	if err != nil {
		return fmt.Errorf("recording a reconciliation failure: %w", interpretError(err))
	}
	return nil
}

// KeyBacklog counts the unknown records from the backlog indexes of the
// buckets (ZCARD and the lowest score of each, one pipeline): the count and
// the oldest are the store's, whichever process asks.
func (s *Store) KeyBacklog(ctx context.Context) (*idemstore.Backlog, error) {
	pipe := s.client.Pipeline()
	counts := make([]*redis.IntCmd, bucketCount)
	firsts := make([]*redis.ZSliceCmd, bucketCount)
	for b := range bucketCount {
		key := s.bucketTag(b) + ":unknown"
		counts[b] = pipe.ZCard(ctx, key)
		firsts[b] = pipe.ZRangeWithScores(ctx, key, 0, 0)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	var bl idemstore.Backlog
	var oldest int64
	for b := range bucketCount {
		n, err := counts[b].Result()
		if err != nil {
			return nil, fmt.Errorf("counting unknown keys: %w", interpretError(err))
		}
		first, err := firsts[b].Result()
		if err != nil {
			return nil, fmt.Errorf("counting unknown keys: %w", interpretError(err))
		}
		bl.Unknown += int(n)
		if len(first) > 0 {
			if us := int64(first[0].Score); oldest == 0 || us < oldest {
				oldest = us
			}
		}
	}
	if bl.Unknown > 0 && oldest != 0 {
		bl.OldestUnknownSince = time.UnixMicro(oldest)
	}
	return &bl, nil
}
