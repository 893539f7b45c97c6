package idemmaint

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// TestHTTPReconcilerSendsAttempt: the lookup carries the fencing token of
// the attempt it asks about in Idempotency-Attempt (never one of
// HTTPConfig.Header), so an upstream that keeps the tokens of the attempts
// it ran can answer for that attempt, and refuse it later when it answered
// 404; an answer that carries the header back does not store it for replay,
// even when the allow-list names it.
func TestHTTPReconcilerSendsAttempt(t *testing.T) {
	t.Parallel()
	if headerAttempt != idem.HeaderAttempt {
		t.Fatalf("headerAttempt = %q, idem.HeaderAttempt = %q", headerAttempt, idem.HeaderAttempt)
	}
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Values(idem.HeaderAttempt)...)
		w.Header().Set(idem.HeaderAttempt, r.Header.Get(idem.HeaderAttempt))
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	tmpl, err := ParseURLTemplate(srv.URL + "/lookup/{key}")
	if err != nil {
		t.Fatal(err)
	}
	reconcile := HTTPReconciler(tmpl, &HTTPConfig{
		Header:        http.Header{idem.HeaderAttempt: {"configured"}},
		StoredHeaders: []string{"Content-Type", idem.HeaderAttempt},
		Timeout:       time.Second,
	})
	rec := &idemstore.Record{Identity: idemstore.Identity{Endpoint: "POST /v1/orders", Key: "k"}, State: idemstore.StateUnknown, Token: "attempt-token"}
	res, err := reconcile(t.Context(), rec)
	if err != nil || res.State != idemstore.StateCompleted || res.Response == nil {
		t.Fatalf("reconcile = %+v, %v", res, err)
	}
	if len(got) != 1 || got[0] != "attempt-token" {
		t.Fatalf("the lookup carried Idempotency-Attempt %q, want only the record's token", got)
	}
	if v, ok := res.Response.Header[idem.HeaderAttempt]; ok {
		t.Fatalf("the answer's Idempotency-Attempt %q is stored for replay", v)
	}
}
