package idemmysql

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.Resealer = (*Store)(nil)

// KeyReseal implements idemstore.Resealer.
func (s *Store) KeyReseal(ctx context.Context, p *idemstore.ResealParams) error {
	if p.Response == nil {
		return idemstore.ErrInvalidState
	}
	resp, err := encodeResponse(p.Response, false)
	if err != nil {
		return fmt.Errorf("resealing key: %w", err)
	}
	now := s.now()
	a := idArgs(p.Identity, now)
	a["token"] = bin(p.Token)
	resp.into(a)
	err = s.fenced(ctx, s.db, qReseal, a)
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		if err != nil {
			return fmt.Errorf("resealing key: %w", err)
		}
		return nil
	}
	rec, gerr := s.get(ctx, s.db, p.Identity, now)
	switch {
	case errors.Is(interpretError(gerr), idemstore.ErrNotFound):
		return idemstore.ErrLeaseLost
	case gerr != nil:
		return fmt.Errorf("resealing key: %w", gerr)
	case rec.Token == p.Token:
		return idemstore.ErrInvalidState
	}
	return idemstore.ErrLeaseLost
}
