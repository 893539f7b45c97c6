package idempgx

import (
	"context"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// notifier will fan PostgreSQL notifications out to waiters.
type notifier struct{}

func newNotifier(*Store) *notifier { return nil }

// KeyWait returns when the record identified by id may have changed, at the
// latest after Config.WaitPoll, or with ctx's error.
func (s *Store) KeyWait(ctx context.Context, id idemstore.Identity) error {
	t := time.NewTimer(s.cfg.WaitPoll)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
