//go:build idembench

package idem

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
)

// countMetrics counts every call it gets.
type countMetrics struct{ calls atomic.Int64 }

func (m *countMetrics) Decision(string, string, Decision)      { m.calls.Add(1) }
func (m *countMetrics) StoreCall(string, time.Duration, error) { m.calls.Add(1) }
func (m *countMetrics) ResponseStored(string, int)             { m.calls.Add(1) }

// TestBenchOffMetrics: with the metrics feature off, Config.Metrics gets
// no call at all, from the core or from the HTTP adapter (an invalid key,
// a stored response). Not parallel: it sets offMetrics.
func TestBenchOffMetrics(t *testing.T) {
	defer func(was bool) { offMetrics = was }(offMetrics)
	offMetrics = true
	m := &countMetrics{}
	h := New(idemmem.New(nil), &Config{GuardConfig: GuardConfig{Metrics: m}})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for _, key := range []string{"k1", "k1", "bad key\x01"} {
		r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"a":1}`))
		r.Header.Set(HeaderKey, key)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	if n := m.calls.Load(); n != 0 {
		t.Fatalf("Metrics got %d calls with the metrics feature off", n)
	}
}
