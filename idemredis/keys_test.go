package idemredis

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// legacyKeysOf is keysOf as it was before it built all keys in one
// allocation: the reference the new one must match exactly (the key layout
// is persistent).
func legacyKeysOf(prefix string, id idemstore.Identity) recordKeys {
	member := id.Hash() // the length-prefixed SHA-256 of the identity
	sum, err := hex.DecodeString(member)
	if err != nil {
		panic(err)
	}
	bucket := int(binary.BigEndian.Uint16(sum)) % bucketCount
	return legacyBucketKeys(prefix, bucket, member)
}

func legacyBucketKeys(prefix string, bucket int, member string) recordKeys {
	tag := fmt.Sprintf("%s{%03x}", prefix, bucket)
	return recordKeys{
		record:  tag + ":r:" + member,
		index:   tag + ":leases",
		expiry:  tag + ":expiry",
		member:  member,
		channel: tag + ":c:" + member,
		// Added with the reconciliation state.
		unknown:   tag + ":unknown",
		reconcile: tag + ":reconcile",
	}
}

func TestKeysMatchLegacy(t *testing.T) {
	ids := []idemstore.Identity{
		{},
		testID,
		{Scope: "ab", Endpoint: "c", Key: "d"},
		{Scope: "a", Endpoint: "bc", Key: "d"},
		{Scope: "tenant-ü", Endpoint: "PUT /x/{id}", Key: "\x00\xff*?[]"},
		{Scope: strings.Repeat("s", 300), Endpoint: "POST /", Key: strings.Repeat("k", 1000)},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(200))
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		i, j := rng.IntN(len(b)+1), rng.IntN(len(b)+1)
		i, j = min(i, j), max(i, j)
		ids = append(ids, idemstore.Identity{Scope: string(b[:i]), Endpoint: string(b[i:j]), Key: string(b[j:])})
	}
	for _, prefix := range []string{"idem:", "", "app:idem:", "ü"} {
		s := New(nil, &Config{Prefix: prefix})
		if prefix == "" {
			prefix = "idem:" // New's default
		}
		for _, id := range ids {
			got, want := s.keysOf(id), legacyKeysOf(prefix, id)
			boxed := got.boxed
			got.boxed = nil
			if got != want {
				t.Fatalf("keysOf(%q) with prefix %q = %+v, want %+v", id, prefix, got, want)
			}
			if boxed == nil || *boxed != (boxedKeys{record: want.record, index: want.index, expiry: want.expiry,
				unknown: want.unknown, reconcile: want.reconcile, member: want.member, channel: want.channel}) {
				t.Fatalf("keysOf(%q) boxed %+v, want its names", id, boxed)
			}
		}
		for bucket := range bucketCount {
			for _, member := range []string{"", "m", "0123456789abcdef"} {
				if got, want := s.bucketKeys(bucket, member), legacyBucketKeys(prefix, bucket, member); got != want {
					t.Fatalf("bucketKeys(%d, %q) = %+v, want %+v", bucket, member, got, want)
				}
			}
			if got, want := s.bucketTag(bucket), fmt.Sprintf("%s{%03x}", prefix, bucket); got != want {
				t.Fatalf("bucketTag(%d) = %q, want %q", bucket, got, want)
			}
		}
	}
}

func BenchmarkKeysOf(b *testing.B) {
	s := New(nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		_ = s.keysOf(testID)
	}
}

// TestMemberAndChannelFromRecord checks what member_of and channel_of of
// lua/lib.lua assume of keysOf: a record's name ends with its member of 64
// hex digits, after ":r:", and its channel is the same name with ":c:".
func TestMemberAndChannelFromRecord(t *testing.T) {
	for _, prefix := range []string{"idem:", "", "a:r:b", "ü"} {
		s := New(nil, &Config{Prefix: prefix})
		for _, id := range []idemstore.Identity{testID, {}, {Scope: "s", Endpoint: ":r:", Key: "k:r:"}} {
			k := s.keysOf(id)
			member := k.record[len(k.record)-64:]                   // member_of
			channel := k.record[:len(k.record)-67] + ":c:" + member // channel_of
			if member != k.member || channel != k.channel || len(k.member) != 64 {
				t.Errorf("prefix %q: record %s: member %s, channel %s; want %s, %s", prefix, k.record, member, channel, k.member, k.channel)
			}
		}
	}
}
