package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAnswerEchoesTheRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, want string
	}{
		{"json", `{"amount_cents":500}`, `{"method":"POST","path":"/v1/orders","body":{"amount_cents":500}}` + "\n"},
		{"text", `amount=500`, `{"method":"POST","path":"/v1/orders","body":"amount=500"}` + "\n"},
		{"empty", ``, `{"method":"POST","path":"/v1/orders","body":null}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := httptest.NewRecorder()
			answer(rec, httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(tt.body)))
			if rec.Code != http.StatusCreated {
				t.Errorf("status %d, want 201", rec.Code)
			}
			if got := rec.Body.String(); got != tt.want {
				t.Errorf("body %s, want %s", got, tt.want)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}
