package idem

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// deadlineRecorder is a writer with a read deadline, as net/http's own.
type deadlineRecorder struct {
	http.ResponseWriter
	set []time.Time
}

func (w *deadlineRecorder) SetReadDeadline(t time.Time) error {
	w.set = append(w.set, t)
	return nil
}

// unwrapping wraps a writer as a middleware that supports
// http.ResponseController does.
type unwrapping struct{ http.ResponseWriter }

func (w unwrapping) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// opaque wraps a writer without Unwrap.
type opaque struct{ http.ResponseWriter }

// setReadDeadline finds the deadline as http.ResponseController does, and
// allocates nothing, not even for a writer without one.
func TestSetReadDeadline(t *testing.T) {
	at := time.Unix(1e9, 0)
	inner := &deadlineRecorder{ResponseWriter: httptest.NewRecorder()}
	for _, c := range []struct {
		name string
		w    http.ResponseWriter
		want error // nil: inner gets the deadline
	}{
		{"direct", inner, nil},
		{"unwrapped twice", unwrapping{unwrapping{inner}}, nil},
		{"recorder", httptest.NewRecorder(), http.ErrNotSupported},
		{"opaque wrapper", opaque{inner}, http.ErrNotSupported},
		{"unwrapped to a recorder", unwrapping{httptest.NewRecorder()}, http.ErrNotSupported},
	} {
		t.Run(c.name, func(t *testing.T) {
			inner.set = inner.set[:0]
			err := setReadDeadline(c.w, at)
			if c.want == nil {
				if err != nil || len(inner.set) != 1 || !inner.set[0].Equal(at) {
					t.Fatalf("error %v, deadlines set %v; want %v set", err, inner.set, at)
				}
			} else if !errors.Is(err, c.want) || len(inner.set) != 0 {
				t.Fatalf("error %v, deadlines set %v; want %v and none set", err, inner.set, c.want)
			}
			if c.want == nil {
				return // appending to inner.set allocates
			}
			if n := testing.AllocsPerRun(100, func() { setReadDeadline(c.w, at) }); n != 0 {
				t.Fatalf("%v allocations per call, want 0", n)
			}
		})
	}
}
