package idemredis

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// KeySweep turns in_progress records whose lease expired into their
// LeaseExpiredState, at most p.Limit of them, and returns them.
//
// It reads the lease indexes of the buckets (see drainIndex) and runs the
// sweep script on each due entry. Index entries of records that are gone or
// no longer in_progress are removed on the way.
func (s *Store) KeySweep(ctx context.Context, p *idemstore.SweepParams) ([]*idemstore.Record, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultSweepLimit
	}
	now := micros(s.now())
	var out []*idemstore.Record
	err := s.drainIndex(ctx, ":leases", now, limit, func(cands []recordKeys) (int, error) {
		cmds := s.evalEach(ctx, sweepScript, cands, indexArgs{now: now}.keysArgs)
		n := 0
		for _, cmd := range cmds {
			v, err := cmd.Text()
			if err == redis.Nil {
				continue
			}
			if err != nil {
				return n, fmt.Errorf("sweeping lease: %w", interpretError(err))
			}
			r, err := decodeRecord(v)
			if err != nil {
				return n, fmt.Errorf("sweeping lease: %w", err)
			}
			out = append(out, r)
			n++
		}
		return n, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// KeyReap deletes at most p.Limit records past ExpiresAt and returns how
// many it deleted.
//
// Redis removes records by their native TTL too (a minute after ExpiresAt),
// so KeyReap is needed only to reclaim memory sooner, or when the store's
// clock runs ahead of Redis's; meanwhile every other method treats a record
// past ExpiresAt as absent. It reads the expiry indexes of the buckets (see
// drainIndex) and runs the reap script on each due entry.
func (s *Store) KeyReap(ctx context.Context, p *idemstore.ReapParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultSweepLimit
	}
	now := micros(s.now())
	total := 0
	// Past ExpiresAt is strictly after it: an exclusive bound.
	err := s.drainIndex(ctx, ":expiry", "("+now, limit, func(cands []recordKeys) (int, error) {
		cmds := s.evalEach(ctx, reapScript, cands, indexArgs{now: now}.keysArgs)
		n := 0
		for _, cmd := range cmds {
			deleted, err := cmd.Int()
			if err != nil {
				return n, fmt.Errorf("reaping key: %w", interpretError(err))
			}
			n += deleted
		}
		total += n
		return n, nil
	})
	return total, err
}

// drainIndex reads the entries scored at most maxScore from the index named
// suffix of every bucket, sweepChunk buckets per pipelined round trip,
// starting at a bucket that rotates between calls so that one bucket full
// of due entries does not starve the others. It hands them to process, at
// most as many as the results still missing, until process has reported
// limit results or every bucket was read.
//
// Cost: bucketCount/sweepChunk (16) round trips to read the indexes, plus
// one pipelined round trip per chunk with due entries; at most limit
// entries per chunk, so at most 16*limit scripts when most entries are
// stale. Never proportional to the number of records.
func (s *Store) drainIndex(ctx context.Context, suffix, maxScore string, limit int, process func([]recordKeys) (int, error)) error {
	start := int(s.sweepFrom.Add(sweepChunk)) % bucketCount
	done := 0
	for chunk := 0; chunk < bucketCount && done < limit; chunk += sweepChunk {
		remaining := limit - done
		pipe := s.client.Pipeline()
		buckets := make([]int, sweepChunk)
		cmds := make([]*redis.StringSliceCmd, sweepChunk)
		for i := range sweepChunk {
			buckets[i] = (start + chunk + i) % bucketCount
			cmds[i] = pipe.ZRangeByScore(ctx, s.bucketTag(buckets[i])+suffix, &redis.ZRangeBy{
				Min: "-inf", Max: maxScore, Count: int64(remaining),
			})
		}
		_, _ = pipe.Exec(ctx) // errors are read per command
		var cands []recordKeys
		for i, cmd := range cmds {
			members, err := cmd.Result()
			if err != nil {
				return fmt.Errorf("reading index: %w", interpretError(err))
			}
			for _, m := range members {
				if len(cands) < remaining {
					cands = append(cands, s.bucketKeys(buckets[i], m))
				}
			}
		}
		if len(cands) == 0 {
			continue
		}
		n, err := process(cands)
		if err != nil {
			return err
		}
		done += n
	}
	return nil
}

// evalEach runs script once per candidate in one pipeline and returns the
// commands, in order. A candidate whose EVALSHA found no script (a node
// restarted or flushed its scripts) or met a slot migration is run again
// with Script.Run (see retrySlot).
func (s *Store) evalEach(ctx context.Context, script *script, cands []recordKeys, params func(recordKeys) ([]string, []any)) []*redis.Cmd {
	pipe := s.client.Pipeline()
	cmds := make([]*redis.Cmd, len(cands))
	for i, k := range cands {
		keys, args := params(k)
		cmds[i] = script.EvalSha(ctx, pipe, keys, args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") || slotMoving(cmd.Err()) {
			keys, args := params(cands[i])
			cmds[i] = retrySlot(ctx, s, func() *redis.Cmd { return script.Run(ctx, s.client, keys, args...) })
		}
	}
	return cmds
}
