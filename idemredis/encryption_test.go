package idemredis

import (
	"bytes"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemtest"
)

// rawBytes returns everything Redis holds under prefix: each key's DUMP
// (its RDB serialisation, as in a dump file) and its plain value.
func rawBytes(t *testing.T, client redis.UniversalClient, prefix string) (all []byte, keys int) {
	t.Helper()
	ctx := t.Context()
	iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		keys++
		dump, err := client.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, dump...)
		switch typ := client.Type(ctx, k).Val(); typ {
		case "hash":
			for f, v := range client.HGetAll(ctx, k).Val() {
				all = append(all, f+v...)
			}
		case "string":
			all = append(all, client.Get(ctx, k).Val()...)
		case "zset":
			for _, m := range client.ZRange(ctx, k, 0, -1).Val() {
				all = append(all, m...)
			}
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return all, keys
}

// With a keyring, no byte of a stored header value or body is in Redis;
// without one, they are (so the search works).
func TestEncryptedAtRestInRedis(t *testing.T) {
	t.Parallel()
	client := sharedClient(t)
	for _, tt := range []struct {
		name    string
		kr      *idemcrypt.Keyring
		inRedis bool
	}{
		{"Plain", nil, true},
		{"Keyring", idemtest.NewTestKeyring(t, "k1"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, client, time.Now)
			marker := idemtest.WriteSealedResponses(t, s, tt.kr)
			all, keys := rawBytes(t, client, s.prefix)
			if keys == 0 {
				t.Fatalf("no keys under %q", s.prefix)
			}
			if found := bytes.Contains(all, []byte(marker)); found != tt.inRedis {
				t.Fatalf("marker in Redis: %v, want %v", found, tt.inRedis)
			}
		})
	}
}
