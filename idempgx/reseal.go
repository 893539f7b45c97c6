package idempgx

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/sqlfile"
)

//go:embed reseal.sql
var resealSQL string

var resealStatements = sqlfile.MustParse("idempgx/reseal.sql", resealSQL)

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
	sql := expand(resealStatements["reseal"], s.schema, s.channel)
	err = s.fencedExec(ctx, s.pool, sql, p.Scope, p.Endpoint, p.Key, p.Token, now, resp.status, resp.header, resp.body)
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		if err != nil {
			return fmt.Errorf("resealing key: %w", err)
		}
		return nil
	}
	rec, gerr := s.get(ctx, s.pool, p.Identity, now)
	switch {
	case errors.Is(gerr, idemstore.ErrNotFound):
		return idemstore.ErrLeaseLost
	case gerr != nil:
		return fmt.Errorf("resealing key: %w", gerr)
	case rec.Token == p.Token:
		return idemstore.ErrInvalidState
	}
	return idemstore.ErrLeaseLost
}
