package idemcache

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.Resealer = (*Store)(nil)

// KeyReseal is the wrapped store's KeyReseal (it must implement
// idemstore.Resealer), followed by the invalidation of the cached copy:
// resealing is the one write that changes a completed record while it is
// alive. The copy is dropped after the store's write, best effort like
// every cache call (a failure is logged, never returned: the rewrite did
// happen), so the next replay fills the cache from the rewritten record. A
// copy left behind, by a failed delete or put back by a racing fill, still
// says the same and opens as long as its key is in the keyring; idemcrypt
// drops a cached copy under a key it no longer holds and asks the store
// again.
func (s *Store) KeyReseal(ctx context.Context, p *idemstore.ResealParams) error {
	rs, ok := s.inner.(idemstore.Resealer)
	if !ok {
		return fmt.Errorf("idemcache: %T cannot rewrite stored responses (no KeyReseal)", s.inner)
	}
	if err := rs.KeyReseal(ctx, p); err != nil {
		return err
	}
	s.delete(ctx, p.Identity)
	return nil
}
