package idemsqlite_test

import (
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
