package idemcache

import (
	"bytes"
	"crypto/rand"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// Below the encryption, the Redis cache holds only ciphertext; without a
// keyring it holds the plaintext (so the search works).
func TestRedisCacheHoldsCiphertext(t *testing.T) {
	t.Parallel()
	client := redisClient(t)
	for _, tt := range []struct {
		name    string
		kr      *idemcrypt.Keyring
		inCache bool
	}{
		{"Plain", nil, true},
		{"Keyring", idemtest.NewTestKeyring(t, "k1"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cache := newRedisCache(t, client)
			store := New(idemmem.New(nil), cache, &Config{Logger: discardLogger()})
			marker := idemtest.WriteSealedResponses(t, store, tt.kr)
			ctx := t.Context()
			var all []byte
			n := 0
			iter := client.Scan(ctx, 0, cache.prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				n++
				dump, _ := client.Dump(ctx, iter.Val()).Result()
				val, _ := client.Get(ctx, iter.Val()).Bytes()
				all = append(append(all, dump...), val...)
			}
			if n == 0 {
				t.Fatal("nothing cached")
			}
			if found := bytes.Contains(all, []byte(marker)); found != tt.inCache {
				t.Fatalf("marker in the cache: %v, want %v", found, tt.inCache)
			}
		})
	}
}

// Rotation through the cache drops the cached copies; a copy under a
// retired key put back by a racing fill is dropped on use and the store
// asked again.
func TestRotationThroughTheCache(t *testing.T) {
	t.Parallel()
	secret := func() []byte { b := make([]byte, idemcrypt.KeySize); rand.Read(b); return b }
	oldKey, newKey := idemcrypt.Key{Name: "old", Secret: secret()}, idemcrypt.Key{Name: "new", Secret: secret()}
	old, _ := idemcrypt.NewKeyring(oldKey)
	both, _ := idemcrypt.NewKeyring(newKey, oldKey)
	newOnly, _ := idemcrypt.NewKeyring(newKey)

	lru := NewLRU(100, 0)
	cached := New(idemmem.New(nil), lru, &Config{Logger: discardLogger()})
	ctx := t.Context()
	id := idemstore.Identity{Scope: "s", Endpoint: "POST /x", Key: "k"}
	reserve := func(store idemstore.Store) (*idemstore.ReserveResult, error) {
		return store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: rand.Text(),
			Lease: time.Minute, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown})
	}
	enc := idemcrypt.New(cached, old)
	res, err := reserve(enc)
	if err != nil || !res.Reserved {
		t.Fatal(res, err)
	}
	resp := &idemstore.Response{Status: 201, Header: map[string][]string{"Location": {"/x/1"}}, Body: []byte("paid")}
	if err := enc.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: res.Record.Token, Response: resp}); err != nil {
		t.Fatal(err)
	}
	if _, err := reserve(enc); err != nil { // fills the cache
		t.Fatal(err)
	}
	stale, _ := lru.Get(ctx, id)
	if name, _ := idemcrypt.SealedBy(stale.Response); name != "old" {
		t.Fatalf("cached copy sealed by %q, want old", name)
	}

	prog, err := idemcrypt.Rotate(ctx, cached, both, nil)
	if err != nil || prog.Resealed != 1 {
		t.Fatalf("Rotate = %+v, %v", prog, err)
	}
	if rec, _ := lru.Get(ctx, id); rec != nil {
		t.Fatal("the rotation left the cached copy under the old key")
	}
	// A racing fill puts the old copy back.
	if err := lru.Set(ctx, stale); err != nil {
		t.Fatal(err)
	}
	got, err := reserve(idemcrypt.New(cached, newOnly))
	if err != nil || got.Reserved || string(got.Record.Response.Body) != "paid" {
		t.Fatalf("replay with the new key only after rotation: %+v, %v", got, err)
	}
	if rec, _ := lru.Get(ctx, id); rec == nil {
		t.Fatal("the replay did not refill the cache")
	} else if name, _ := idemcrypt.SealedBy(rec.Response); name != "new" {
		t.Fatalf("cache refilled with a copy sealed by %q, want new", name)
	}
}
