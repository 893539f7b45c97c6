package idem

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

// putHex64 writes what hex.Encode writes for v's big-endian bytes.
func TestPutHex64(t *testing.T) {
	t.Parallel()
	vs := []uint64{0, 1, 9, 10, 15, 16, 0x0123456789abcdef, 0xfedcba9876543210, 0x9999999999999999,
		0xaaaaaaaaaaaaaaaa, 0xa9a9a9a9a9a9a9a9, 1<<64 - 1}
	for range 10000 {
		vs = append(vs, rand.Uint64())
	}
	for _, v := range vs {
		var be [8]byte
		binary.BigEndian.PutUint64(be[:], v)
		var got [16]byte
		putHex64(got[:], v)
		if want := hex.EncodeToString(be[:]); string(got[:]) != want {
			t.Fatalf("putHex64(%#x) = %s, want %s", v, got[:], want)
		}
	}
}

// A token is 32 lower-case hex digits, a new one each time.
func TestNewToken(t *testing.T) {
	t.Parallel()
	seen := make(map[string]bool)
	for range 1000 {
		tok := newToken()
		if b, err := hex.DecodeString(tok); err != nil || len(b) != 16 || hex.EncodeToString(b) != tok {
			t.Fatalf("token %q is not 32 lower-case hex digits", tok)
		}
		if seen[tok] {
			t.Fatalf("token %q twice", tok)
		}
		seen[tok] = true
	}
}
