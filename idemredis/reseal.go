package idemredis

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

var resealScript = loadScript("reseal.lua")

var (
	_        idemstore.Resealer = (*Store)(nil)
	argKeys1 any                = 1
)

// KeyReseal implements idemstore.Resealer.
func (s *Store) KeyReseal(ctx context.Context, p *idemstore.ResealParams) error {
	if p.Response == nil {
		return idemstore.ErrInvalidState
	}
	resp, err := encodeResponse(p.Response, false)
	if err != nil {
		return fmt.Errorf("resealing key: %w", err)
	}
	k := s.keysOf(p.Identity)
	err = s.run(ctx, resealScript, argKeys1, []any{nil, nil, nil, k.args[0],
		us(s.now()), p.Token, resp.status, resp.header, resp.body,
	}).Err()
	if err != nil {
		return fmt.Errorf("resealing key: %w", interpretError(err))
	}
	return nil
}
