package idemcrypt_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// Responses sealed at rest: the store holds ciphertext under the keyring's
// first key, and a replay opens it.
func ExampleNew() {
	secret := make([]byte, idemcrypt.KeySize) // in production: from a secret manager, see LoadKeyring
	rand.Read(secret)
	kr, err := idemcrypt.NewKeyring(idemcrypt.Key{Name: "2026-11", Secret: secret})
	if err != nil {
		panic(err)
	}
	inner := idemmem.New(nil)
	h := idem.New(inner, &idem.Config{GuardConfig: idem.GuardConfig{Keyring: kr}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"card_last4":"4242"}`))
	}))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/v1/cards", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "card-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d %s replayed=%q\n", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
	}

	rec, err := inner.KeyGet(context.Background(), idemstore.Identity{Endpoint: "POST /v1/cards", Key: "card-1"})
	if err != nil {
		panic(err)
	}
	name, sealed := idemcrypt.SealedBy(rec.Response)
	fmt.Println("stored sealed:", sealed, "under", name, "plaintext stored:", bytes.Contains(rec.Response.Body, []byte("4242")))
	// Output:
	// 201 {"card_last4":"4242"} replayed=""
	// 201 {"card_last4":"4242"} replayed="true"
	// stored sealed: true under 2026-11 plaintext stored: false
}
