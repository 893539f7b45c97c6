package idem_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// One MetricsPathPrefix, asked again and again about many paths and
// methods (more than it keeps labels of), answers as a fresh one does; one
// finds a label it kept without allocating.
func TestMetricsPathPrefixReused(t *testing.T) { // not parallel: AllocsPerRun
	for segments := range 3 {
		label := idem.MetricsPathPrefix(segments)
		for round := range 3 {
			for i := range 300 {
				for _, method := range []string{"POST", "PUT", "PATCH"} {
					path := fmt.Sprintf("/v%d/things/%d/x", i%100, i)
					r := httptest.NewRequest(method, path, nil)
					if got, want := label(r), idem.MetricsPathPrefix(segments)(r); got != want {
						t.Fatalf("round %d: MetricsPathPrefix(%d)(%s %s) = %q, fresh %q", round, segments, method, path, got, want)
					}
				}
			}
		}
		label = idem.MetricsPathPrefix(segments) // its slots free
		r := httptest.NewRequest("POST", "/v1/payments", nil)
		want := label(r)
		if n := testing.AllocsPerRun(100, func() {
			if label(r) != want {
				t.Fatal("the label changed")
			}
		}); n != 0 {
			t.Errorf("MetricsPathPrefix(%d): %v allocations a request, want 0", segments, n)
		}
	}
}

// EscapedPathEndpoint names a request by its method and its path as sent,
// asked again and again about many paths and methods (more than it keeps
// names of), and finds a name it kept without allocating.
func TestEscapedPathEndpoint(t *testing.T) { // not parallel: AllocsPerRun
	endpoint := idem.EscapedPathEndpoint()
	for round := range 3 {
		for i := range 300 {
			for _, method := range []string{"POST", "PUT"} {
				path := fmt.Sprintf("/v1/a%%2Fb/%d", i)
				r := httptest.NewRequest(method, path, nil)
				if got, want := endpoint(r), method+" "+path; got != want {
					t.Fatalf("round %d: EscapedPathEndpoint()(%s %s) = %q, want %q", round, method, path, got, want)
				}
			}
		}
	}
	endpoint = idem.EscapedPathEndpoint()
	r := httptest.NewRequest("POST", "/v1/payments", nil)
	endpoint(r)
	if n := testing.AllocsPerRun(100, func() {
		if endpoint(r) != "POST /v1/payments" {
			t.Fatal("the name changed")
		}
	}); n != 0 {
		t.Errorf("EscapedPathEndpoint: %v allocations a request, want 0", n)
	}
}

// Logs and span attributes name an unrouted request's endpoint by its
// metrics label, never by its raw path, which may carry a secret (POST
// /v1/reset/SECRETPATHTOKEN); the record keeps the path.
func TestRawPathNeverLogged(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	tr := &recordingTracer{attrs: map[string]string{}}
	cfg := &idem.Config{GuardConfig: idem.GuardConfig{
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Tracer: tr,
	}}
	h := idem.New(idemmem.New(nil), cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idem.MarkUnknown(r.Context())
		w.WriteHeader(http.StatusBadGateway)
	}))
	for _, body := range []string{`{"a":1}`, `{"a":1}`, `{"a":2}`} { // unknown, then refused as unknown, then reused
		r := httptest.NewRequest("POST", "/v1/reset/SECRETPATHTOKEN", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "k1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	out := logs.String()
	if !strings.Contains(out, "outcome unknown") || !strings.Contains(out, "key reused") {
		t.Fatalf("the log lines the test looks at are missing:\n%s", out)
	}
	if strings.Contains(out, "SECRETPATHTOKEN") {
		t.Errorf("a raw path appeared in the log:\n%s", out)
	}
	if !strings.Contains(out, `endpoint="POST /*"`) {
		t.Errorf("the log does not name the endpoint by its label:\n%s", out)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for k, v := range tr.attrs {
		if strings.Contains(v, "SECRETPATHTOKEN") {
			t.Errorf("span attribute %s = %q carries the raw path", k, v)
		}
	}
}

// Config.Endpoint names the record and, without MetricsEndpoint, the
// metrics label: the middleware asks it once a request, not once for each.
func TestEndpointCalledOnce(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	cfg := &idem.Config{Endpoint: func(r *http.Request) string {
		calls.Add(1)
		return "POST payments"
	}}
	h := idem.New(idemmem.New(nil), cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for i := range 2 { // a new key, then its replay
		r := httptest.NewRequest("POST", "/v1/payments", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("request %d answered %d", i, w.Code)
		}
		if n := calls.Swap(0); n != 1 {
			t.Fatalf("request %d called Config.Endpoint %d times, want 1", i, n)
		}
	}
}
