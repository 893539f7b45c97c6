package outbox

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestHTTPOutcomeStatus(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, _ := strconv.Atoi(r.URL.Query().Get("status"))
		if code := r.URL.Query().Get("code"); code != "" {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(status)
			w.Write([]byte(`{"type":"about:blank","status":` + strconv.Itoa(status) + `,"code":"` + code + `","detail":"secret body"}`))
			return
		}
		w.WriteHeader(status)
		w.Write([]byte("secret body"))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		status int
		code   string
		want   Outcome
	}{
		{200, "", OutcomeDelivered},
		{201, "", OutcomeDelivered},
		{204, "", OutcomeDelivered},
		{400, "invalid-charge", OutcomePermanent},
		{404, "", OutcomePermanent},
		{422, "key-reused", OutcomePermanent},
		{409, "key-in-use", OutcomeRetry},
		{409, "outcome-unknown", OutcomeUnknown},
		{409, "", OutcomeUnknown},
		{408, "", OutcomeRetry},
		{425, "", OutcomeRetry},
		{429, "too-many-keys", OutcomeRetry},
		{503, "provider-unavailable", OutcomeRetry},
		{500, "", OutcomeUnknown},
		{502, "", OutcomeUnknown},
		{504, "", OutcomeUnknown},
	} {
		url := srv.URL + "/?status=" + strconv.Itoa(tc.status) + "&code=" + tc.code
		got, err := HTTPOutcome(srv.Client().Post(url, "application/json", strings.NewReader("{}")))
		if got != tc.want {
			t.Errorf("%d %s: %v (%v), want %v", tc.status, tc.code, got, err, tc.want)
		}
		if (err == nil) != (tc.status < 300) {
			t.Errorf("%d %s: error %v", tc.status, tc.code, err)
		}
		if err != nil && (strings.Contains(err.Error(), "secret") || (tc.code != "" && !strings.Contains(err.Error(), tc.code))) {
			t.Errorf("%d %s: error %q: want the status and code, not the body", tc.status, tc.code, err)
		}
	}
}

func TestHTTPOutcomeErrors(t *testing.T) {
	t.Parallel()
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if got, err := HTTPOutcome(http.Post("http://"+addr+"/", "application/json", nil)); got != OutcomeRetry {
			t.Errorf("connection refused: %v (%v), want retry: nothing was sent", got, err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}))
		defer srv.Close()
		defer close(release)
		client := srv.Client()
		client.Timeout = 50 * time.Millisecond
		if got, err := HTTPOutcome(client.Post(srv.URL, "application/json", strings.NewReader("{}"))); got != OutcomeUnknown {
			t.Errorf("timeout: %v (%v), want unknown", got, err)
		}
	})
	t.Run("dropped", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}))
		defer srv.Close()
		got, err := HTTPOutcome(srv.Client().Post(srv.URL, "application/json", strings.NewReader("{}")))
		if got != OutcomeUnknown || err == nil {
			t.Errorf("dropped connection: %v (%v), want unknown", got, err)
		}
		var opErr *net.OpError
		if errors.As(err, &opErr) && opErr.Op == "dial" {
			t.Errorf("a dropped connection reads as a dial error: %v", err)
		}
	})
}
