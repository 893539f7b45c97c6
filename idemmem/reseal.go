package idemmem

import (
	"context"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.Resealer = (*Store)(nil)

// KeyReseal implements idemstore.Resealer. KeyReserve hands out completed
// records without copying them, so the record is replaced by a new one
// rather than changed: a caller still reading the old one sees it whole.
func (s *Store) KeyReseal(ctx context.Context, p *idemstore.ResealParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(p.Identity, s.now())
	switch {
	case r == nil || r.Token != p.Token:
		return idemstore.ErrLeaseLost
	case r.State != idemstore.StateCompleted || r.NotReplayable || r.Response == nil || p.Response == nil:
		return idemstore.ErrInvalidState
	}
	n := &record{Record: *r}
	n.Response = s.storedIn(&n.response, p.Response)
	s.records.put(n)
	return nil
}
