package idemotel_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemotel"
	"github.com/idem-dev/idem/idemstore"
)

// rawKey is the client's key; it must never reach a span.
const rawKey = "order-7f3a-raw-key-must-not-leak"

type bundle struct {
	rec     *tracetest.SpanRecorder
	tp      *sdktrace.TracerProvider
	handler http.Handler
}

func setup(t *testing.T, store idemstore.Store) *bundle {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	mw := idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Tracer: idemotel.NewTracer(tp)}})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"p_1"}`))
	})))
	return &bundle{rec: rec, tp: tp, handler: mux}
}

// do sends one protected request inside a parent span and returns the
// parent's span context.
func (b *bundle) do(t *testing.T) trace.SpanContext {
	t.Helper()
	ctx, parent := b.tp.Tracer("test").Start(context.Background(), "client")
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set("Idempotency-Key", rawKey)
	req.Header.Set("Content-Type", "application/json")
	b.handler.ServeHTTP(httptest.NewRecorder(), req)
	parent.End()
	return parent.SpanContext()
}

func byName(spans []sdktrace.ReadOnlySpan) map[string][]sdktrace.ReadOnlySpan {
	m := make(map[string][]sdktrace.ReadOnlySpan)
	for _, s := range spans {
		m[s.Name()] = append(m[s.Name()], s)
	}
	return m
}

func attr(s sdktrace.ReadOnlySpan, key string) (string, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String(), true
		}
	}
	return "", false
}

// assertNoRawKey fails when the raw key appears in any span's name,
// attributes, events or status.
func assertNoRawKey(t *testing.T, spans []sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, s := range spans {
		texts := []string{s.Name(), s.Status().Description}
		for _, kv := range s.Attributes() {
			texts = append(texts, string(kv.Key), kv.Value.String())
		}
		for _, e := range s.Events() {
			texts = append(texts, e.Name)
			for _, kv := range e.Attributes {
				texts = append(texts, string(kv.Key), kv.Value.String())
			}
		}
		for _, text := range texts {
			if strings.Contains(text, rawKey) {
				t.Errorf("span %q carries the raw key in %q", s.Name(), text)
			}
		}
	}
}

func TestSpansOfACreatedRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmem.New(nil))
	parent := b.do(t)

	spans := b.rec.Ended()
	names := byName(spans)
	for _, n := range []string{"idem.request", "idem.reserve", "idem.handler", "idem.complete"} {
		if len(names[n]) != 1 {
			t.Fatalf("%d spans named %s, want 1; spans: %v", len(names[n]), n, keys(names))
		}
	}
	req := names["idem.request"][0]
	if req.Parent().SpanID() != parent.SpanID() || req.SpanContext().TraceID() != parent.TraceID() {
		t.Errorf("idem.request is not a child of the request context's span")
	}
	for _, n := range []string{"idem.reserve", "idem.handler", "idem.complete"} {
		s := names[n][0]
		if s.Parent().SpanID() != req.SpanContext().SpanID() {
			t.Errorf("%s is not a child of idem.request", n)
		}
		if s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("%s kind = %v, want internal", n, s.SpanKind())
		}
		if s.Status().Code == codes.Error {
			t.Errorf("%s status = %v, want unset", n, s.Status())
		}
	}
	if got, _ := attr(req, "idem.decision"); got != string(idem.DecisionCreated) {
		t.Errorf("idem.decision = %q, want created", got)
	}
	if got, _ := attr(req, "idem.endpoint"); got != "POST /v1/payments" {
		t.Errorf("idem.endpoint = %q, want POST /v1/payments", got)
	}
	want := idemstore.Identity{Endpoint: "POST /v1/payments", Key: rawKey}.LogHash()
	if got, _ := attr(req, "idem.key_hash"); got != want {
		t.Errorf("idem.key_hash = %q, want the record's log hash %q", got, want)
	}
	if got := req.InstrumentationScope().Name; got != idemotel.ScopeName {
		t.Errorf("instrumentation scope = %q, want %q", got, idemotel.ScopeName)
	}
	assertNoRawKey(t, spans)
}

func TestSpansOfAReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmem.New(nil))
	b.do(t)
	first := len(b.rec.Ended())
	b.do(t)

	spans := b.rec.Ended()[first:]
	names := byName(spans)
	if len(names["idem.request"]) != 1 || len(names["idem.reserve"]) != 1 {
		t.Fatalf("replay spans: %v, want idem.request and idem.reserve", keys(names))
	}
	if len(names["idem.handler"]) != 0 || len(names["idem.complete"]) != 0 {
		t.Errorf("a replay ran the handler or completed: %v", keys(names))
	}
	if got, _ := attr(names["idem.request"][0], "idem.decision"); got != string(idem.DecisionReplayed) {
		t.Errorf("idem.decision = %q, want replayed", got)
	}
	assertNoRawKey(t, b.rec.Ended())
}

// downStore is a store whose reserve fails as an unreachable store does.
type downStore struct {
	idemstore.Store
}

var errDown = errors.New("dial tcp 127.0.0.1:5432: connection refused")

func (downStore) KeyReserve(context.Context, *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	return nil, errDown
}

func TestStoreErrorMarksTheReserveSpan(t *testing.T) {
	t.Parallel()
	b := setup(t, downStore{idemmem.New(nil)})
	b.do(t)

	spans := b.rec.Ended()
	names := byName(spans)
	if len(names["idem.reserve"]) != 1 || len(names["idem.handler"]) != 0 {
		t.Fatalf("spans: %v, want idem.reserve and no idem.handler", keys(names))
	}
	reserve := names["idem.reserve"][0]
	if reserve.Status().Code != codes.Error || !strings.Contains(reserve.Status().Description, "connection refused") {
		t.Errorf("idem.reserve status = %+v, want an error", reserve.Status())
	}
	if len(reserve.Events()) != 1 || reserve.Events()[0].Name != "exception" {
		t.Errorf("idem.reserve events = %v, want the recorded error", reserve.Events())
	}
	if got, _ := attr(names["idem.request"][0], "idem.decision"); got != string(idem.DecisionStoreError) {
		t.Errorf("idem.decision = %q, want store_error", got)
	}
	assertNoRawKey(t, spans)
}

func TestNilProviderUsesTheGlobalOne(t *testing.T) {
	t.Parallel()
	// The global provider is a no-op by default: spans are not recording,
	// and the adapter must work with them.
	tr := idemotel.NewTracer(nil)
	ctx, s := tr.Start(context.Background(), "idem.request")
	s.SetAttribute("idem.decision", "created")
	s.End(errors.New("x"))
	if trace.SpanFromContext(ctx).IsRecording() {
		t.Fatal("the default global provider recorded a span")
	}
}

func keys(m map[string][]sdktrace.ReadOnlySpan) []string {
	var out []string
	for k, v := range m {
		for range v {
			out = append(out, k)
		}
	}
	return out
}

func TestSpansOfAPanic(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h := idem.New(idemmem.New(nil), &idem.Config{
		GuardConfig: idem.GuardConfig{Tracer: idemotel.NewTracer(tp), Logger: slog.New(slog.DiscardHandler)},
	})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom")
	}))
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", rawKey)
	func() {
		defer func() { _ = recover() }()
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	names := byName(rec.Ended())
	// The handler span of a panicking handler is not ended by the
	// middleware (yet); the request and the outcome's write are.
	if len(names["idem.request"]) != 1 || len(names["idem.complete"]) != 1 {
		t.Fatalf("spans after a panic: %v, want idem.request and idem.complete", keys(names))
	}
	if c := names["idem.complete"]; len(c) == 1 && c[0].Status().Code == codes.Error {
		t.Errorf("marking the outcome unknown failed: %v", c[0].Status())
	}
	assertNoRawKey(t, rec.Ended())
}
