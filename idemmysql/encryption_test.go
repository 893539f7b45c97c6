package idemmysql

import (
	"bytes"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemtest"
)

// With a keyring, no byte of a stored header value or body is in the
// table; without one, they are (so the search works).
func TestEncryptedAtRestInTheTable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		kr      *idemcrypt.Keyring
		inTable bool
	}{
		{"Plain", nil, true},
		{"Keyring", idemtest.NewTestKeyring(t, "k1"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, time.Now)
			marker := idemtest.WriteSealedResponses(t, s, tt.kr)
			rows, err := s.db.QueryContext(t.Context(),
				`SELECT coalesce(response_header, ''), coalesce(response_body, '') FROM idem_keys`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			found, n := false, 0
			for rows.Next() {
				var header, body []byte
				if err := rows.Scan(&header, &body); err != nil {
					t.Fatal(err)
				}
				found = found || bytes.Contains(append(header, body...), []byte(marker))
				n++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if n != 3 || found != tt.inTable {
				t.Fatalf("%d rows, marker in the table: %v; want 3 rows, %v", n, found, tt.inTable)
			}
		})
	}
}
