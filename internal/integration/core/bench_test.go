package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/benchkit"
)

// The first-request benchmarks send benchKeys distinct keys, each with its
// own body (benchkit.Body with another order number), as clients do; every
// request pays the whole fingerprint (the fingerprint cache remembers
// retries only). On the memory store the keys are reused in turns, and the
// store's clock jumps past the TTL at every turn, so the store stays at
// benchKeys records, as a store with a reaper does, instead of growing with
// b.N (its garbage collection would otherwise be most of
// what the benchmark measured). The SQLite store keeps every record.
const benchKeys = 10000

var benchEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// benchFirstRequests returns n keys and min(n, benchKeys) bodies for first
// requests (the caller indexes the bodies modulo their number).
func benchFirstRequests(n int) (keys, bodies []string) {
	keys = make([]string, max(n, 1))
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	bodies = make([]string, min(max(n, 1), benchKeys))
	for i := range bodies {
		order := fmt.Sprintf("%05d", i)
		bodies[i] = strings.ReplaceAll(benchkit.Body, "48213", order)
	}
	return keys, bodies
}

func BenchmarkBare(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		benchkit.Handler.ServeHTTP(httptest.NewRecorder(), benchkit.Request("k"))
	}
}

func BenchmarkMiddleware(b *testing.B) {
	stores := map[string]func(b *testing.B) idemstore.Store{
		"memory": func(b *testing.B) idemstore.Store { return idemmem.New(nil) },
		"sqlite": func(b *testing.B) idemstore.Store {
			s, err := idemsqlite.Open(filepath.Join(b.TempDir(), "bench.db"), nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		},
	}
	for _, name := range []string{"memory", "sqlite"} {
		b.Run(name+"/first", func(b *testing.B) {
			store, turn := stores[name](b), 0
			if name == "memory" {
				store = idemmem.New(&idemmem.Config{Now: func() time.Time { return benchEpoch.Add(time.Duration(turn) * 25 * time.Hour) }})
			}
			h := idem.New(store, nil)(benchkit.Handler)
			n := b.N
			if name == "memory" {
				n = min(n, benchKeys)
			}
			keys, bodies := benchFirstRequests(n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := i
				if name == "memory" {
					k = i % benchKeys
					if i > 0 && k == 0 {
						turn++ // the records of the previous turn expire
					}
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, benchkit.RequestBody(keys[k], bodies[i%len(bodies)]))
				if w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "" {
					b.Fatal(w.Code, w.Body)
				}
			}
		})
		b.Run(name+"/replay", func(b *testing.B) {
			h := idem.New(stores[name](b), nil)(benchkit.Handler)
			h.ServeHTTP(httptest.NewRecorder(), benchkit.Request("replayed"))
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, benchkit.Request("replayed"))
				if w.Code != http.StatusCreated {
					b.Fatal(w.Code)
				}
			}
		})
		b.Run(name+"/conflict", func(b *testing.B) {
			store := stores[name](b)
			h := idem.New(store, nil)(benchkit.Handler)
			// Hold the key the way a running attempt would.
			fp := idem.Fingerprint("POST", "POST /v1/payments", "", "application/json", []byte(benchkit.Body), idem.FingerprintConfig{})
			_, err := store.KeyReserve(context.Background(), &idemstore.ReserveParams{
				Identity:    idemstore.Identity{Endpoint: "POST /v1/payments", Key: "held"},
				Fingerprint: fp, Token: "t", Lease: time.Hour, TTL: 2 * time.Hour, LeaseExpiredState: idemstore.StateUnknown,
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, benchkit.Request("held"))
				if w.Code != http.StatusConflict {
					b.Fatal(w.Code, w.Body)
				}
			}
		})
	}
}
