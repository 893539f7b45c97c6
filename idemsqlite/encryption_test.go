package idemsqlite_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemtest"
)

// With a keyring, no byte of a stored header value or body is in the
// database file or its WAL; without one, they are (so the search works).
func TestEncryptedAtRestInTheFile(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		kr      *idemcrypt.Keyring
		inFiles bool
	}{
		{"Plain", nil, true},
		{"Keyring", idemtest.NewTestKeyring(t, "k1"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "idem.db")
			s, err := idemsqlite.Open(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			marker := idemtest.WriteSealedResponses(t, s, tt.kr)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			found := false
			files, _ := filepath.Glob(path + "*")
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				found = found || bytes.Contains(b, []byte(marker))
			}
			if found != tt.inFiles {
				t.Fatalf("marker in %v: %v, want %v", files, found, tt.inFiles)
			}
		})
	}
}
