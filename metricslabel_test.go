package idem_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// labelMetrics records the endpoint labels Metrics are given.
type labelMetrics struct {
	mu     sync.Mutex
	labels []string
}

func (m *labelMetrics) Decision(endpoint, scope string, d idem.Decision) { m.add(endpoint) }
func (m *labelMetrics) StoreCall(string, time.Duration, error)           {}
func (m *labelMetrics) ResponseStored(endpoint string, n int)            { m.add(endpoint) }

func (m *labelMetrics) add(l string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.labels, l) {
		m.labels = append(m.labels, l)
	}
}

// Metrics never get the raw path of an unrouted request (which may carry
// a secret: POST /v1/reset/SECRETPATHTOKEN) unless configured to: they
// get the route pattern, or the method and as many leading path segments
// as MetricsEndpoint says.
func TestMetricsEndpointLabel(t *testing.T) {
	t.Parallel()
	created := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	tests := []struct {
		name  string
		cfg   idem.Config
		mux   bool // routed by an http.ServeMux pattern
		want  []string
		paths []string
	}{
		{name: "Unrouted", want: []string{"POST /*"}},
		{name: "Pattern", mux: true, want: []string{"POST /v1/reset/{token}"}},
		{name: "RawEndpointTwoSegments", cfg: idem.Config{
			Endpoint:        func(r *http.Request) string { return r.Method + " " + r.URL.EscapedPath() },
			MetricsEndpoint: idem.MetricsPathPrefix(2),
		}, want: []string{"POST /v1/reset/*"}},
		{name: "Invalid", paths: []string{"bad key"}, want: []string{"POST /*"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := &labelMetrics{}
			cfg := tt.cfg
			cfg.Metrics = m
			var h http.Handler = idem.New(idemmem.New(nil), &cfg)(created)
			if tt.mux {
				mux := http.NewServeMux()
				mux.Handle("POST /v1/reset/{token}", h)
				h = mux
			}
			key := "k1"
			if len(tt.paths) > 0 {
				key = tt.paths[0]
			}
			for range 2 {
				r := httptest.NewRequest("POST", "/v1/reset/SECRETPATHTOKEN", strings.NewReader("{}"))
				r.Header.Set("Idempotency-Key", key)
				h.ServeHTTP(httptest.NewRecorder(), r)
			}
			if !slices.Equal(m.labels, tt.want) {
				t.Fatalf("labels %q, want %q", m.labels, tt.want)
			}
		})
	}
}

func TestMetricsPathPrefix(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		n          int
		path, want string
	}{
		{0, "/v1/reset/TOKEN", "POST /*"},
		{0, "/", "POST /"},
		{1, "/v1/reset/TOKEN", "POST /v1/*"},
		{2, "/v1/reset/TOKEN", "POST /v1/reset/*"},
		{3, "/v1/reset/TOKEN", "POST /v1/reset/TOKEN"},
		{2, "/v1/payments", "POST /v1/payments"},
		{2, "/v1/payments/", "POST /v1/payments/"},
		{2, "/v1//x/y", "POST /v1//*"},
	} {
		r := httptest.NewRequest("POST", tt.path, nil)
		if got := idem.MetricsPathPrefix(tt.n)(r); got != tt.want {
			t.Errorf("MetricsPathPrefix(%d)(%q) = %q, want %q", tt.n, tt.path, got, tt.want)
		}
	}
}
