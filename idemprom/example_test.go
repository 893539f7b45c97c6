package idemprom_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemprom"
)

func Example() {
	reg := prometheus.NewRegistry()
	metrics := idemprom.New(reg, nil)
	protect := idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{Metrics: metrics}})

	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	for range 2 { // a request and its retry
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "order-1")
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for line := range strings.Lines(rec.Body.String()) {
		if strings.HasPrefix(line, "idem_decisions_total") {
			fmt.Print(line)
		}
	}
	// Output:
	// idem_decisions_total{decision="created",endpoint="POST /v1/payments",tenant=""} 1
	// idem_decisions_total{decision="replayed",endpoint="POST /v1/payments",tenant=""} 1
}
