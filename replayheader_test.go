package idem_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// A replay answers every stored value of every stored header, in order,
// with Idempotent-Replayed: true, and each replay's header is its own: a
// caller that changes one in place changes neither the store's nor the
// next replay's.
func TestReplayCopiesEveryHeaderValue(t *testing.T) {
	t.Parallel()
	want := http.Header{
		"Content-Type": {"application/json"},
		"Link":         {"<a>", "<b>", "<c>"},
		"Etag":         {`"1"`},
		"X-Multi":      {"1", "2"},
	}
	h := idem.New(idemmem.New(nil), &idem.Config{StoredHeaders: []string{"Content-Type", "Link", "ETag", "X-Multi", "Idempotent-Replayed"}})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for name, vs := range want {
				w.Header()[name] = slices.Clone(vs)
			}
			w.Header().Set(idem.HeaderReplayed, "handler")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"ok":true}`))
		}))
	send := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/v1/things", strings.NewReader(`{"a":1}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(idem.HeaderKey, "header-key")
		h.ServeHTTP(w, r)
		return w
	}
	send()
	for i := range 3 {
		w := send()
		got := w.Result().Header
		if w.Code != http.StatusCreated || w.Body.String() != `{"ok":true}` {
			t.Fatalf("replay %d: %d %q", i, w.Code, w.Body)
		}
		if vs := got[idem.HeaderReplayed]; !slices.Equal(vs, []string{"true"}) {
			t.Fatalf("replay %d: %s = %q, want [true]", i, idem.HeaderReplayed, vs)
		}
		for name, vs := range want {
			if !slices.Equal(got[name], vs) {
				t.Fatalf("replay %d: %s = %q, want %q", i, name, got[name], vs)
			}
		}
		// Change this replay's values in place and grow them: the next
		// replay must not see it.
		for _, vs := range w.Header() {
			for j := range vs {
				vs[j] = "changed"
			}
			_ = append(vs, "appended")
		}
	}
}
