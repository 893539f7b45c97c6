package idemsqlite

import (
	"context"
	"errors"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.Resealer = (*Store)(nil)

// resealKey replaces the response of a completed, replayable record. ?6
// status, ?7 header JSON, ?8 body. updated_at stays: what a replay answers
// does not change.
const resealKey = `UPDATE idem_keys SET response_status = ?6, response_header = ?7, response_body = ?8
	WHERE ` + fencedWhere + ` AND state = 'completed' AND not_replayable = 0`

// KeyReseal implements idemstore.Resealer.
func (s *Store) KeyReseal(ctx context.Context, p *idemstore.ResealParams) error {
	if p.Response == nil {
		return idemstore.ErrInvalidState
	}
	status, header, body, _, err := responseArgs(p.Response, false)
	if err != nil {
		return err
	}
	err = s.fencedExec(ctx, s.db, "resealing key", resealKey, p.Identity, p.Token, status, header, body)
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	r, gerr := getRaw(ctx, s.rdb, p.Identity, s.now())
	if gerr != nil {
		return interpretError("resealing key", gerr)
	}
	if r != nil && r.Token == p.Token {
		return idemstore.ErrInvalidState
	}
	return idemstore.ErrLeaseLost
}
