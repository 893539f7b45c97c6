package neverstored

import (
	"net/http"
	"testing"
)

func TestNamesAreCanonical(t *testing.T) {
	t.Parallel()
	for n := range names {
		if c := http.CanonicalHeaderKey(n); c != n {
			t.Errorf("%q is not canonical (%q): Has would never match it", n, c)
		}
		if !Has(n) {
			t.Errorf("Has(%q) = false", n)
		}
	}
	for _, n := range []string{Sealed, Replayed, "Set-Cookie", "Authorization"} {
		if !Has(n) {
			t.Errorf("Has(%q) = false", n)
		}
	}
	if Has("Content-Type") || Has("Location") {
		t.Error("a replayed header is listed as never stored")
	}
}
