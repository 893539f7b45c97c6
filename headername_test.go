package idem

import (
	"net/http"
	"testing"
)

// The middleware reads request headers by the map's key, not Get: its
// names must be canonical, or a request's header would go unseen.
func TestHeaderNamesCanonical(t *testing.T) {
	t.Parallel()
	for _, name := range []string{HeaderKey, headerContentType} {
		if c := http.CanonicalHeaderKey(name); c != name {
			t.Errorf("%q is not canonical: %q", name, c)
		}
	}
	h := http.Header{}
	h.Set("content-type", "application/json")
	if got := firstValue(h, headerContentType); got != "application/json" {
		t.Errorf("firstValue = %q, want application/json", got)
	}
	if got := firstValue(h, HeaderKey); got != "" {
		t.Errorf("firstValue of a missing header = %q, want empty", got)
	}
}
