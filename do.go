package idem

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

// DoOption configures one Do call.
type DoOption func(*doOptions)

type doOptions struct {
	scope string
	fc    FingerprintConfig
}

// WithScope names the tenant or principal the key belongs to (from
// authentication, never from the payload): the same key in another scope is
// another record. Defaults to the empty scope.
func WithScope(scope string) DoOption {
	return func(o *doOptions) { o.scope = scope }
}

// WithFingerprint narrows the payload's fingerprint to selected top-level
// members or drops members (a delivery timestamp, an attempt counter), as
// Config.Fingerprint does for HTTP bodies. Defaults to the whole payload.
func WithFingerprint(fc FingerprintConfig) DoOption {
	return func(o *doOptions) { o.fc = fc }
}

// doMeta is the metadata Do stores with a result, so that idem keys
// and the console show it as what it is.
var doMeta = map[string][]string{"Content-Type": {"application/json"}}

// Do runs fn at most once for key on operation, through g: the first call
// runs fn and stores its result as JSON; every later call with the same key,
// operation and scope returns the stored result, decoded into T, without
// running fn. payload is what the call is about (encoded with encoding/json
// and fingerprinted with RFC 8785 canonical JSON, see FingerprintPayload):
// the same key with another payload is refused with ErrKeyReused.
//
// Errors, and what fn's context carries, are Guard.Run's: an error from fn
// releases the key (a retry runs fn again) unless fn called MarkUnknown; a
// refusal is an *Error matching ErrInProgress, ErrOutcomeUnknown,
// ErrKeyReused, ErrStoreUnavailable and the others with errors.Is. When fn
// ran but its result could not be recorded, Do returns fn's value with an
// error matching ErrNotRecorded. A result that cannot be encoded as JSON
// marks the outcome unknown (fn's effect happened) and is an error.
//
// The call that ran fn returns fn's value itself; replays return the stored
// JSON decoded, so T's unexported fields and anything encoding/json drops
// are zero in a replay.
func Do[T any](ctx context.Context, g *Guard, key, operation string, payload any, fn func(ctx context.Context) (T, error), opts ...DoOption) (T, error) {
	var zero T
	var o doOptions
	for _, opt := range opts {
		opt(&o)
	}
	fp, err := FingerprintPayload(operation, payload, o.fc)
	if err != nil {
		return zero, fmt.Errorf("idem: fingerprinting the payload: %w", err)
	}
	var value T
	ran := false
	res, replayed, err := g.Run(ctx, Call{
		Identity:    idemstore.Identity{Scope: o.scope, Endpoint: operation, Key: key},
		Fingerprint: fp,
	}, func(ctx context.Context) (Result, error) {
		ran = true
		v, err := fn(ctx)
		value = v
		if err != nil {
			return Result{}, err
		}
		body, err := json.Marshal(v)
		if err != nil {
			MarkUnknown(ctx)
			return Result{}, fmt.Errorf("idem: encoding the result: %w", err)
		}
		return Result{Status: 200, Meta: doMeta, Body: body}, nil
	})
	if ran {
		return value, err
	}
	if err != nil || !replayed {
		// Refused, or run unprotected (fail-open), which sets ran.
		return zero, err
	}
	var out T
	if err := json.Unmarshal(res.Body, &out); err != nil {
		return zero, fmt.Errorf("idem: decoding the stored result: %w", err)
	}
	return out, nil
}
