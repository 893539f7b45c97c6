package idemstore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
)

// Hash returns the hex SHA-256 of the identity's scope, endpoint and key,
// each prefixed with its length as 8 big-endian bytes (no delimiter
// injection). Stores may use it to name records; it never reveals the key.
func (id Identity) Hash() string {
	h := sha256.New()
	for _, s := range [...]string{id.Scope, id.Endpoint, id.Key} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		io.WriteString(h, s)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// LogHash returns the first 16 hex digits of Hash: the key_hash attribute
// that names a record in every log line of the middleware, the maintainer,
// the CLI and the console (and idem.key_hash on spans), so their logs join
// without revealing the key. key_hash means this and nothing else; a bare
// key value without its scope and endpoint is logged as
// idempotency_key_hash, the first 16 hex digits of its own SHA-256.
func (id Identity) LogHash() string { return id.Hash()[:16] }
