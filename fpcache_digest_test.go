package idem

import (
	"bytes"
	"crypto/rand"
	"testing"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmem"
)

// With a keyring, the fingerprint cache keeps no request body past its
// request, and still hits.
func TestFingerprintCacheKeepsNoBodyWithKeyring(t *testing.T) {
	t.Parallel()
	secret := make([]byte, idemcrypt.KeySize)
	rand.Read(secret)
	kr, err := idemcrypt.NewKeyring(idemcrypt.Key{Name: "k", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		kr      *idemcrypt.Keyring
		keepsIt bool
	}{{nil, true}, {kr, false}} {
		m := newMiddleware(idemmem.New(nil), &Config{GuardConfig: GuardConfig{Keyring: tt.kr}})
		body := []byte(`{"card":"4111-SECRET"}`)
		fp, _ := m.fps.fingerprint("POST", "POST /v1/p", "", "application/json", "", body, FingerprintConfig{})
		m.fps.remember("POST", "POST /v1/p", "", "application/json", "", body, fp)
		s := m.fps.slot(body).Load()
		if s == nil {
			t.Fatal("nothing remembered")
		}
		if got := bytes.Contains(s.body, []byte("4111-SECRET")); got != tt.keepsIt {
			t.Fatalf("keyring %v: the slot keeps the body: %v, want %v", tt.kr, got, tt.keepsIt)
		}
		if got, hit := m.fps.fingerprint("POST", "POST /v1/p", "", "application/json", "", body, FingerprintConfig{}); !hit || got != fp {
			t.Fatalf("keyring %v: retry = %s, hit %v; want %s from the cache", tt.kr, got, hit, fp)
		}
		other := []byte(`{"card":"4111-SECRET", "x":1}`)
		if _, hit := m.fps.fingerprint("POST", "POST /v1/p", "", "application/json", "", other, FingerprintConfig{}); hit {
			t.Fatalf("keyring %v: another body hit", tt.kr)
		}
	}
}
