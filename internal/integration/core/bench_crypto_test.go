package idem_test

import (
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/benchkit"
)

// BenchmarkEncryption measures a new key and a replay with and without
// Config.Keyring, on the memory store and on SQLite (BENCHMARKS.md).
func BenchmarkEncryption(b *testing.B) {
	secret := make([]byte, idemcrypt.KeySize)
	rand.Read(secret)
	kr, err := idemcrypt.NewKeyring(idemcrypt.Key{Name: "bench", Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	stores := map[string]func(b *testing.B, now func() time.Time) idemstore.Store{
		"memory": func(b *testing.B, now func() time.Time) idemstore.Store {
			return idemmem.New(&idemmem.Config{Now: now})
		},
		"sqlite": func(b *testing.B, now func() time.Time) idemstore.Store {
			s, err := idemsqlite.Open(filepath.Join(b.TempDir(), "bench.db"), &idemsqlite.Config{Now: now})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		},
	}
	for _, name := range []string{"memory", "sqlite"} {
		for _, mode := range []struct {
			name string
			kr   *idemcrypt.Keyring
		}{{"plain", nil}, {"sealed", kr}} {
			b.Run(name+"/"+mode.name+"/first", func(b *testing.B) {
				clock := idemtest.NewClock(benchEpoch)
				store := stores[name](b, clock.Now)
				h := idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Keyring: mode.kr, Clock: clock}})(benchkit.Handler)
				n := min(b.N, benchKeys)
				keys, bodies := benchFirstRequests(n)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					k := i % benchKeys
					if i > 0 && k == 0 {
						clock.Advance(25 * time.Hour) // the records of the previous turn expire
					}
					w := httptest.NewRecorder()
					h.ServeHTTP(w, benchkit.RequestBody(keys[k], bodies[i%len(bodies)]))
					if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "" {
						b.Fatal(w.Code, w.Body)
					}
				}
			})
			b.Run(name+"/"+mode.name+"/replay", func(b *testing.B) {
				h := idem.New(stores[name](b, nil), &idem.Config{GuardConfig: idem.GuardConfig{Keyring: mode.kr}})(benchkit.Handler)
				h.ServeHTTP(httptest.NewRecorder(), benchkit.Request("replayed"))
				b.ReportAllocs()
				for b.Loop() {
					w := httptest.NewRecorder()
					h.ServeHTTP(w, benchkit.Request("replayed"))
					if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "true" {
						b.Fatal(w.Code)
					}
				}
			})
		}
	}
}
