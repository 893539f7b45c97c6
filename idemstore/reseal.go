package idemstore

import "context"

// ResealParams are the inputs of Resealer.KeyReseal.
type ResealParams struct {
	Identity
	// Token must equal the record's current token (as read by the caller),
	// so the record replaced by a new incarnation of the key is never
	// rewritten with the old one's response.
	Token string
	// Response replaces the stored response. It must say the same as the
	// stored one: KeyReseal exists to change how a response is stored (its
	// encryption, see package idemcrypt), never what a replay answers.
	Response *Response
}

// Resealer is implemented by stores that can rewrite the stored response of
// a completed record in place: encryption key rotation (idemcrypt.Rotate)
// re-encrypts responses under a new key with it. Every store of this module
// implements it.
//
// KeyReseal replaces the response of a live, completed, replayable record
// whose token equals p.Token, and changes nothing else (not UpdatedAt, not
// ExpiresAt). It returns ErrLeaseLost when no live record has the identity
// or its token differs, and ErrInvalidState when the record is not
// completed or not replayable. A store with a cache in front of it
// (idemcache) drops the cached copy.
type Resealer interface {
	KeyReseal(ctx context.Context, p *ResealParams) error
}
