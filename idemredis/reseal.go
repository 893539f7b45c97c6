package idemredis

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

var resealScript = loadScript("reseal.lua")

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
	a := resealArgs{now: us(s.now()), token: p.Token, resp: resp}
	err = s.run(ctx, resealScript, a.call(s.keysOf(p.Identity).boxed)).Err()
	if err != nil {
		return fmt.Errorf("resealing key: %w", interpretError(err))
	}
	return nil
}
