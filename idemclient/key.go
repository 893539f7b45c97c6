package idemclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is the response header with which a server marks a stored
// response answered again to a retry.
const HeaderReplayed = "Idempotent-Replayed"

// maxKeyLength is the longest key the idem middleware accepts.
const maxKeyLength = 255

type keyContextKey struct{}

// WithKey returns a context that makes Do send key as the Idempotency-Key of
// the request it carries, instead of a generated one. An application that
// stores the key with its intent (an order, a payment) can resume the same
// logical call after its own restart and get the original result. The key
// must be 1 to 255 visible ASCII characters (without DQUOTE, comma or
// semicolon when Client.BareKey is set). Use the context for one logical
// call only: every keyed request sent with it carries the same key.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// KeyFromContext returns the key set by WithKey, if any.
func KeyFromContext(ctx context.Context) (string, bool) {
	key, ok := ctx.Value(keyContextKey{}).(string)
	return key, ok
}

// NewKeyV4 returns a random (version 4) UUID. It is the default key generator.
func NewKeyV4() (string, error) {
	u, err := uuid.NewRandom()
	if err != nil {
		return "", fmt.Errorf("generating idempotency key: %w", err)
	}
	return u.String(), nil
}

// NewKeyV7 returns a time-ordered (version 7) UUID, which keeps the server's
// key index local at the cost of revealing when the key was made.
func NewKeyV7() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("generating idempotency key: %w", err)
	}
	return u.String(), nil
}

// validKey reports whether key is 1 to 255 visible ASCII characters and, if
// it is to be sent bare, has no DQUOTE, comma or semicolon, which would make
// the field a string, a list or parameters.
func validKey(key string, bare bool) bool {
	if len(key) == 0 || len(key) > maxKeyLength {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c < 0x21 || c > 0x7e || (bare && (c == '"' || c == ',' || c == ';')) {
			return false
		}
	}
	return true
}

// quoteKey encodes key as an RFC 8941 sf-string.
func quoteKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 2)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}

// unquoteKey decodes an sf-string header value; a bare value is returned
// trimmed, as the idem middleware reads it.
func unquoteKey(v string) string {
	v = strings.TrimSpace(v)
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return v
	}
	var b strings.Builder
	inner := v[1 : len(v)-1]
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		if c == '\\' && i+1 < len(inner) {
			i++
			c = inner[i]
		} else if c == '"' || c == '\\' {
			return v // not a valid sf-string: keep it as sent
		}
		b.WriteByte(c)
	}
	return b.String()
}

// keyHash is the idempotency_key_hash under which keys appear in logs: the
// first 16 hex digits of their SHA-256.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}
