package idemcrypt_test

import (
	"crypto/rand"
	"net/http"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
)

// benchResponse is the answer of the middleware benchmarks (BENCHMARKS.md).
var benchResponse = &idemstore.Response{
	Status: 201,
	Header: http.Header{"Content-Type": {"application/json"}},
	Body:   []byte(`{"id":"pay_1","status":"pending","amount_cents":129900,"currency":"EUR"}`),
}

func benchKeyring(b *testing.B) *idemcrypt.Keyring {
	secret := make([]byte, idemcrypt.KeySize)
	rand.Read(secret)
	kr, err := idemcrypt.NewKeyring(idemcrypt.Key{Name: "bench", Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	return kr
}

var benchID = idemcrypt.Binding{
	Identity:    idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0"},
	Fingerprint: "5f1d3c2b1a09f8e7d6c5b4a3928170600112233445566778899aabbccddeeff0",
	CreatedAt:   time.Unix(1767225600, 123456000),
}

func BenchmarkSeal(b *testing.B) {
	kr := benchKeyring(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := kr.Seal(benchID, benchResponse); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpen(b *testing.B) {
	kr := benchKeyring(b)
	sealed, err := kr.Seal(benchID, benchResponse)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := kr.Open(benchID, sealed); err != nil {
			b.Fatal(err)
		}
	}
}
