package idemredis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// KeyWait returns when the record named id may have changed: a script
// published on its channel, its lease ran out, or it is not in_progress (or
// is gone) when the wait starts. It returns ctx's error when ctx ends first.
//
// It subscribes first, then registers as a waiter on the record and reads
// it in one script (wait.lua), so a change between the caller's read and
// the subscription is not missed, and the change publishes because a waiter
// is registered (scripts publish only then: a completion nobody waits for
// costs no PUBLISH). The subscription uses SSUBSCRIBE (Redis 7 sharded
// pub/sub: on a cluster only the record's shard is involved) and falls back
// to SUBSCRIBE on older servers. Each wait holds a connection of its own.
func (s *Store) KeyWait(ctx context.Context, id idemstore.Identity) error {
	k := s.keysOf(id)
	ps, err := s.subscribe(ctx, k.channel)
	if err != nil {
		if ctx.Err() != nil {
			// go-redis reports a deadline hit while reading as a net error.
			return ctx.Err()
		}
		return fmt.Errorf("waiting for key: %w", err)
	}
	defer ps.Close()

	now := s.now()
	v, err := s.run(ctx, waitScript, waitArgs{now: us(now)}.call(k.boxed)).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return nil
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return fmt.Errorf("waiting for key: %w", interpretError(err))
	}
	r, err := decodeRecord(v)
	if err != nil {
		return fmt.Errorf("waiting for key: %w", err)
	}
	if expired(r, now) || r.State != idemstore.StateInProgress || r.LeaseExpired(now) {
		return nil
	}
	// The lease's end is a change nobody publishes.
	timer := time.NewTimer(max(r.LockedUntil.Sub(s.now()), time.Millisecond))
	defer timer.Stop()
	select {
	case <-ps.Channel():
		return nil
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// subscribe subscribes to channel with SSUBSCRIBE, or with SUBSCRIBE when
// the server does not know SSUBSCRIBE, and waits for the confirmation.
func (s *Store) subscribe(ctx context.Context, channel string) (*redis.PubSub, error) {
	ps := s.client.SSubscribe(ctx, channel)
	_, err := ps.Receive(ctx)
	if err == nil {
		return ps, nil
	}
	ps.Close()
	if !redis.HasErrorPrefix(err, "unknown command") { // (HasErrorPrefix drops "ERR ")
		return nil, err
	}
	ps = s.client.Subscribe(ctx, channel)
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		return nil, err
	}
	return ps, nil
}
