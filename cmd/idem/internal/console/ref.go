package console

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"

	"github.com/idem-dev/idem/idemstore"
)

// ref is what a sealed reference names: a record, and for a resolve form
// the token of the record as the page showed it.
type ref struct {
	Scope    string `json:"s"`
	Endpoint string `json:"e"`
	Key      string `json:"k"`
	Token    string `json:"t,omitempty"`
}

func (r ref) identity() idemstore.Identity {
	return idemstore.Identity{Scope: r.Scope, Endpoint: r.Endpoint, Key: r.Key}
}

// refAAD binds sealed references to their purpose.
var refAAD = []byte("idem-console/ref/v1")

// seal returns r encrypted and authenticated under the console's key, as
// URL-safe text: a key never appears in a URL, a log line or a Referer.
func (k *keys) seal(r ref) string {
	plain, err := json.Marshal(r)
	if err != nil {
		panic("console: " + err.Error()) // unreachable: strings only
	}
	nonce := make([]byte, k.ref.NonceSize())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		panic("console: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(k.ref.Seal(nonce, nonce, plain, refAAD))
}

var errBadRef = errors.New("console: bad reference")

// open returns the ref sealed in s, or errBadRef when s was not sealed by
// this console (or was altered).
func (k *keys) open(s string) (ref, error) {
	var r ref
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < k.ref.NonceSize() {
		return r, errBadRef
	}
	plain, err := k.ref.Open(nil, b[:k.ref.NonceSize()], b[k.ref.NonceSize():], refAAD)
	if err != nil {
		return r, errBadRef
	}
	if err := json.Unmarshal(plain, &r); err != nil {
		return r, errBadRef
	}
	return r, nil
}

// keyHash is the key_hash that names a record in logs
// (idemstore.Identity.LogHash), the same as the middleware's and the
// maintainer's, so the console's audit lines join their logs.
func keyHash(id idemstore.Identity) string { return id.LogHash() }
