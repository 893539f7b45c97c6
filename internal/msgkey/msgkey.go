// Package msgkey makes a message's id into the key of its record, for the
// message consumers (idemnats, idemamqp): a producer may send any id, and
// the core accepts only keys of printable ASCII within its length bounds.
package msgkey

import (
	"crypto/sha256"
	"encoding/hex"
)

// Key returns id itself when the core accepts it as a key (minLen to maxLen
// printable ASCII characters), and otherwise "sha256:" followed by the hex
// SHA-256 of id, which it always accepts.
func Key(id string, minLen, maxLen int) string {
	ok := len(id) >= minLen && len(id) <= maxLen
	for i := 0; ok && i < len(id); i++ {
		ok = id[i] >= 0x20 && id[i] < 0x7f
	}
	if ok {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:])
}
