package idemprom_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemprom"
	"github.com/idem-dev/idem/idemstore"
)

func TestDecisionsTenantLabelOff(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, nil)
	m.Decision("POST /v1/payments", "tenant-a", idem.DecisionCreated)
	m.Decision("POST /v1/payments", "tenant-b", idem.DecisionCreated)
	m.Decision("POST /v1/payments", "tenant-a", idem.DecisionReplayed)

	want := `
# HELP idem_decisions_total Protected requests by the idempotency middleware's decision (created, replayed, in_progress, key_reused, released_retried, unknown, store_error, not_replayable, invalid, too_many_keys, untrusted).
# TYPE idem_decisions_total counter
idem_decisions_total{decision="created",endpoint="POST /v1/payments",tenant=""} 2
idem_decisions_total{decision="replayed",endpoint="POST /v1/payments",tenant=""} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

func TestDecisionsTenantLabelOn(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, &idemprom.Config{TenantLabel: true})
	m.Decision("POST /v1/payments", "tenant-a", idem.DecisionCreated)
	m.Decision("POST /v1/payments", "tenant-b", idem.DecisionKeyReused)

	want := `
# HELP idem_decisions_total Protected requests by the idempotency middleware's decision (created, replayed, in_progress, key_reused, released_retried, unknown, store_error, not_replayable, invalid, too_many_keys, untrusted).
# TYPE idem_decisions_total counter
idem_decisions_total{decision="created",endpoint="POST /v1/payments",tenant="tenant-a"} 1
idem_decisions_total{decision="key_reused",endpoint="POST /v1/payments",tenant="tenant-b"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

// TestMessagesTerminated: the terminations a message consumer reports are
// counted by endpoint and outcome.
func TestMessagesTerminated(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, nil)
	m.MessageTerminated("nats ORDERS/billing", "max_deliveries")
	m.MessageTerminated("nats ORDERS/billing", "max_deliveries")
	m.MessageTerminated("nats ORDERS/billing", "key_reused")

	want := `
# HELP idem_messages_terminated_total Messages a consumer (idemnats) terminated, by outcome (key_reused, unknown, untrusted, missing_id, max_deliveries).
# TYPE idem_messages_terminated_total counter
idem_messages_terminated_total{endpoint="nats ORDERS/billing",outcome="key_reused"} 1
idem_messages_terminated_total{endpoint="nats ORDERS/billing",outcome="max_deliveries"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_messages_terminated_total"); err != nil {
		t.Fatal(err)
	}
}

func TestLabelCardinalityIsBounded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, &idemprom.Config{TenantLabel: true, MaxLabelValues: 3})
	for i := range 10 {
		m.Decision(fmt.Sprintf("POST /e%d", i), fmt.Sprintf("t%d", i), idem.DecisionCreated)
		m.ResponseStored(fmt.Sprintf("POST /e%d", i), 10)
	}
	// An admitted value stays itself after the limit is reached.
	m.Decision("POST /e1", "t1", idem.DecisionCreated)

	c := m.DecisionTotals()
	if c["created"] != 11 {
		t.Errorf("DecisionTotals()[created] = %v, want 11", c["created"])
	}
	// 3 admitted (endpoint, tenant) pairs + other/other.
	if n := testutil.CollectAndCount(reg, "idem_decisions_total"); n != 4 {
		t.Errorf("idem_decisions_total has %d series, want 4", n)
	}
	if n := testutil.CollectAndCount(reg, "idem_response_stored_bytes"); n != 4 {
		t.Errorf("idem_response_stored_bytes has %d series, want 4", n)
	}
	want := `
# HELP idem_decisions_total Protected requests by the idempotency middleware's decision (created, replayed, in_progress, key_reused, released_retried, unknown, store_error, not_replayable, invalid, too_many_keys, untrusted).
# TYPE idem_decisions_total counter
idem_decisions_total{decision="created",endpoint="POST /e0",tenant="t0"} 1
idem_decisions_total{decision="created",endpoint="POST /e1",tenant="t1"} 2
idem_decisions_total{decision="created",endpoint="POST /e2",tenant="t2"} 1
idem_decisions_total{decision="created",endpoint="other",tenant="other"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

func TestLabelValuesAreSanitised(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, &idemprom.Config{TenantLabel: true})
	// Invalid UTF-8 would make client_golang panic; an endless value is cut.
	m.Decision("POST /\xff", strings.Repeat("é", 500), idem.DecisionCreated)
	if n := testutil.CollectAndCount(reg, "idem_decisions_total"); n != 1 {
		t.Fatalf("idem_decisions_total has %d series, want 1", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range mfs[0].GetMetric()[0].GetLabel() {
		if len(l.GetValue()) > 200 {
			t.Errorf("label %s has %d bytes", l.GetName(), len(l.GetValue()))
		}
	}
}

func TestStoreCallResults(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, nil)
	m.StoreCall("reserve", 3*time.Millisecond, nil)
	m.StoreCall("reserve", 2*time.Millisecond, nil)
	m.StoreCall("complete", time.Millisecond, fmt.Errorf("completing: %w", idemstore.ErrLeaseLost))
	m.StoreCall("complete", time.Second, context.DeadlineExceeded)
	m.StoreCall("release", time.Millisecond, errors.New("connection refused"))

	for _, tt := range []struct {
		op, result string
		count      uint64
		sum        float64
	}{
		{"reserve", "ok", 2, 0.005},
		{"complete", "lease_lost", 1, 0.001},
		{"complete", "timeout", 1, 1},
		{"release", "error", 1, 0.001},
	} {
		h := histogram(t, reg, "idem_store_call_seconds", map[string]string{"op": tt.op, "result": tt.result})
		if h.GetSampleCount() != tt.count {
			t.Errorf("%s/%s count = %d, want %d", tt.op, tt.result, h.GetSampleCount(), tt.count)
		}
		if d := h.GetSampleSum() - tt.sum; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s/%s sum = %v, want %v", tt.op, tt.result, h.GetSampleSum(), tt.sum)
		}
	}
}

func TestResult(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{idemstore.ErrLeaseLost, "lease_lost"},
		{fmt.Errorf("x: %w", idemstore.ErrNotFound), "not_found"},
		{idemstore.ErrInvalidState, "invalid_state"},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), "timeout"},
		{context.Canceled, "canceled"},
		{errors.New("boom"), "error"},
	} {
		if got := idemprom.Result(tt.err); got != tt.want {
			t.Errorf("Result(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestResponseStoredBuckets(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, &idemprom.Config{SizeBuckets: []float64{100, 1000}})
	m.ResponseStored("POST /x", 50)
	m.ResponseStored("POST /x", 500)
	m.ResponseStored("POST /x", 5000)
	h := histogram(t, reg, "idem_response_stored_bytes", map[string]string{"endpoint": "POST /x"})
	b := h.GetBucket()
	if len(b) != 2 || b[0].GetCumulativeCount() != 1 || b[1].GetCumulativeCount() != 2 || h.GetSampleCount() != 3 {
		t.Fatalf("buckets = %v, count %d; want 1 ≤100, 2 ≤1000, 3 in all", b, h.GetSampleCount())
	}
}

func TestNewTwiceOnOneRegistryShares(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	a := idemprom.New(reg, nil)
	b := idemprom.New(reg, nil)
	a.Decision("POST /x", "", idem.DecisionCreated)
	b.Decision("POST /x", "", idem.DecisionCreated)
	c := series(t, reg, "idem_decisions_total", map[string]string{"endpoint": "POST /x", "tenant": "", "decision": "created"})
	if v := c.GetCounter().GetValue(); v != 2 {
		t.Fatalf("shared counter = %v, want 2", v)
	}
}

// TestThroughMiddleware checks the adapter against the real middleware: a
// created request then a replay are counted, with the reserve and complete
// latencies and the stored size.
func TestThroughMiddleware(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, nil)
	h := idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{Metrics: m}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"p_1"}`))
	}))
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", "k-1")
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			t.Fatalf("status %d, want 201", rec.Code)
		}
	}
	totals := m.DecisionTotals()
	if totals["created"] != 1 || totals["replayed"] != 1 {
		t.Fatalf("DecisionTotals = %v, want created 1, replayed 1", totals)
	}
	if n := histogram(t, reg, "idem_store_call_seconds", map[string]string{"op": "reserve", "result": "ok"}).GetSampleCount(); n != 2 {
		t.Errorf("reserve observations = %d, want 2", n)
	}
	if n := histogram(t, reg, "idem_store_call_seconds", map[string]string{"op": "complete", "result": "ok"}).GetSampleCount(); n != 1 {
		t.Errorf("complete observations = %d, want 1", n)
	}
	if n := testutil.CollectAndCount(reg, "idem_response_stored_bytes"); n != 1 {
		t.Errorf("idem_response_stored_bytes has %d series, want 1", n)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, &idemprom.Config{TenantLabel: true, MaxLabelValues: 5})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				m.Decision(fmt.Sprintf("POST /e%d", i%7), fmt.Sprintf("t%d", g), idem.DecisionCreated)
				m.StoreCall("reserve", time.Millisecond, nil)
			}
		})
	}
	wg.Wait()
	if got := m.DecisionTotals()["created"]; got != 1600 {
		t.Fatalf("created = %v, want 1600", got)
	}
	// At most 5 endpoints + other, times at most 5 tenants + other.
	if n := testutil.CollectAndCount(reg, "idem_decisions_total"); n > 36 {
		t.Fatalf("idem_decisions_total has %d series, want at most 36", n)
	}
}

// Counting is the same whether a series was found in the cache of
// resolved series or, past its bound, by the slow path: 1,500 endpoints
// (more than the cache keeps), each counted three times, with the label
// limiter admitting the first 1,200 and counting the rest as Other.
func TestDecisionsPastTheSeriesCache(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := idemprom.New(reg, &idemprom.Config{MaxLabelValues: 1200})
	for round := 0; round < 3; round++ {
		for i := 0; i < 1500; i++ {
			m.Decision(fmt.Sprintf("POST /v%d", i), "", idem.DecisionCreated)
			m.StoreCall(fmt.Sprintf("op%d", i%3), time.Millisecond, nil)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "idem_decisions_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "endpoint" {
					counts[l.GetValue()] = s.GetCounter().GetValue()
				}
			}
		}
	}
	if len(counts) != 1201 {
		t.Errorf("%d endpoint series, want 1,200 and Other", len(counts))
	}
	for i := 0; i < 1200; i++ {
		if c := counts[fmt.Sprintf("POST /v%d", i)]; c != 3 {
			t.Fatalf("POST /v%d counted %v times, want 3", i, c)
		}
	}
	if c := counts[idemprom.Other]; c != 3*300 {
		t.Errorf("Other counted %v times, want 900", c)
	}
	if got := m.DecisionTotals()["created"]; got != 4500 {
		t.Errorf("DecisionTotals created = %v, want 4500", got)
	}
}
