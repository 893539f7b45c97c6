package idem

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
)

// deadlineWriter is a writer that can bound the connection's reads, as
// net/http's own can.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	deadlines []time.Time
}

func (w *deadlineWriter) SetReadDeadline(t time.Time) error {
	w.deadlines = append(w.deadlines, t)
	return nil
}

// The body is read under Config.BodyTimeout's deadline, which is lifted
// once the body is in.
func TestReadBodySetsAndLiftsTheDeadline(t *testing.T) {
	t.Parallel()
	m := newMiddleware(idemmem.New(nil), &Config{BodyTimeout: time.Minute})
	w := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	r := httptest.NewRequest("POST", "/", strings.NewReader(`{"a":1}`))
	body, tooLarge, err := m.readBody(w, r)
	if err != nil || tooLarge || string(body) != `{"a":1}` {
		t.Fatalf("readBody = %q, %v, %v", body, tooLarge, err)
	}
	if len(w.deadlines) != 2 || time.Until(w.deadlines[0]) < 50*time.Second || !w.deadlines[1].IsZero() {
		t.Errorf("deadlines %v, want one a minute ahead and then none", w.deadlines)
	}
}

func BenchmarkReadBody(b *testing.B) {
	m := newMiddleware(idemmem.New(nil), nil)
	w := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	body := strings.NewReader(benchBody)
	r := httptest.NewRequest("POST", "/", body)
	b.ReportAllocs()
	for b.Loop() {
		body.Reset(benchBody)
		w.deadlines = w.deadlines[:0]
		if _, _, err := m.readBody(w, r); err != nil {
			b.Fatal(err)
		}
	}
}

var _ http.ResponseWriter = (*deadlineWriter)(nil)
