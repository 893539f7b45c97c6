package idemredis

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultRedirectWait is Config.RedirectWait's default.
const defaultRedirectWait = 5 * time.Second

// Backoff between the attempts of a call that meets a moving slot: short
// at first (most migrations of a slot's few keys take milliseconds), never
// long enough to add much past the migration's end.
const (
	redirectBackoffMin = 2 * time.Millisecond
	redirectBackoffMax = 50 * time.Millisecond
)

// slotMoving reports whether err is a reply a Redis Cluster gives while a
// slot moves between masters: TRYAGAIN (a script whose keys are split
// between the two nodes, or that would create a key there), or a MOVED or
// ASK redirection that go-redis stopped following after MaxRedirects. In
// every case the node refused the command before running it, so sending it
// again cannot run it twice.
func slotMoving(err error) bool {
	if err == nil {
		return false
	}
	if redis.IsTryAgainError(err) {
		return true
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	_, ok := redis.IsAskError(err)
	return ok
}

// retrySlot calls send, and calls it again while its command meets a slot
// migration (see slotMoving), until ctx's deadline (or RedirectWait, when
// ctx has none) would pass before the next attempt: a migration shows as
// latency rather than as an error. It returns the last command.
func retrySlot[C redis.Cmder](ctx context.Context, s *Store, send func() C) C {
	cmd := send()
	if !slotMoving(cmd.Err()) {
		return cmd
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(s.redirectWait)
	}
	wait := redirectBackoffMin
	for {
		if time.Until(deadline) < wait {
			return cmd
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return cmd
		case <-t.C:
		}
		s.slotRetries.Add(1)
		cmd = send()
		if !slotMoving(cmd.Err()) {
			return cmd
		}
		wait = min(2*wait, redirectBackoffMax)
	}
}
