package msgkey

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func TestKey(t *testing.T) {
	t.Parallel()
	hashed := func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	for _, tc := range []struct {
		name, id string
		minLen   int
		want     string
	}{
		{"printable", "order-42", 1, "order-42"},
		{"space", "order 42", 1, "order 42"},
		{"longest", strings.Repeat("a", 255), 1, strings.Repeat("a", 255)},
		{"too long", strings.Repeat("a", 256), 1, hashed(strings.Repeat("a", 256))},
		{"too short", "ab", 3, hashed("ab")},
		{"empty", "", 1, hashed("")},
		{"control", "a\nb", 1, hashed("a\nb")},
		{"delete", "a\x7fb", 1, hashed("a\x7fb")},
		{"not ascii", "commande-é", 1, hashed("commande-é")},
	} {
		if got := Key(tc.id, tc.minLen, 255); got != tc.want {
			t.Errorf("%s: Key(%q, %d, 255) = %q, want %q", tc.name, tc.id, tc.minLen, got, tc.want)
		}
	}
}
