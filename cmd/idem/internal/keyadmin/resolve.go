// Package keyadmin holds the operator actions on idempotency records that
// both `idem keys` and the console offer, so that whichever door an
// operator uses, the store is written the same way and the audit line says
// the same thing.
package keyadmin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idem-dev/idem/idemstore"
)

// ErrInvalid is returned by Resolve for a resolution that is not one: a
// target other than completed or released, a response with released, or a
// response status outside 100-599. Nothing is written.
var ErrInvalid = errors.New("keyadmin: invalid resolution")

// Resolution is an operator's settlement of an unknown record, once they
// know whether its operation happened.
type Resolution struct {
	idemstore.Identity
	// Token is the record's token as the operator read it: the resolution
	// is fenced on it.
	Token string
	// To is idemstore.StateCompleted (the operation happened) or
	// idemstore.StateReleased (it did not: the next retry executes it).
	To idemstore.State
	// Response is what retries get with To completed; nil stores none, and
	// retries get 409 not-replayable.
	Response *idemstore.Response
	// Operator names who resolves, for the audit line.
	Operator string
}

// Resolve settles the unknown record r names, fenced on r.Token
// (idemstore.Store.KeyResolve). When the record is no longer the unknown
// outcome the operator read (another attempt, resolver or purge got to it),
// nothing is written and the store's error is returned as is: Changed
// reports it, and idemstore.ErrNotFound means the record is gone. A
// resolution that is not one fails with ErrInvalid.
func Resolve(ctx context.Context, store idemstore.Store, r *Resolution) error {
	switch {
	case r.To != idemstore.StateCompleted && r.To != idemstore.StateReleased:
		return fmt.Errorf("%w: a record resolves to completed or released, not %q", ErrInvalid, r.To)
	case r.To == idemstore.StateReleased && r.Response != nil:
		return fmt.Errorf("%w: a released record stores no response", ErrInvalid)
	case r.Response != nil && (r.Response.Status < 100 || r.Response.Status > 599):
		return fmt.Errorf("%w: status %d is not between 100 and 599", ErrInvalid, r.Response.Status)
	}
	return store.KeyResolve(ctx, &idemstore.ResolveParams{Identity: r.Identity, Token: r.Token, To: r.To, Response: r.Response})
}

// Changed reports whether err, from Resolve, means that the record changed
// after the operator read it (its token or its state), so nothing was
// written.
func Changed(err error) bool {
	return errors.Is(err, idemstore.ErrLeaseLost) || errors.Is(err, idemstore.ErrInvalidState)
}

// Audit returns the attributes of the resolution's audit line, without the
// key itself: action=resolve, key_hash, endpoint, scope, from=unknown, to,
// operator, and status when a response is stored.
func (r *Resolution) Audit() []slog.Attr {
	attrs := []slog.Attr{
		slog.String("action", "resolve"),
		slog.String("key_hash", r.LogHash()),
		slog.String("endpoint", r.Endpoint),
		slog.String("scope", r.Scope),
		slog.String("from", string(idemstore.StateUnknown)),
		slog.String("to", string(r.To)),
		slog.String("operator", r.Operator),
	}
	if r.Response != nil {
		attrs = append(attrs, slog.Int("status", r.Response.Status))
	}
	return attrs
}
