package idemotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemotel"
)

// The middleware's spans, recorded here in memory: a request around the
// reservation, the handler and the completion, with the decision and a
// hash of the key (never the key) as attributes.
func ExampleNewTracer() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())

	h := idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{Tracer: idemotel.NewTracer(tp)}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	r := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "order-1")
	h.ServeHTTP(httptest.NewRecorder(), r)

	var names []string
	for _, s := range spans.Ended() {
		names = append(names, s.Name())
		if s.Name() == "idem.request" {
			for _, a := range s.Attributes() {
				if a.Key == "idem.decision" {
					fmt.Println("decision:", a.Value.AsString())
				}
			}
		}
	}
	slices.Sort(names)
	fmt.Println(names)
	// Output:
	// decision: created
	// [idem.complete idem.handler idem.request idem.reserve]
}
