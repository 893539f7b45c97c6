package idemsqlite_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// openStore opens a store on a new file in t's temporary directory.
func openStore(t testing.TB, cfg *idemsqlite.Config) *idemsqlite.Store {
	t.Helper()
	s, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestStore(t *testing.T) {
	t.Parallel()
	idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
		return openStore(t, &idemsqlite.Config{Now: clock.Now})
	})
}

// TestStoreReadFirst runs the store's tests with KeyReserve pinned to each
// of its two orders (TestStore lets the store choose): reading the record
// before the write, and writing at once. They must answer alike.
func TestStoreReadFirst(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("readFirst=", on), func(t *testing.T) {
			t.Parallel()
			idemtest.RunStoreTests(t, func(t *testing.T, clock *idemtest.Clock) idemstore.Store {
				s := openStore(t, &idemsqlite.Config{Now: clock.Now})
				idemsqlite.PinReadFirst(s, on)
				return s
			})
		})
	}
}

// TestReadFirstFollowsTheKeys: KeyReserve writes at once while it meets new
// keys, reads first once a reservation found a record (a replay), and goes
// back to writing at once after enough new keys.
func TestReadFirstFollowsTheKeys(t *testing.T) {
	t.Parallel()
	s := openStore(t, nil)
	ctx := t.Context()
	newKey := func(key string) {
		t.Helper()
		if res, err := s.KeyReserve(ctx, reserveParams(key, "t-"+key)); err != nil || !res.Reserved {
			t.Fatalf("KeyReserve(%s) = %+v, %v; want reserved", key, res, err)
		}
	}
	newKey("a")
	if idemsqlite.ReadsFirst(s) {
		t.Fatal("reads first after a new key")
	}
	if res, err := s.KeyReserve(ctx, reserveParams("a", "t-again")); err != nil || res.Reserved || res.Record.Token != "t-a" {
		t.Fatalf("KeyReserve(a) again = %+v, %v; want a's record, not reserved", res, err)
	}
	if !idemsqlite.ReadsFirst(s) {
		t.Fatal("does not read first after a reservation found a record")
	}
	for i := range 64 {
		if !idemsqlite.ReadsFirst(s) {
			if i < 8 {
				t.Fatalf("stopped reading first after %d new keys", i)
			}
			return
		}
		newKey(fmt.Sprint("new-", i))
	}
	t.Fatal("still reads first after 64 new keys")
}
