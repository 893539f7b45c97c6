package idem_test

import (
	"slices"
	"testing"

	"github.com/idem-dev/idem"
)

// No caller can change the process-wide default allow-list.
func TestDefaultStoredHeadersIsACopy(t *testing.T) {
	t.Parallel()
	h := idem.DefaultStoredHeaders()
	want := slices.Clone(h)
	h[0] = "Set-Cookie"
	_ = append(h[:1], "Authorization")
	if got := idem.DefaultStoredHeaders(); !slices.Equal(got, want) {
		t.Fatalf("DefaultStoredHeaders() = %v after a caller changed its copy, want %v", got, want)
	}
}
