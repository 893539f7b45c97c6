package idem

import (
	"bytes"
	"net/http/httptest"
	"strconv"
	"testing"
)

// A response with a Content-Length within the limit is buffered in one
// allocation of that size, however many writes it comes in; without one,
// or beyond the limit, the buffer grows as written. The buffered body is
// what was written either way.
func TestRecorderSizesBufferByContentLength(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 10_000)
	for _, tc := range []struct {
		name          string
		contentLength string
		max           int64
		wantCap       int
	}{
		{"declared", strconv.Itoa(len(body)), 1 << 20, len(body)},
		{"undeclared", "", 1 << 20, 0},
		{"not a number", "lots", 1 << 20, 0},
		{"beyond the limit", strconv.Itoa(len(body)), int64(len(body) - 1), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			r := &recorder{w: w, max: tc.max}
			if tc.contentLength != "" {
				r.Header().Set("Content-Length", tc.contentLength)
			}
			r.WriteHeader(201)
			for i := 0; i < len(body); i += 4096 {
				if _, err := r.Write(body[i:min(i+4096, len(body))]); err != nil {
					t.Fatal(err)
				}
			}
			if r.streamed {
				if tc.max >= int64(len(body)) {
					t.Fatal("streamed within the limit")
				}
				return
			}
			if !bytes.Equal(r.buf, body) {
				t.Fatalf("buffered %d bytes, want the %d written", len(r.buf), len(body))
			}
			if tc.wantCap != 0 && cap(r.buf) != tc.wantCap {
				t.Errorf("cap = %d, want %d", cap(r.buf), tc.wantCap)
			}
		})
	}
}
